"""The chaos suite: real workers compact while sessions grow and workers, Redis and
PostgreSQL connections are killed under them; then every session is checked. Run it
with ``python -m tests.chaos`` (see docs/CHAOS.md); ``test_chaos.py`` is its short form."""
