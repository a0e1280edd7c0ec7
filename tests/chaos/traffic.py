"""The chaos run's traffic: the sessions it imports, the ledger of every message stored
per session, the threads that keep appending to sessions through the intake (as the
platform does), and the scanner that keeps enqueuing the due ones through the real
scheduler scan."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from db import Store, StoreError
from scheduler.enqueue import Publisher, run_scan
from scheduler.selection import ScanPolicy
from tests.chaos.config import ChaosConfig
from tests.support.chaos import agent_turn, generate_session
from tests.support.corpus import load_corpus
from worker.compaction.intake import IntakePolicy
from worker.compaction.messages import dump_message
from worker.compaction.tokens import TokenCounter
from worker.ingest import ImportStatus, append_messages, check_record, import_sessions

RESOLVE_ATTEMPTS = 100
FAIL_MARKER = "[[behave:malformed_json]]"  # every summary of such a session is malformed


class Ledger:
    """Every message imported or appended, per session, in stored order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: dict[str, list[dict[str, Any]]] = {}
        self.appended_messages = 0
        self.appended_batches = 0
        self.unsure_appends = 0  # the append raised; reading the session said it committed
        self.problems: list[str] = []

    def record_import(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._messages[session_id] = list(messages)

    def record_append(self, session_id: str, batch: list[dict[str, Any]], *,
                      unsure: bool = False) -> None:
        with self._lock:
            self._messages[session_id].extend(batch)
            self.appended_messages += len(batch)
            self.appended_batches += 1
            self.unsure_appends += int(unsure)

    def expected(self, session_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._messages[session_id])

    def session_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._messages)

    def report_problem(self, problem: str) -> None:
        with self._lock:
            self.problems.append(problem)


def import_run_sessions(store: Store, ledger: Ledger, counter: TokenCounter,
                        config: ChaosConfig) -> set[str]:
    """Import generated sessions (``failing_share`` of them carrying FAIL_MARKER) and the
    first ``corpus_sessions`` of the corpus's ``dev_long``; record in ``ledger`` what
    the intake stores. Returns the ids of the sessions whose summaries always fail."""
    rng = random.Random(config.seed)
    failing: set[str] = set()
    records: list[dict[str, Any]] = []
    for index in range(config.sessions):
        session_id = f"chaos-{index:04d}"
        messages = generate_session(config.seed * 100_000 + index, rng.randint(8, 10))
        if rng.random() < config.failing_share:
            messages[1]["content"] += f" {FAIL_MARKER}"
            failing.add(session_id)
        records.append({"session_id": session_id, "messages": messages})
    if config.corpus_sessions:
        records += load_corpus("dev_long")[: config.corpus_sessions]
    for record in records:
        _, _, checked = check_record(record, IntakePolicy())
        ledger.record_import(str(record["session_id"]),
                             [dump_message(m) for m in checked.messages])
    reports = import_sessions(records, store=store, counter=counter, policy=IntakePolicy(),
                              now=datetime.now(UTC) - timedelta(days=1))
    stored = (ImportStatus.IMPORTED, ImportStatus.REPAIRED)
    if any(report.status not in stored for report in reports):
        raise RuntimeError("a session of the run was not imported")
    return failing


class Appender(threading.Thread):
    """Appends a turn to one of its own sessions every ``pause_s`` (one writer per
    session, as an agent loop is) and records what was stored."""

    def __init__(self, name: str, store: Store, counter: TokenCounter, ledger: Ledger,
                 session_ids: list[str], stop: threading.Event, *, pause_s: float,
                 rng: random.Random) -> None:
        super().__init__(name=name, daemon=True)
        self._store, self._counter, self._ledger = store, counter, ledger
        self._session_ids, self._stop_event = session_ids, stop
        self._pause_s, self._rng = pause_s, rng
        self._turns = 0

    def run(self) -> None:
        while self._session_ids and not self._stop_event.wait(self._pause_s):
            session_id = self._rng.choice(self._session_ids)
            batch = self._next_batch()
            try:
                append_messages(self._store, self._counter, IntakePolicy(), session_id, batch,
                                datetime.now(UTC))
            except StoreError:
                self._resolve(session_id, batch)
            except Exception as exc:  # anything else is a finding, reported at the end
                self._ledger.report_problem(f"append to {session_id}: {exc!r}")
            else:
                self._ledger.record_append(session_id, batch)

    def _next_batch(self) -> list[dict[str, Any]]:
        self._turns += 1
        label = f"{self.name}_{self._turns}"
        if self._rng.random() < 0.5:
            return agent_turn(self._rng, label, tool_lines=self._rng.randint(2, 10))
        return [{"role": "user", "content": f"{label}: and what about the error budget?"},
                {"role": "assistant", "content": f"{label}: it is at {self._rng.randint(1, 99)}"
                 "% and the SLO holds; I will keep watching the retry rate."}]

    def _resolve(self, session_id: str, batch: list[dict[str, Any]]) -> None:
        """The append failed (a dropped connection): read the session back to learn
        whether it committed before the failure, and record it if it did."""
        known = len(self._ledger.expected(session_id))
        for _ in range(RESOLVE_ATTEMPTS):
            try:
                stored = [m.body for m in self._store.messages(session_id)]
                break
            except StoreError:
                time.sleep(0.1)
        else:
            self._ledger.report_problem(f"{session_id}: unreadable after a failed append")
            return
        if len(stored) == known:
            return
        if len(stored) == known + len(batch) and stored[known:] == batch:
            self._ledger.record_append(session_id, batch, unsure=True)
            return
        self._ledger.report_problem(f"{session_id}: {len(stored)} messages after a failed "
                                    f"append of {len(batch)} onto {known}")


class Scanner(threading.Thread):
    """Runs the scheduler's scan every ``interval_s`` while the queue is short."""

    def __init__(self, store: Store, publisher: Publisher, policy: ScanPolicy,
                 stop: threading.Event, *, interval_s: float,
                 queue_length: Callable[[], int], max_queued: int) -> None:
        super().__init__(name="scanner", daemon=True)
        self._store, self._publisher, self._policy = store, publisher, policy
        self._stop_event, self._interval_s = stop, interval_s
        self._queue_length, self._max_queued = queue_length, max_queued
        self.enqueued = 0
        self.errors = 0

    def run(self) -> None:
        while not self._stop_event.wait(self._interval_s):
            try:
                if self._queue_length() < self._max_queued:
                    self.enqueued += scan_once(self._store, self._publisher, self._policy)
            except Exception:  # Redis or PostgreSQL is down right now: the next scan retries
                self.errors += 1


def scan_once(store: Store, publisher: Publisher, policy: ScanPolicy) -> int:
    """One scheduler scan; returns how many jobs it enqueued."""
    return run_scan(store, publisher, policy, datetime.now(UTC)).enqueued
