"""Job CPU of this tree against another checkout's, job by job in lockstep: where a
machine's speed shifts within minutes (cores shared, clocks stepping), two runs of
``bench.job_cpu`` taken one after the other cannot tell 10% apart; two jobs taken a
moment apart meet the same machine.

Each tree runs its own ``bench.job_cpu`` (extractive, PostgreSQL, its own database) in a
process of its own, held before every job until told to go. The two take turns, one job
each, the first alternating from pair to pair; only one job runs at a time. Each job's
process CPU time is taken in its own process; the warm-up job is not compared. Printed:
each tree's min and median (and the median of the part spent in the kernel), and the
median, quartiles and extremes of the pairs' ratios (this tree / baseline).
``--baseline DIR``: a checkout of another commit (``git archive REV | tar -x -C DIR``);
without it, this tree against itself, which shows the method's own noise. Pinning both
to one core (``taskset -c 1 python -m bench.job_cpu_paired ...``) keeps a core's speed
out of the ratio.

The jobs' processes are ``bench/tree_jobs.py cue``.
"""

from __future__ import annotations

import subprocess

from bench.report import (
    REPO_ROOT,
    bench_parser,
    median,
    percentile,
    print_header,
    print_load,
    print_table,
)
from bench.tree_jobs import (
    CPU,
    CUE,
    GO,
    READY,
    add_tree_arguments,
    baseline_checkout,
    command,
    read_line,
    tree_process,
    write_line,
)

QUICK_TOKENS = 2_000
QUICK_JOBS = 2


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=30, help="compared jobs per tree")
    add_tree_arguments(parser, "a checkout of another commit (default: this tree)")
    args = parser.parse_args()
    tokens, jobs = (QUICK_TOKENS, QUICK_JOBS) if args.quick else (args.session_tokens,
                                                                  args.jobs)
    baseline = baseline_checkout(parser, args.baseline, "job_cpu")
    print_header(f"job CPU in lockstep against a baseline, extractive, {args.format} "
                 f"sessions, {tokens:,} tokens")
    print(f"this tree: {REPO_ROOT}\nbaseline: {baseline}", flush=True)
    jobs_command = command(CUE, tokens, jobs, args.format)
    with tree_process(REPO_ROOT, jobs_command) as this, \
            tree_process(baseline, jobs_command) as other:
        cpu_ms: dict[str, list[float]] = {"this tree": [], "baseline": []}
        system_ms: dict[str, list[float]] = {"this tree": [], "baseline": []}
        for pair in range(jobs + 1):  # the first pair is the warm-up
            turns = [("this tree", this), ("baseline", other)]
            for name, process in turns if pair % 2 else reversed(turns):
                cpu, system = _one_job(process)
                if pair:
                    cpu_ms[name].append(cpu)
                    system_ms[name].append(system)
            if pair and pair % 10 == 0:
                print(f"{pair} of {jobs} pairs", flush=True)
    _report(cpu_ms, system_ms)


def _report(cpu_ms: dict[str, list[float]], system_ms: dict[str, list[float]]) -> None:
    ratios = sorted(a / b for a, b in zip(cpu_ms["this tree"], cpu_ms["baseline"],
                                          strict=True))
    print_table(["tree", "jobs", "CPU ms min", "CPU ms median", "of it kernel ms median"],
                [[name, len(times), f"{min(times):.1f}", f"{median(times):.1f}",
                  f"{median(system_ms[name]):.2f}"] for name, times in cpu_ms.items()])
    print()
    print_table(["pairs", "ratio median", "ratio q1", "ratio q3", "ratio min", "ratio max",
                 "ratio of mins", "ratio of medians"],
                [[len(ratios), f"{median(ratios):.3f}", f"{percentile(ratios, 0.25):.3f}",
                  f"{percentile(ratios, 0.75):.3f}", f"{ratios[0]:.3f}", f"{ratios[-1]:.3f}",
                  f"{min(cpu_ms['this tree']) / min(cpu_ms['baseline']):.3f}",
                  f"{median(cpu_ms['this tree']) / median(cpu_ms['baseline']):.3f}"]])
    print_load()


def _one_job(process: subprocess.Popen[str]) -> tuple[float, float]:
    """Let ``process`` run its next job; return the job's CPU time and the part of it in
    the kernel (ms)."""
    read_line(process, READY)
    write_line(process, GO)
    cpu_ms, system_ms = read_line(process, CPU).split()
    return float(cpu_ms), float(system_ms)


if __name__ == "__main__":
    main()
