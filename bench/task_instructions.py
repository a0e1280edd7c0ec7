"""The service's no-op task against a bare Celery no-op in instructions, counted by
valgrind's callgrind: ``bench.task_overhead``'s wall-time ratio moves by a few hundredths
between runs on a shared machine, a count of instructions far less, and it splits the
cost between the worker's main process (consumer, transport) and its pool child (the
task, its hooks and its log line), which a wall clock cannot.

Each worker (the two ``bench.task_overhead`` starts) runs whole under callgrind twice:
with ``--few`` no-ops queued before it starts, then with ``--many``. Each run ends with a
warm shutdown once every no-op has logged its event, and each process reports its own
count (the pool child is forked, not executed, so it stays under valgrind). The
difference of the two runs over ``many - few`` no-ops is one no-op's instructions with
start-up and shut-down taken out. ``--keep DIR`` keeps the callgrind output files
(``callgrind_annotate`` reads them) to see where the instructions go.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchWorker, private_broker, private_database, settings_env
from bench.job_overhead import NOOP_EVENT, NOOP_TASK
from bench.report import bench_parser, print_header, print_load, print_table
from bench.task_overhead import NoopWorker, noop_workers

VALGRIND_START_S = 900.0
STOP_TIMEOUT_S = 600.0
_COLLECTED = re.compile(r"Collected : (\d+)")


class CountedWorker(BenchWorker):
    """``inner``'s command under callgrind, logging to ``out_dir``: the worker's own log,
    and each process's count in ``valgrind.<pid>.log``."""

    def __init__(self, inner: BenchWorker, out_dir: Path) -> None:
        super().__init__(inner.env, out_dir / "worker.log", app=inner.app)
        self.inner = inner
        self.out_dir = out_dir

    def argv(self) -> list[str]:
        return ["valgrind", "--tool=callgrind", "--dump-before=fork",
                f"--log-file={self.out_dir}/valgrind.%p.log",
                f"--callgrind-out-file={self.out_dir}/callgrind.out.%p",
                *self.inner.argv()]

    def stop_warm(self) -> None:
        """SIGTERM to the main process alone: Celery's warm shutdown ends the pool child
        itself, so every process exits normally and reports its count."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def counts(self) -> tuple[int, int]:
        """Instructions of the main process (its whole life) and of its children (each
        from its fork on: the main process dumps and zeroes its counters before each fork,
        so a child's own output files hold only its own instructions)."""
        assert self.process is not None
        main, children = None, 0
        for log in self.out_dir.glob("valgrind.*.log"):
            pid = log.name.split(".")[1]
            if pid == str(self.process.pid):
                found = _COLLECTED.search(log.read_text(errors="replace"))
                if found is None:
                    raise RuntimeError(f"{log} has no instruction count:\n"
                                       f"{log.read_text(errors='replace')[-3000:]}")
                main = int(found.group(1))
            else:
                children += sum(_totals(out) for out in self.out_dir.glob(
                    f"callgrind.out.{pid}*") if re.fullmatch(rf"callgrind\.out\.{pid}(\.\d+)?",
                                                             out.name))
        if main is None or not children:
            raise RuntimeError(f"no count of the main process or of a child in {self.out_dir}")
        return main, children


def _totals(out_file: Path) -> int:
    """The event total of one callgrind output file (one dump)."""
    for line in out_file.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"{out_file} has no totals line")


@dataclass(frozen=True)
class Count:
    """Instructions of one counted run."""

    main: int
    child: int


def count_run(noop: NoopWorker, tasks: int, out_dir: Path) -> Count:
    """Queue ``tasks`` no-ops, run ``noop``'s worker under callgrind until all are done."""
    out_dir.mkdir(parents=True)
    for _ in range(tasks):
        noop.app.send_task(NOOP_TASK, task_id=f"noop-{uuid.uuid4().hex}", queue=noop.queue)
    worker = CountedWorker(noop.worker, out_dir)
    try:
        worker.start(timeout_s=VALGRIND_START_S)
        worker.wait_for(NOOP_EVENT, tasks, timeout_s=VALGRIND_START_S + tasks)
        worker.stop_warm()
    finally:
        worker.stop()
    main, child = worker.counts()
    return Count(main, child)


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--few", type=int, default=40, help="no-ops of the shorter run")
    parser.add_argument("--many", type=int, default=240, help="no-ops of the longer run")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a directory to keep the callgrind output files in")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.quick:
        args.few, args.many = 0, 10
    if not 0 <= args.few < args.many:
        parser.error("--many must be larger than --few")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: the directory is not empty")
    print_header("the service's no-op task against a bare Celery no-op, in instructions "
                 "(callgrind)")
    with (tempfile.TemporaryDirectory() as scratch, private_database() as url,
          private_broker(url) as broker):
        out_root = args.keep.resolve() if args.keep else Path(scratch)
        env = {**broker.env, **settings_env(database_url=url, summarizer="extractive")}
        rows = []
        per_task: dict[str, float] = {}
        for noop in noop_workers(broker, env, Path(scratch)):
            runs = {}
            for tasks in (args.few, args.many):
                print(f"{noop.name}: {tasks} no-ops under callgrind ...", flush=True)
                runs[tasks] = count_run(noop, tasks, out_root / f"{noop.name}-{tasks}")
            spread = args.many - args.few
            main_m = (runs[args.many].main - runs[args.few].main) / spread / 1e6
            child_m = (runs[args.many].child - runs[args.few].child) / spread / 1e6
            per_task[noop.name] = main_m + child_m
            rows.append((noop.label, f"{main_m:.3f}", f"{child_m:.3f}",
                         f"{main_m + child_m:.3f}"))
        print(f"\nM instructions per no-op, the runs of {args.many} and {args.few} "
              "no-ops subtracted:")
        print_table(("worker", "main process", "pool child", "total"), rows)
        print()  # a table starts after a blank line (the smoke test reads them apart)
        print_table(("service / bare", "ratio"),
                    [("instructions per no-op", f"{per_task['service'] / per_task['bare']:.3f}")])
        if args.keep:
            print(f"\ncallgrind output kept in {out_root} (callgrind_annotate FILE)")
    print_load()


if __name__ == "__main__":
    main()
