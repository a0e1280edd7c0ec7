"""A tree's own ``bench.job_cpu`` in a process of its own, for the benchmarks that compare
two trees (``bench.job_instructions``, ``bench.job_cpu_paired``).

Run as a script with the tree to measure on ``PYTHONPATH`` (:func:`command`): ``count``
switches callgrind's counting on only while a job runs; ``cue`` holds each job until a
go on stdin and tells its CPU time on stdout (the script's own printing goes to stderr).
Run so, it imports nothing of the tree this file is in but the standard library: the
``bench.job_cpu`` it runs is the measured tree's.

No library runs another process's jobs one at a time on cue, or counts a Python
process's instructions between two points: a line on a pipe says go, and
``callgrind_control`` switches counting on and off from outside.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COUNT = "count"
CUE = "cue"
# The ``cue`` process's lines: it is ready for a job; go; the job's CPU and kernel ms.
READY = "ready"
GO = "go"
CPU = "cpu "

_JobRunner = Callable[..., Any]


def add_tree_arguments(parser: argparse.ArgumentParser, baseline_help: str) -> None:
    """``--baseline DIR`` (a checkout of another commit) and ``--format``. Imported here,
    not at the top: the script itself imports nothing of this tree."""
    from worker.compaction import SessionFormat

    parser.add_argument("--baseline", type=Path, default=None, help=baseline_help)
    parser.add_argument("--format", default=SessionFormat.CHAT.value,
                        choices=[f.value for f in SessionFormat],
                        help="the sessions' wire format (bench.job_cpu --format)")


def command(mode: str, session_tokens: int, jobs: int, session_format: str) -> list[str]:
    """The command that runs ``jobs`` jobs (and the warm-up) of one size and format in
    ``mode``; the tree measured is the one its ``PYTHONPATH`` names (:func:`tree_env`)."""
    args = [sys.executable, str(Path(__file__).resolve()), mode,
            "--session-tokens", str(session_tokens), "--jobs", str(jobs)]
    if session_format != "chat":  # a tree from before the formats knows no --format
        args += ["--format", session_format]
    return args


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that measures ``tree``: its modules first, and one hash seed for
    every run (set and dict orders, and so some of the work, follow it)."""
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}


def _run_job_cpu(args: list[str], wrap: Callable[[_JobRunner], _JobRunner]) -> None:
    """Run the measured tree's ``bench.job_cpu`` with ``args``, each of its jobs through
    ``wrap(run_inline)``."""
    from bench import job_cpu  # the tree's own, not this file's

    # job_cpu's own name for it (imported by name from bench.common): the one its jobs call.
    namespace = vars(job_cpu)
    namespace["run_inline"] = wrap(namespace["run_inline"])
    sys.argv = ["bench.job_cpu", *args]
    job_cpu.main()


def _counted(run_inline: _JobRunner) -> _JobRunner:
    """``run_inline`` with callgrind counting only inside it."""
    pid = str(os.getpid())

    def counted(*args: Any, **kwargs: Any) -> Any:
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True,
                       capture_output=True)
        try:
            return run_inline(*args, **kwargs)
        finally:
            subprocess.run(["callgrind_control", "--instr=off", pid], check=True,
                           capture_output=True)

    return counted


def _on_cue(driver: Any) -> Callable[[_JobRunner], _JobRunner]:
    """``run_inline`` held until the driver says go, its CPU time told to ``driver``."""

    def wrap(run_inline: _JobRunner) -> _JobRunner:
        def on_cue(*args: Any, **kwargs: Any) -> Any:
            driver.write(f"{READY}\n")
            driver.flush()
            if sys.stdin.readline().strip() != GO:
                raise SystemExit("the driver went away")
            began, began_kernel = time.process_time(), _kernel_s()
            result = run_inline(*args, **kwargs)
            driver.write(f"{CPU}{(time.process_time() - began) * 1000:.4f} "
                         f"{(_kernel_s() - began_kernel) * 1000:.4f}\n")
            driver.flush()
            return result

        return on_cue

    return wrap


def _kernel_s() -> float:
    """This process's CPU time in the kernel so far (page faults, allocations' mappings)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == COUNT:
        _run_job_cpu(args, _counted)
    elif mode == CUE:
        driver = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            _run_job_cpu(args, _on_cue(driver))
    else:
        raise SystemExit(f"usage: tree_jobs.py {COUNT}|{CUE} BENCH_JOB_CPU_ARGS (got {mode!r})")


if __name__ == "__main__":
    main()
