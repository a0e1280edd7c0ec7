"""The checks of the whole system after the chaos run, beside the per-session ones of
``invariants.py``: nothing left stranded (queue marker, lease, unacknowledged message),
every attempt recorded once as a run and once as an event and the two agree, every
healthy session compacted, cached token counts equal to a recount, every job's LLM
calls within its plan, every poison item refused once; and how long a killed job
waited before it ran again."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from db import Store
from db.models import RunRow, SessionRow
from scheduler.reconcile import RECONCILE_EVENT
from tests.chaos.invariants import Verdict
from tests.chaos.poison import Poisoner
from tests.e2e.test_bad_messages import bad_messages
from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.job.lost_attempt import AttemptLost
from worker.logging import JOB_EVENT

SCAN_STARTED = "scan.started"  # a worker began a beat's scan (before any dependency)
SCAN_ENDINGS = ("scan.finished", "scan.skipped")  # ran to the end, or found the lock held
LOST_ATTEMPT = AttemptLost.__name__  # the failure class of an attempt a kill ended


@dataclass(frozen=True)
class KilledJob:
    """A job whose process a SIGKILL ended (its lease named that process)."""

    killed_at: datetime
    session_id: str
    lease_owner: str


@dataclass
class WorkerLogs:
    """What the worker logs say: every ``compaction.job`` event, the beat's
    ``compactor.scan`` tasks a worker started and how their scans ended (a scan in a
    killed pool child, or during an outage, has no ending; one that finds a killed
    scan's lock still held is skipped), and the lines torn (a process SIGKILLed
    mid-write leaves half a line; nothing else may)."""

    job_events: list[dict[str, Any]]
    scans_started: int
    scan_endings: Counter[str]
    torn: int
    repairs: Counter[str]  # the reconciler's, by problem and action


def read_worker_logs(log_dir: Path) -> WorkerLogs:
    events: list[dict[str, Any]] = []
    torn = scans_started = 0
    scan_endings: Counter[str] = Counter()
    repairs: Counter[str] = Counter()
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                torn += 1
                continue
            if isinstance(event, dict) and event.get("event") == JOB_EVENT:
                events.append(event)
            if not isinstance(event, dict):
                continue
            name = event.get("event")
            scans_started += name == SCAN_STARTED
            if name in SCAN_ENDINGS:
                scan_endings[str(name)] += 1
            if event.get("event") == RECONCILE_EVENT:
                repairs[f"{event.get('problem')} {event.get('action')}"] += 1
    return WorkerLogs(events, scans_started, scan_endings, torn, repairs)


def check_stranded(verdict: Verdict, engine: Engine, client: redis.Redis, prefix: str,
                   queue: str) -> None:
    """After the drain nothing is queued or running: no marker, lease or unacked message
    may remain."""
    with engine.connect() as conn:
        rows = conn.execute(select(SessionRow.session_id, SessionRow.queued_job_id,
                                   SessionRow.lease_owner)).all()
    verdict.add("stranded_markers", [f"{r.session_id}: queue marker {r.queued_job_id} left"
                                     for r in rows if r.queued_job_id is not None])
    verdict.add("stranded_leases", [f"{r.session_id}: lease of {r.lease_owner} left"
                                    for r in rows if r.lease_owner is not None])
    unacked = [unacked_task(raw) for raw in client.hvals(f"{prefix}unacked")]
    queued = int(client.llen(f"{prefix}{queue}"))
    verdict.add("broker_not_empty", [f"{len(unacked)} unacked ({', '.join(unacked)}) and "
                                     f"{queued} queued messages left"]
                if unacked or queued else [])


def unacked_task(raw: bytes | str) -> str:
    """``task[id]`` of an entry of kombu's unacked hash ([message, exchange, key])."""
    try:
        headers = json.loads(raw)[0]["headers"]
        return f"{headers['task']}[{headers['id']}]"
    except (ValueError, KeyError, IndexError, TypeError):
        return "unreadable"


def check_attempts(verdict: Verdict, events: list[dict[str, Any]], runs: list[RunRow],
                   poison_ids: set[str]) -> None:
    """Events and runs agree as multisets of (task id, attempt, outcome): one event per
    run row and no event without one (a delivery killed with its pool child has its
    own run and event, from its worker's main process, and its redelivery the next
    attempt number); an event that says its run was not recorded is a lost run unless
    the reconciler wrote it afterwards."""
    job_events = [e for e in events if str(e.get("task_id")) not in poison_ids]
    by_event = Counter((str(e["task_id"]), int(e["attempt"]), str(e["outcome"]))
                       for e in job_events)
    by_run = Counter((str(r.task_id), r.attempt, r.outcome) for r in runs
                     if str(r.task_id) not in poison_ids)
    described = {(str(r.task_id), r.attempt, r.outcome):
                 f"{r.session_id}, {r.failure_class}: {(r.failure_message or '')[:120]}, "
                 f"{r.started_at:%H:%M:%S}-{r.finished_at and f'{r.finished_at:%H:%M:%S}'}"
                 for r in runs}
    verdict.add("attempts_without_event", [f"run of {key} has no event ({described[key]})"
                                           for key in sorted(by_run - by_event)])
    verdict.add("attempts_without_run", [f"event of {key} has no run"
                                         for key in sorted(by_event - by_run)])
    # A run the database refused is kept in Redis and written by the reconciler later:
    # lost only when no row for its attempt appeared by the end.
    verdict.add("runs_not_recorded", [f"{e['task_id']} attempt {e['attempt']}: run never "
                                      "recorded" for e in job_events
                                      if e.get("run_recorded") is False
                                      and (str(e["task_id"]), int(e["attempt"]),
                                           str(e["outcome"])) not in by_run])


def check_poison(verdict: Verdict, events: list[dict[str, Any]], poisoner: Poisoner,
                 queue: str, runs: list[RunRow]) -> set[str]:
    """Each refused item pushed ended in exactly one ``rejected`` event; each hostile-
    header job ran as an ordinary job (its headers ignored). Returns the refused items'
    task ids (their events have no run)."""
    keys = {m.name: m.key or m.name for m in bad_messages(queue)}
    rejected = Counter(str(e.get("task_id")) for e in events if e.get("outcome") == "rejected")
    expected: Counter[str] = Counter()
    for name, pushed in poisoner.refused.items():
        expected[keys[name]] += pushed
    verdict.add("poison_not_refused_once",
                [f"{key}: {rejected[key]} rejected events for {count} pushed"
                 for key, count in sorted(expected.items()) if rejected[key] != count])
    ran = {r.task_id: r for r in runs if r.task_id in poisoner.hostile_jobs}
    verdict.add("hostile_headers_obeyed",
                [f"{task_id} ({kind}): no run" if task_id not in ran else
                 f"{task_id} ({kind}): {ran[task_id].outcome} {ran[task_id].failure_class}"
                 for task_id, kind in sorted(poisoner.hostile_jobs.items())
                 if task_id not in ran or ran[task_id].outcome in ("failed", "rejected")])
    return set(expected)


def check_healthy_compacted(verdict: Verdict, endings: dict[str, str],
                            failing: set[str]) -> None:
    verdict.add("healthy_not_compacted", [f"{sid}: ended {ending}"
                                          for sid, ending in sorted(endings.items())
                                          if sid not in failing and ending != "compacted"])


def check_token_counts(verdict: Verdict, store: Store, counter: TokenCounter,
                       session_ids: Iterable[str]) -> None:
    """Cached counts (per message, the session's total) equal a recount from the text."""
    for session_id in session_ids:
        history = store.messages(session_id)
        problems = [f"{session_id} seq {m.seq}: {m.tokens} cached, {recount} counted"
                    for m in history
                    if m.tokens != (recount := counter.count_message(parse_message(m.body)))]
        total = store.get_session(session_id).total_tokens
        if total != sum(m.tokens for m in history):
            problems.append(f"{session_id}: total {total} cached, "
                            f"{sum(m.tokens for m in history)} over its messages")
        verdict.add("cached_token_counts_wrong", problems)


def check_llm_calls(verdict: Verdict, runs: list[RunRow], max_calls: int) -> None:
    """A job makes at most the plan's calls: one per chunk plus one per merge round,
    and never more than ``llm_max_calls_per_job``."""
    problems = []
    for run in runs:
        figures = run.figures or {}
        calls = figures.get("llm_calls")
        if calls is None:
            continue
        planned = (figures.get("chunks") or 0) + (figures.get("merge_rounds") or 0)
        if calls > max_calls or (planned and calls > planned):
            problems.append(f"run {run.id}: {calls} LLM calls, plan {planned}, cap {max_calls}")
    verdict.add("llm_calls_over_plan", problems)


def rerun_delays(killed: list[KilledJob], runs: list[RunRow]) -> tuple[list[float], int]:
    """Seconds from each kill to the start of the next run of the killed job's session
    (not the reconciler's record of the killed attempt itself), and how many killed
    jobs never ran again: a kill just after the swap's commit leaves nothing to do, and
    the reconciler clears the lost job's marker instead of re-sending it (a session left
    undone shows in the stranded, unsettled and healthy-not-compacted checks)."""
    starts: dict[str, list[datetime]] = {}
    for run in runs:
        if run.failure_class != LOST_ATTEMPT:  # the killed attempt, recorded afterwards
            starts.setdefault(run.session_id, []).append(run.started_at)
    delays, never = [], 0
    for job in killed:
        later = [s for s in starts.get(job.session_id, []) if s > job.killed_at]
        if later:
            delays.append((min(later) - job.killed_at).total_seconds())
        else:
            never += 1
    return delays, never


def delay_summary(delays: list[float]) -> str:
    if not delays:
        return "none"
    return (f"median {statistics.median(delays):.1f} s, max {max(delays):.1f} s "
            f"({len(delays)} jobs)")


def all_runs(engine: Engine) -> list[RunRow]:
    with Session(engine) as session:
        runs = list(session.scalars(select(RunRow)))
        session.expunge_all()
    return runs
