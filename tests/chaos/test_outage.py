"""The outage measurement's smoke run (``python -m tests.chaos.outage``; the 10-minute
runs are in docs/CHAOS.md): PostgreSQL down 30 s under running jobs, and afterwards every
due session compacted within one reconciler period of the backlog's own work, nothing
stranded, one run and one event per attempt, no breaker open. (Redis's smoke run waits
out the reconciler's 60 s grace and takes longer than this suite allows.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.outage import OutageConfig, run_outage

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.integration]


def test_a_half_minute_postgresql_outage_strands_no_session(tmp_path: Path) -> None:
    report = run_outage(OutageConfig(service="postgres", minutes=0.5, reconcile_interval_s=10,
                                     sessions=6, llm_latency_ms=8_000, work_dir=tmp_path))

    assert report.ok, "\n".join(report.lines())
    assert report.failed_during["store_unavailable"] > 0  # the outage did hit running jobs
