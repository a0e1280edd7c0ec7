"""Many appenders, threads and processes, on the same sessions while a real worker compacts
them (forced jobs every half second, so compactions land between appends): every appended
message is stored exactly once, exactly one racer answers each open tool call, every
projection read meanwhile is valid, and the newest messages are in it."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import EVENT_TIMEOUT_S, JobPublisher, import_records, projection_violations
from tests.support.generated import generated_session
from tests.support.platform_traffic import AppendAttempt, open_call_id, run_appender
from worker.platform.sessions import SessionsAPI

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_IDS = ["race-a", "race-b", "race-c"]
TURNS = 40  # about 4,800 tokens: over the job env's 4,200-token trigger
THREADS, PROCESSES, BATCHES = 4, 2, 10
# Appends of one appender this far apart: traffic lasts ~1.8 s, several rounds of forced
# jobs, however fast the appends themselves are.
BATCH_PAUSE_S = 0.2


def calling_open(session_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": open_call_id(session_id), "type": "function",
         "function": {"name": "get_reservation_details", "arguments": "{}"}}]}


def import_sessions_left_waiting(store: Store) -> int:
    """Import each session ending in a tool call without its result; return the size."""
    records = [generated_session(sid, TURNS) for sid in SESSION_IDS]
    for record in records:
        record["messages"].append(calling_open(record["session_id"]))
    import_records(store, records)
    return len(records[0]["messages"])


def run_every_appender(postgres_url: str) -> list[AppendAttempt]:
    """Start the processes and threads together behind one barrier; return every attempt."""
    spawn = multiprocessing.get_context("spawn")
    with spawn.Manager() as manager, ProcessPoolExecutor(PROCESSES, mp_context=spawn) as procs, \
            ThreadPoolExecutor(THREADS) as threads, SessionsAPI.open(postgres_url) as shared:
        barrier = manager.Barrier(THREADS + PROCESSES)
        futures = [procs.submit(run_appender, postgres_url, f"P{n}", SESSION_IDS, BATCHES,
                                barrier, pause_s=BATCH_PAUSE_S) for n in range(PROCESSES)]
        futures += [threads.submit(run_appender, postgres_url, f"T{n}", SESSION_IDS, BATCHES,
                                   barrier, shared, pause_s=BATCH_PAUSE_S)
                    for n in range(THREADS)]
        return [attempt for future in futures for attempt in future.result(timeout=120)]


def watch_projections(store: Store, stop: threading.Event, seen: list[str],
                      reads: list[str]) -> None:
    """Read every session's projection until stopped; keep every violation found."""
    while not stop.is_set():
        for session_id in SESSION_IDS:
            seen.extend(f"{session_id}: {v}" for v in projection_violations(store, session_id))
            reads.append(session_id)
        time.sleep(0.02)


def publish_jobs(publisher: JobPublisher, stop: threading.Event, sent: list[str]) -> None:
    """Forced jobs, so every one with a new span compacts, however little was appended."""
    while not stop.is_set():
        sent.extend(publisher.publish(session_id, reason="race", force=True)
                    for session_id in SESSION_IDS)
        stop.wait(0.5)


def body_counts(store: Store, session_id: str) -> Counter[str]:
    """How often each body occurs in the session's full history."""
    return Counter(json.dumps(m.body, sort_keys=True) for m in store.messages(session_id))


def test_threads_and_processes_append_to_the_same_sessions_while_a_worker_compacts_them(
    pg_store: Store, postgres_url: str, publisher: JobPublisher, start_worker: StartWorker,
) -> None:
    imported = import_sessions_left_waiting(pg_store)
    worker = start_worker(concurrency=2)
    stop, violations, sent, reads = threading.Event(), list[str](), list[str](), list[str]()
    background = [threading.Thread(target=watch_projections,
                                   args=(pg_store, stop, violations, reads)),
                  threading.Thread(target=publish_jobs, args=(publisher, stop, sent))]
    for thread in background:
        thread.start()
    try:
        attempts = run_every_appender(postgres_url)
    finally:
        stop.set()
        for thread in background:
            thread.join()
    worker.wait_for_events("compaction.job", len(sent), timeout_s=EVENT_TIMEOUT_S * 2)

    answers = [a for a in attempts if a.is_answer]
    stored = [a for a in attempts if a.seqs]
    for session_id in SESSION_IDS:
        raced = [a for a in answers if a.session_id == session_id]
        assert len(raced) == THREADS + PROCESSES
        assert [a for a in raced if a.seqs] == [max(raced, key=lambda a: len(a.seqs))], raced
        assert {a.rejected_kinds for a in raced if not a.seqs} == {("orphan_tool_result",)}
        history = pg_store.messages(session_id)
        assert [m.tool_call_id for m in history].count(open_call_id(session_id)) == 1
        mine = [a for a in stored if a.session_id == session_id]
        assert len(history) == imported + sum(len(a.seqs) for a in mine)
        for a in mine:
            assert [history[seq - 1].body for seq in a.seqs] == list(a.bodies)
        counts = body_counts(pg_store, session_id)
        assert {counts[json.dumps(b, sort_keys=True)] for a in mine for b in a.bodies} == {1}
        newest = max(mine, key=lambda a: a.seqs[-1])
        assert pg_store.projection(session_id)[-len(newest.bodies):] == list(newest.bodies)
        assert projection_violations(pg_store, session_id) == []
    assert violations == [] and len(reads) > 10 * len(SESSION_IDS)
    events = worker.events("compaction.job")
    assert sum(e["outcome"] == "compacted" for e in events) >= len(SESSION_IDS), events
    # A forced job over a span of a few appends may find its summary no smaller than what
    # it replaces (and a few such failures open the breaker): the only failures allowed.
    unexpected = [(e["outcome"], e["reason"]) for e in events
                  if e["outcome"] not in ("compacted", "skipped", "conflict", "breaker_open")
                  and e["reason"] != "not_smaller"]
    assert unexpected == []
    heads = {sid: pg_store.get_session(sid).head_seq for sid in SESSION_IDS}
    mid_traffic = [r for sid in SESSION_IDS for r in pg_store.revisions(sid)
                   if imported < r.snapshot_head_seq < heads[sid]]
    assert mid_traffic, "no compaction saw some appends but not all"
