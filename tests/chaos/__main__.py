"""``python -m tests.chaos``: the full chaos run; prints its counts, exits 1 on any
violation or when fewer kills than asked for landed."""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

from tests.chaos.config import ChaosConfig
from tests.chaos.run import run_chaos


def parse_config(argv: list[str] | None) -> ChaosConfig:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--sessions", type=int, default=300, help="generated sessions")
    parser.add_argument("--corpus-sessions", type=int, default=0,
                        help="sessions of the corpus's dev_long split to add (it has 16)")
    parser.add_argument("--kills", type=int, default=25, help="least SIGKILLs to deliver")
    parser.add_argument("--duration-s", type=float, default=240.0, help="chaos phase (s)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2, help="pool children per worker")
    parser.add_argument("--redis-restarts", type=int, default=2)
    parser.add_argument("--pg-drops", type=int, default=4)
    parser.add_argument("--pg-restarts", type=int, default=1)
    parser.add_argument("--pg-hangs", type=int, default=1)
    parser.add_argument("--pg-hang-s", type=float, default=20.0, help="each hang (s)")
    parser.add_argument("--poison-rounds", type=int, default=2)
    parser.add_argument("--llm-latency-ms", type=int, default=400)
    parser.add_argument("--drain-timeout-s", type=float, default=240.0)
    parser.add_argument("--idle-sessions", type=int, default=1_500,
                        help="idle sessions the beat's gc may erase while they are appended to")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keeps the worker logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    return ChaosConfig(
        work_dir=work_dir, sessions=args.sessions, corpus_sessions=args.corpus_sessions,
        kills=args.kills,
        duration_s=args.duration_s, workers=args.workers, concurrency=args.concurrency,
        redis_restarts=args.redis_restarts, pg_drops=args.pg_drops,
        pg_restarts=args.pg_restarts, pg_hangs=args.pg_hangs, pg_hang_s=args.pg_hang_s,
        poison_rounds=args.poison_rounds,
        llm_latency_ms=args.llm_latency_ms, drain_timeout_s=args.drain_timeout_s,
        idle_sessions=args.idle_sessions,
        seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    print(f"chaos run: {' '.join(sys.argv)}", flush=True)
    print(f"machine: {platform.node()}, {platform.machine()}, python {platform.python_version()}, "
          f"worker logs in {config.work_dir}", flush=True)
    report = run_chaos(config)
    print("\n".join(report.lines()))
    print("RESULT:", "PASS" if report.ok else "FAIL")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
