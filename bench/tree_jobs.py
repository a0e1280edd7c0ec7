"""A tree's own benchmark in a process of its own, for the benchmarks that compare two
trees (``bench.job_instructions``, ``bench.job_cpu_paired``, ``bench.job_overhead_paired``).

Run as a script with the tree to measure on ``PYTHONPATH`` (:func:`command`): ``count``
switches callgrind's counting on only while a ``bench.job_cpu`` job runs; ``cue`` holds
each such job until a go on stdin and tells its CPU time on stdout; ``blocks`` sets up
``bench.job_overhead``'s worker, database and broker, then on each ``noop`` or ``job``
line (with a size) runs a block of that many tasks on the worker and tells its wall
time per task. The script's own printing goes to stderr. Run so, it imports nothing of the tree this
file is in but the standard library: the benchmark it runs is the measured tree's.

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
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

COUNT = "count"
CUE = "cue"
BLOCKS = "blocks"
# The ``cue`` process's lines: it is ready for a job; go; the job's CPU and kernel ms.
READY = "ready"
GO = "go"
CPU = "cpu "
# The ``blocks`` process's: a block of no-op tasks, or of compaction jobs; its ms per task.
NOOP_BLOCK = "noop"
JOB_BLOCK = "job"
BLOCK_MS = "ms "
# How long a tree's process has to stop its worker and drop its database once told to end.
_END_TIMEOUT_S = 60

_JobRunner = Callable[..., Any]


def add_tree_arguments(parser: argparse.ArgumentParser, baseline_help: str) -> None:
    """``--baseline DIR`` (a checkout of another commit) and ``--format``. Imported here,
    not at the top: the script itself imports nothing of this tree."""
    from worker.compaction import SessionFormat

    parser.add_argument("--baseline", type=Path, default=None, help=baseline_help)
    parser.add_argument("--format", default=SessionFormat.CHAT.value,
                        choices=[f.value for f in SessionFormat],
                        help="the sessions' wire format (bench.job_cpu --format)")


def baseline_checkout(parser: argparse.ArgumentParser, baseline: Path | None,
                      benchmark: str) -> Path:
    """``--baseline``'s checkout, resolved (default: this tree); it must hold
    ``bench/<benchmark>.py``, the script the comparison runs in it."""
    tree = (baseline or Path(__file__).resolve().parents[1]).resolve()
    if not (tree / "bench" / f"{benchmark}.py").is_file():
        parser.error(f"{tree} holds no bench/{benchmark}.py: not a checkout of this project")
    return tree


def command(mode: str, session_tokens: int, jobs: int, session_format: str) -> list[str]:
    """The command that runs ``jobs`` jobs (and the warm-up) of one size and format in
    ``mode``; the tree measured is the one its ``PYTHONPATH`` names (:func:`tree_env`)."""
    args = [sys.executable, str(Path(__file__).resolve()), mode,
            "--session-tokens", str(session_tokens), "--jobs", str(jobs)]
    if session_format != "chat":  # a tree from before the formats knows no --format
        args += ["--format", session_format]
    return args


def blocks_command(session_tokens: int, job_blocks: int, per_block: int,
                   summarizer: str) -> list[str]:
    """The command that runs ``bench.job_overhead``'s worker (``summarizer``: extractive or
    llm) for up to ``job_blocks`` blocks of ``per_block`` compaction jobs, and blocks of
    no-ops, each on cue."""
    return [sys.executable, str(Path(__file__).resolve()), BLOCKS,
            "--session-tokens", str(session_tokens), "--job-blocks", str(job_blocks),
            "--per-block", str(per_block), "--summarizer", summarizer]


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


def _run_blocks(args: list[str], driver: IO[str]) -> None:
    """Set up the measured tree's ``bench.job_overhead`` worker with its sessions, then run
    a block for each line on stdin (``noop N`` or ``job N``) and tell ``driver`` its wall
    time per task."""
    from bench import job_overhead  # the tree's own, not this file's

    # By the names job_overhead has them under (its own no-op publisher among them): what
    # it imports moved between modules over time.
    overhead = SimpleNamespace(**vars(job_overhead))

    parser = argparse.ArgumentParser()
    for flag in ("--session-tokens", "--job-blocks", "--per-block"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--summarizer", choices=("extractive", "llm"), required=True)
    options = parser.parse_args(args)
    session = overhead.generated_session(options.session_tokens, overhead.new_counter())
    with (tempfile.TemporaryDirectory() as log_dir, overhead.openai_server() as server,
          overhead.private_database() as url, overhead.private_broker(url) as broker):
        engine = overhead.create_db_engine(url)
        is_llm = options.summarizer == "llm"
        variant = next(v for v in overhead.job_variants(
            broker, url, session, options.job_blocks * options.per_block, server.base_url,
            overhead.Store(engine), extractive=not is_llm) if v.is_llm == is_llm)
        sessions = iter(variant.session_ids)
        with overhead.BenchWorker(variant.env, Path(log_dir) / "worker.log",
                                  app=overhead.WORKER_APP) as worker:
            driver.write(f"{READY}\n")
            driver.flush()
            ended = {overhead.NOOP_EVENT: 0, overhead.JOB_EVENT: 0}
            for line in sys.stdin:
                kind, size = line.split()
                # The block runs from the end of a no-op queued just before it.
                marker = overhead._publish_noops(broker, 1)
                if kind == NOOP_BLOCK:
                    tasks, name = overhead._publish_noops(broker, int(size)), overhead.NOOP_EVENT
                else:
                    tasks = broker.publish_jobs([next(sessions) for _ in range(int(size))])
                    name = overhead.JOB_EVENT
                ended[overhead.NOOP_EVENT] += len(marker)
                ended[name] += len(tasks)
                timeout_s = 60 + 30 * (len(tasks) + 1)
                start = _block_ends(worker.wait_for(overhead.NOOP_EVENT,
                                                    ended[overhead.NOOP_EVENT], timeout_s), marker)
                ends = _block_ends(worker.wait_for(name, ended[name], timeout_s), tasks)
                driver.write(f"{BLOCK_MS}{(max(ends) - start[0]) * 1000 / len(tasks):.4f}\n")
                driver.flush()
        engine.dispose()


def _block_ends(events: list[dict[str, Any]], task_ids: list[str]) -> list[float]:
    """When each of ``task_ids`` ended, by its event's own timestamp; only compacted jobs
    measure a job (a skipped one reads one row)."""
    from bench.common import event_time_s

    wanted = set(task_ids)
    ours = [e for e in events if e.get("task_id") in wanted]
    outcomes = {str(e["outcome"]) for e in ours if "outcome" in e}
    if outcomes - {"compacted"}:
        raise SystemExit(f"measured jobs ended {', '.join(sorted(outcomes))}")
    return [event_time_s(e) for e in ours]


@contextlib.contextmanager
def tree_process(tree: Path, tree_command: list[str]) -> Iterator[subprocess.Popen[str]]:
    """``tree_command`` run on ``tree``'s modules, talking on its pipes; what it printed to
    stderr is shown when it ends early (:class:`TreeProcessEnded`)."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as stderr:
        process = subprocess.Popen(
            tree_command, cwd=tree, env=tree_env(tree), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        try:
            yield process
        except TreeProcessEnded:
            stderr.seek(0)
            raise SystemExit(f"{Path(tree_command[1]).name} in {tree} ended early:\n"
                             f"{stderr.read()[-4000:]}") from None
        finally:
            _ended(process)


def _ended(process: subprocess.Popen[str]) -> None:
    """End a tree's process: its stdin closed, it stops what it started (a worker, a
    server, a database) and exits; killed only when it has not in time."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout=_END_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class TreeProcessEnded(Exception):
    """A tree's process closed its pipe before its answer."""


def read_line(process: subprocess.Popen[str], expected_start: str) -> str:
    """The process's next line, less ``expected_start``, which it must begin with."""
    if process.stdout is None:
        raise TreeProcessEnded
    line = process.stdout.readline()
    if not line.startswith(expected_start):
        raise TreeProcessEnded
    return line[len(expected_start):].strip()


def write_line(process: subprocess.Popen[str], line: str) -> None:
    if process.stdin is None:
        raise TreeProcessEnded
    process.stdin.write(f"{line}\n")
    process.stdin.flush()


def _kernel_s() -> float:
    """This process's CPU time in the kernel so far (page faults, allocations' mappings)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == COUNT:
        _run_job_cpu(args, _counted)
    elif mode in (CUE, BLOCKS):
        driver = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            if mode == CUE:
                _run_job_cpu(args, _on_cue(driver))
            else:
                _run_blocks(args, driver)
    else:
        raise SystemExit(f"usage: tree_jobs.py {COUNT}|{CUE}|{BLOCKS} ARGS (got {mode!r})")


if __name__ == "__main__":
    main()
