"""How the benchmarks report: the machine and command a figure was taken with, the
load average beside it, aligned Markdown tables, and the quantiles they print."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def bench_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the ``--quick`` flag every benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: checks the script runs, the figures mean little")
    return parser


def describe_machine() -> dict[str, str]:
    """The figures' context: cores, CPU model, memory, Python."""
    model = "unknown"
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"nproc": str(os.cpu_count()), "cpu": model,
            "ram_gib": f"{os_total_memory_bytes() / 2**30:.1f}",
            "python": platform.python_version()}


def os_total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def print_header(title: str) -> None:
    """Print the benchmark's title, the machine and the exact command."""
    machine = describe_machine()
    print(f"== {title}")
    print(f"machine: nproc={machine['nproc']} cpu={machine['cpu']!r} "
          f"ram={machine['ram_gib']} GiB python={machine['python']}")
    print(f"command: python -m {shlex.join([_module_name(), *sys.argv[1:]])}")
    print_load()


def print_load() -> None:
    """Print the load average: other work on the machine skews every figure."""
    one, five, fifteen = os.getloadavg()
    print(f"load average: {one:.2f} {five:.2f} {fifteen:.2f}", flush=True)


def _module_name() -> str:
    path = Path(sys.argv[0]).resolve()
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Print rows as an aligned Markdown table (pasteable into docs/BENCHMARKS.md)."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for index, row in enumerate(cells):
        print("| " + " | ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + " |")
        if index == 0:
            print("|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    sys.stdout.flush()


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile (0..1) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0
