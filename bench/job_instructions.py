"""Instructions executed per compaction job, counted by valgrind's callgrind: where a
machine's speed shifts between runs (cores shared, clocks stepping), CPU times of two
trees taken minutes apart cannot tell 10% apart, and a count of instructions can.

Each size runs ``bench.job_cpu`` (extractive, PostgreSQL) in its own process under
callgrind, with instrumentation switched on only while a job runs (``callgrind_control``
around ``run_inline``): the session's generation and import are not counted, and neither
is the database server (another process). ``--baseline DIR`` does the same in a checkout
of another commit (``git archive REV | tar -x -C DIR``; its ``bench.job_cpu`` is the one
run) and prints each size's ratio. Instructions are not time (a cache miss costs more
than an add), so this ratio stands beside ``bench.job_cpu``'s, not for it.

The jobs' process is ``bench/tree_jobs.py count``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.report import REPO_ROOT, bench_parser, print_header, print_load, print_table
from bench.tree_jobs import COUNT, add_tree_arguments, command, tree_env

QUICK_SIZES = (2_000,)
DEFAULT_SIZES = (5_000, 100_000)
_COLLECTED = re.compile(r"Collected : (\d+)")


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", default=None,
                        help="comma-separated sizes (default 5000,100000)")
    parser.add_argument("--jobs", type=int, default=3, help="counted jobs per size")
    add_tree_arguments(parser, "a checkout of another commit to count the same jobs in")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    sizes = (QUICK_SIZES if args.quick else DEFAULT_SIZES) if args.session_tokens is None \
        else tuple(int(size) for size in args.session_tokens.split(","))
    jobs = 1 if args.quick else args.jobs
    print_header(f"instructions per compaction job (callgrind), extractive, {args.format} "
                 "sessions, in-process")
    trees = {"this tree": REPO_ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    rows: list[list[Any]] = []
    for size in sizes:
        counts = {}
        for name, tree in trees.items():
            print(f"{name} ({tree}), {size:,} tokens: {jobs} jobs and a warm-up under "
                  "callgrind ...", flush=True)
            counts[name] = _count(tree, size, jobs, args.format) / (jobs + 1)
        ratio = counts["this tree"] / counts["baseline"] if "baseline" in counts else None
        rows.append([f"{size:,}", f"{counts['this tree'] / 1e6:,.1f}",
                     f"{counts['baseline'] / 1e6:,.1f}" if "baseline" in counts else "-",
                     f"{ratio:.3f}" if ratio is not None else "-"])
    print_table(["session tokens", "M instructions per job", "baseline M per job",
                 "this / baseline"], rows)
    print_load()


def _count(tree: Path, size: int, jobs: int, session_format: str) -> int:
    """Instructions of ``jobs`` jobs and the warm-up one in ``tree``'s ``bench.job_cpu``."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                           "--callgrind-out-file=/dev/null",
                           *command(COUNT, size, jobs, session_format)],
                          cwd=tree, env=tree_env(tree), capture_output=True, text=True,
                          check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"bench.job_cpu under callgrind in {tree} exited "
                         f"{done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return int(found.group(1))


if __name__ == "__main__":
    main()
