"""``bench.job_overhead`` of this tree against another checkout's, block by block in
lockstep: where a machine's speed shifts within minutes, two runs of ``bench.job_overhead``
taken one after the other cannot tell 10% apart (the no-op itself moves by half); two
blocks taken a moment apart meet the same machine.

Each tree sets up its own ``bench.job_overhead`` worker (prefork, concurrency 1), database,
broker and sessions in a process of its own (``bench/tree_jobs.py blocks``), then waits.
Round after round, each tree in turn (the first alternating) runs a block of no-op tasks
(``--noop-block``), then a block of compaction jobs (``--per-block``); only one tree's
worker works at a time. A block is timed by its tasks' own events: from the end of a
no-op queued just before it to the end of its last task, over its size. Per summarizer
(extractive; the OpenAI test server at latency 0), printed: each tree's median no-op and
per-job ms and median "x no-op" (a round's job block over its no-op block, as
``bench.job_overhead`` prints), then the median and
quartiles of the rounds' ratios, this tree over the baseline, of per-job wall and of
"x no-op". One untimed round of each tree goes first. ``--baseline DIR``: a checkout of
another commit (``git archive REV | tar -x -C DIR``); without it, this tree against
itself, which shows the method's own noise.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

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
    BLOCK_MS,
    JOB_BLOCK,
    NOOP_BLOCK,
    READY,
    baseline_checkout,
    blocks_command,
    read_line,
    tree_process,
    write_line,
)

TREES = ("this tree", "baseline")
QUICK_TOKENS = 2_000


@dataclass
class TreeBlocks:
    """One tree's timed blocks: per round, ms per no-op and per job."""

    noop_ms: list[float] = field(default_factory=list)
    job_ms: list[float] = field(default_factory=list)

    @property
    def times_noop(self) -> list[float]:
        return [job / noop for job, noop in zip(self.job_ms, self.noop_ms, strict=True)]


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--session-tokens", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per summarizer")
    parser.add_argument("--per-block", type=int, default=20, help="jobs per block")
    parser.add_argument("--noop-block", type=int, default=100,
                        help="no-ops per block: a no-op is a few ms, a short block is noise")
    parser.add_argument("--summarizer", choices=("extractive", "llm", "both"), default="both")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of another commit (default: this tree)")
    args = parser.parse_args()
    if args.quick:
        args.session_tokens, args.rounds, args.per_block, args.noop_block = QUICK_TOKENS, 2, 2, 4
        args.summarizer = "extractive"
    baseline = baseline_checkout(parser, args.baseline, "job_overhead")
    print_header(f"job overhead in lockstep against a baseline, {args.session_tokens:,}-token "
                 f"sessions, blocks of {args.per_block} jobs and {args.noop_block} no-ops")
    print(f"this tree: {REPO_ROOT}\nbaseline: {baseline}", flush=True)
    summarizers = ("extractive", "llm") if args.summarizer == "both" else (args.summarizer,)
    for summarizer in summarizers:
        command = blocks_command(args.session_tokens, args.rounds + 1, args.per_block,
                                 summarizer)
        with tree_process(REPO_ROOT, command) as this, tree_process(baseline, command) as other:
            for process in (this, other):
                read_line(process, READY)
            blocks = _run_rounds({"this tree": this, "baseline": other}, args.rounds,
                                 {NOOP_BLOCK: args.noop_block, JOB_BLOCK: args.per_block})
        _report(summarizer, blocks)
    print_load()


def _run_rounds(processes: dict[str, subprocess.Popen[str]], rounds: int,
                sizes: dict[str, int]) -> dict[str, TreeBlocks]:
    """The untimed round, then ``rounds`` timed ones, the trees taking turns."""
    blocks = {name: TreeBlocks() for name in processes}
    for round_number in range(rounds + 1):  # the first round is the warm-up
        order = TREES if round_number % 2 else TREES[::-1]
        for name in order:
            noop_ms = _block_ms(processes[name], NOOP_BLOCK, sizes[NOOP_BLOCK])
            job_ms = _block_ms(processes[name], JOB_BLOCK, sizes[JOB_BLOCK])
            if round_number:
                blocks[name].noop_ms.append(noop_ms)
                blocks[name].job_ms.append(job_ms)
        if round_number and round_number % 10 == 0:
            print(f"{round_number} of {rounds} rounds", flush=True)
    return blocks


def _block_ms(process: subprocess.Popen[str], kind: str, size: int) -> float:
    write_line(process, f"{kind} {size}")
    return float(read_line(process, BLOCK_MS))


def _report(summarizer: str, blocks: dict[str, TreeBlocks]) -> None:
    print(f"\n{summarizer} summarizer:")
    print_table(["tree", "rounds", "no-op ms median", "per-job wall ms median",
                 "x no-op median"],
                [[name, len(tree.job_ms), f"{median(tree.noop_ms):.3f}",
                  f"{median(tree.job_ms):.2f}", f"{median(tree.times_noop):.3f}"]
                 for name, tree in blocks.items()])
    this, other = blocks["this tree"], blocks["baseline"]
    rows = []
    for measure, ours, theirs in (("per-job wall", this.job_ms, other.job_ms),
                                  ("x no-op", this.times_noop, other.times_noop)):
        ratios = sorted(a / b for a, b in zip(ours, theirs, strict=True))
        rows.append([measure, len(ratios), f"{median(ratios):.3f}",
                     f"{percentile(ratios, 0.25):.3f}", f"{percentile(ratios, 0.75):.3f}",
                     f"{ratios[0]:.3f}", f"{ratios[-1]:.3f}"])
    print()
    print_table(["this tree / baseline", "rounds", "ratio median", "ratio q1", "ratio q3",
                 "ratio min", "ratio max"], rows)


if __name__ == "__main__":
    main()
