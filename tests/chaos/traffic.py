"""The chaos run's traffic: the sessions it imports, the ledger of every message stored
per session, the threads that keep appending to sessions through the intake (as the
platform does, leaving tool calls open across snapshots and racing to answer them),
and one scheduler scan for the quiet phase."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
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
from worker.errors import MessagesRejected
from worker.platform.ingest import ImportStatus, append_messages, check_record, import_sessions

# Where a generated session starts, at least: over the run's 2,800-token trigger
# (run.py's 4,000-token model window).
START_TOKENS = 3_000

RESOLVE_ATTEMPTS = 100
OPEN_CALL_SHARE = 0.25  # appends that leave their tool calls open for a later append
RACE_SHARE = 0.3  # answers to an open call sent twice at once
FAIL_MARKER = "[[behave:malformed_json]]"  # every summary of such a session is malformed


class Ledger:
    """Every message imported or appended, per session, by its seq (appends to one
    session may race: the seqs the store returned place each batch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._messages: dict[str, dict[int, dict[str, Any]]] = {}
        self.appended_messages = 0
        self.appended_batches = 0
        self.unsure_appends = 0  # the append raised; reading the session said it committed
        self.open_call_batches = 0  # batches that left a tool call open for a later append
        self.races = 0  # two appends answering the same open call at once
        self.races_lost = 0  # the loser refused (the call was answered): nothing stored
        self.problems: list[str] = []

    def record_import(self, session_id: str, messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._messages[session_id] = dict(enumerate(messages, start=1))

    def record_append(self, session_id: str, seqs: Sequence[int],
                      batch: list[dict[str, Any]], *, unsure: bool = False) -> None:
        with self._lock:
            stored = self._messages[session_id]
            for seq, message in zip(seqs, batch, strict=True):
                if seq in stored:
                    self.problems.append(f"{session_id}: seq {seq} stored twice")
                stored[seq] = message
            self.appended_messages += len(batch)
            self.appended_batches += 1
            self.unsure_appends += int(unsure)

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def expected(self, session_id: str) -> list[dict[str, Any]]:
        """The session's messages in seq order (a gap shows as a length mismatch)."""
        with self._lock:
            stored = self._messages[session_id]
            return [stored[seq] for seq in sorted(stored)]

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
        turns = rng.randint(8, 10)
        messages = generate_session(config.seed * 100_000 + index, turns)
        # Over the trigger from the start: every healthy session must end compacted (a
        # short one under it would never be due, and end unsettled by right).
        while _tokens(counter, session_id, messages) < START_TOKENS:
            turns += 1
            messages = generate_session(config.seed * 100_000 + index, turns)
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


def _tokens(counter: TokenCounter, session_id: str, messages: list[dict[str, Any]]) -> int:
    _, _, checked = check_record({"session_id": session_id, "messages": messages},
                                 IntakePolicy())
    return counter.count_messages(checked.messages)


class Appender(threading.Thread):
    """Appends to one of its own sessions every ``pause_s`` and records what was
    stored. A batch is a full tool-call turn, a user/assistant exchange, or a request
    whose tool calls stay open (the answer comes in a later append, often after a job
    has snapshotted the session); an open call is now and then answered by two appends
    at once, of which the store must take exactly one. Open calls are answered before
    the thread ends."""

    def __init__(self, name: str, store: Store, counter: TokenCounter, ledger: Ledger,
                 session_ids: list[str], stop: threading.Event, *, pause_s: float,
                 rng: random.Random) -> None:
        super().__init__(name=name, daemon=True)
        self._store, self._counter, self._ledger = store, counter, ledger
        self._session_ids, self._stop_event = session_ids, stop
        self._pause_s, self._rng = pause_s, rng
        self._turns = 0
        self._open: dict[str, list[dict[str, Any]]] = {}  # session -> its open calls

    def run(self) -> None:
        while self._session_ids and not self._stop_event.wait(self._pause_s):
            session_id = self._rng.choice(self._session_ids)
            if session_id in self._open:
                self._answer(session_id, race=self._rng.random() < RACE_SHARE)
            else:
                self._append_request(session_id, self._next_batch(session_id))
        for session_id in list(self._open):  # the run ends with every call answered
            for _ in range(RESOLVE_ATTEMPTS):
                if self._answer(session_id, race=False):
                    break
                time.sleep(0.1)

    def _append(self, session_id: str, batch: list[dict[str, Any]], *,
                may_lose: bool = False) -> bool:
        """Append ``batch``; True when it is stored. ``may_lose``: a refusal because its
        call was answered meanwhile is the expected end of a lost race."""
        try:
            seqs = append_messages(self._store, self._counter, IntakePolicy(), session_id,
                                   batch, datetime.now(UTC))
        except StoreError:
            return self._resolve(session_id, batch)
        except MessagesRejected as exc:
            if may_lose:
                self._ledger.count("races_lost")
            else:  # a finding: reported once, and the session's open calls forgotten
                self._ledger.report_problem(f"append to {session_id} refused: {exc}")
                self._open.pop(session_id, None)
            return False
        except Exception as exc:  # anything else is a finding, reported at the end
            self._ledger.report_problem(f"append to {session_id}: {exc!r}")
            return False
        self._ledger.record_append(session_id, seqs, batch)
        return True

    def _answer(self, session_id: str, *, race: bool) -> bool:
        """Answer the session's open calls (and reply); with ``race``, two threads send
        differing answers at the same moment. True when the calls are answered."""
        calls = self._open[session_id]
        if not race:
            answered = self._append(session_id, answer_batch(calls, "the agent"))
        else:
            self._ledger.count("races")
            gate = threading.Barrier(2)
            results: list[bool] = [False, False]

            def send(slot: int) -> None:
                batch = answer_batch(calls, f"racer {slot}")
                gate.wait(5)
                results[slot] = self._append(session_id, batch, may_lose=True)

            racers = [threading.Thread(target=send, args=(slot,)) for slot in (0, 1)]
            for racer in racers:
                racer.start()
            for racer in racers:
                racer.join(60)
            if all(results):
                self._ledger.report_problem(f"{session_id}: both racing answers were stored")
            answered = any(results)
        if answered:
            self._open.pop(session_id, None)
        return answered or session_id not in self._open

    def _next_batch(self, session_id: str) -> list[dict[str, Any]]:
        self._turns += 1
        label = f"{self.name}_{self._turns}"
        roll = self._rng.random()
        if roll < OPEN_CALL_SHARE:
            turn = agent_turn(self._rng, label, tool_lines=self._rng.randint(2, 10))
            request = turn[:2]  # the user's request and the assistant's tool calls
            self._open[session_id] = list(request[1]["tool_calls"])
            self._ledger.count("open_call_batches")
            return request
        if roll < 0.6:
            return agent_turn(self._rng, label, tool_lines=self._rng.randint(2, 10))
        return [{"role": "user", "content": f"{label}: and what about the error budget?"},
                {"role": "assistant", "content": f"{label}: it is at {self._rng.randint(1, 99)}"
                 "% and the SLO holds; I will keep watching the retry rate."}]

    def _append_request(self, session_id: str, batch: list[dict[str, Any]]) -> None:
        """Append a new batch; a request that was not stored leaves no call open."""
        if not self._append(session_id, batch):
            self._open.pop(session_id, None)

    def _resolve(self, session_id: str, batch: list[dict[str, Any]]) -> bool:
        """The append failed (a dropped connection, a restart): read the session back to
        learn whether it committed before the failure, and record it if it did."""
        for _ in range(RESOLVE_ATTEMPTS):
            try:
                stored = self._store.messages(session_id)
                break
            except StoreError:
                time.sleep(0.1)
        else:
            self._ledger.report_problem(f"{session_id}: unreadable after a failed append")
            return False
        bodies = [m.body for m in stored]
        for start in range(len(bodies) - len(batch) + 1):
            if bodies[start:start + len(batch)] == batch:
                seqs = [m.seq for m in stored[start:start + len(batch)]]
                self._ledger.record_append(session_id, seqs, batch, unsure=True)
                return True
        return False


def answer_batch(calls: list[dict[str, Any]], who: str) -> list[dict[str, Any]]:
    """The results of ``calls`` and the assistant's reply, worded by ``who``."""
    results = [{"role": "tool", "tool_call_id": call["id"],
                "content": f"{call['function']['name']} done for {call['id']} ({who}): "
                "exit 0, 3 files changed"} for call in calls]
    return [*results, {"role": "assistant",
                       "content": f"Results in ({who}); the change is in and tests pass."}]


def scan_once(store: Store, publisher: Publisher, policy: ScanPolicy) -> int:
    """One scheduler scan; returns how many jobs it enqueued."""
    return run_scan(store, publisher, policy, datetime.now(UTC)).enqueued
