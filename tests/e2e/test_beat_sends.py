"""Beat's sends, as an operator reads them: a real `compactor beat` on a schedule that
fires within its first minute or so (the scan every minute, the reconciler every few
seconds), and the RUNBOOK's "when beat sent the scan" jq line, run as written on its log,
prints each send; every message it names is in the queue in Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduler.beat import LEASE_SWEEP_ENTRY_NAME, RECONCILE_ENTRY_NAME, SCAN_ENTRY_NAME
from tests.e2e.test_logs_jq import documented_recipes, run_jq
from tests.support.cli import REPO_ROOT
from tests.support.e2e import build_job_env, redis_under_prefix
from tests.support.worker_process import parse_log_lines

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

RECIPE_TITLE = "when beat sent the scan"
# Beat's start on a loaded machine, then up to a minute to the next whole minute.
SCAN_SENT_WITHIN_S = 120.0
RECONCILE_INTERVAL_S = 5


def has_sent_scan_and_reconciles(log_path: Path) -> bool:
    """The log shows a scan sent, and the reconciler twice (beat's own view, not jq's)."""
    entries = [event.get("entry") for event in parse_log_lines(log_path.read_text())
               if event.get("event") == "beat.sent"]
    return SCAN_ENTRY_NAME in entries and entries.count(RECONCILE_ENTRY_NAME) >= 2


def test_the_runbooks_jq_line_prints_each_send_of_a_running_beat(tmp_path: Path) -> None:
    [recipe] = [r for r in documented_recipes() if r.title.startswith(RECIPE_TITLE)]
    assert recipe.producer == "compactor beat 2>&1"
    job_env = build_job_env(f"sqlite:///{tmp_path / 'unused.db'}", None, scan_cron="* * * * *",
                            reconcile_interval_s=RECONCILE_INTERVAL_S)
    env = os.environ | job_env.env | {"COMPACTOR_DATA_DIR": str(tmp_path / "beat")}
    log_path = tmp_path / "beat.log"
    with redis_under_prefix(job_env.prefix) as client:
        with log_path.open("w") as log, subprocess.Popen(
                [sys.executable, "-m", "scheduler", "beat"], env=env, cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True) as beat:
            try:
                deadline = time.monotonic() + SCAN_SENT_WITHIN_S
                while not has_sent_scan_and_reconciles(log_path):
                    assert beat.poll() is None, log_path.read_text()[-3000:]
                    assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                    time.sleep(0.5)
            finally:
                os.killpg(beat.pid, signal.SIGTERM)
                beat.wait(30)
        queued = {json.loads(item)["headers"]["id"]
                  for item in client.lrange(f"{job_env.prefix}{job_env.queue}", 0, -1)}

    sends = run_jq(recipe, log_path.read_text())
    # Every entry of the schedule: the scan, the reconciler and its quick lease sweep.
    assert {send["entry"] for send in sends} == {
        SCAN_ENTRY_NAME, RECONCILE_ENTRY_NAME, LEASE_SWEEP_ENTRY_NAME}, sends
    assert len([s for s in sends if s["entry"] == RECONCILE_ENTRY_NAME]) >= 2, sends
    assert all(set(send) == {"timestamp", "entry", "task_id"} for send in sends), sends
    assert [send["timestamp"] for send in sends] == sorted(send["timestamp"] for send in sends)
    assert {send["task_id"] for send in sends} <= queued
