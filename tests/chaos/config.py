"""The knobs of one chaos run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ChaosConfig:
    """One run (``kills``: the least number of SIGKILLs to deliver; ``corpus_sessions``:
    how many sessions of the corpus's ``dev_long`` split join the generated ones)."""

    work_dir: Path
    sessions: int = 300
    corpus_sessions: int = 0
    kills: int = 25
    duration_s: float = 240.0
    workers: int = 3
    concurrency: int = 2
    appenders: int = 2
    idle_sessions: int = 1_500  # one-message sessions the beat's gc may erase
    idle_appenders: int = 2  # appending to them beside the gc (tests/chaos/retention.py)
    append_pause_s: float = 0.15
    redis_restarts: int = 2
    pg_drops: int = 4
    pg_restarts: int = 1
    pg_hangs: int = 1
    pg_hang_s: float = 20.0  # past the workers' 8 s database call deadline
    poison_rounds: int = 2
    scan_cron: str = "* * * * *"  # the real beat's scan, every minute
    reconcile_interval_s: int = 10  # the beat's reconciler sweep
    reconcile_grace_s: int = 10  # a younger marker is never taken for a lost job
    llm_latency_ms: int = 400
    failing_share: float = 0.05
    drain_timeout_s: float = 240.0
    seed: int = 1
