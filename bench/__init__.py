"""The benchmarks (``python -m bench.NAME``): scripts that print figures, not timed tests;
docs/BENCHMARKS.md has the figures, their commands and the machine."""
