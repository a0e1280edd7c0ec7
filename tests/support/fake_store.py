"""An in-memory store that keeps ``db.Store``'s contract for the job and for ingest:
leases with expiry and ownership, compare-and-swap of the active revision raising the same
``db`` errors, breaker fields, runs (also of unknown sessions), projection figures.

``tests/integration/test_store_contract.py`` runs the same checks on this fake and on the
real store (SQLite and PostgreSQL), so the two cannot drift apart. ``fail_with`` makes a
method raise, as a database that went away would.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from db import (
    NO_SKIP,
    BreakerUpdate,
    JobSnapshot,
    LeaseLost,
    MessageRecord,
    MessageText,
    NewMessage,
    NewRevision,
    NewRun,
    RevisionConflict,
    RevisionRecord,
    RevisionSizes,
    RunRecord,
    SessionExists,
    SessionNotFound,
    SessionState,
    SnapshotSkipRule,
    ToolCallState,
    encode_outcomes,
)
from worker.compaction import find_open_tool_calls, parse_message

# Mirrors db.models.INSTRUCTION_ROLES: covered instructions stay in the projection.
INSTRUCTION_ROLES = ("system", "developer")
BREAKER_STATES = ("closed", "open", "half_open")
T = TypeVar("T")
M = TypeVar("M")


class FakeStore:
    """Sessions, messages, revisions and runs in dicts; every method is atomic."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionState] = {}
        self._messages: dict[str, list[MessageRecord]] = {}
        self._revisions: list[RevisionRecord] = []
        self._runs: list[RunRecord] = []
        self._failures: dict[str, Exception] = {}

    def fail_with(self, method: str, error: Exception | None) -> None:
        """Make ``method`` raise ``error`` from now on (None: work again)."""
        if error is None:
            self._failures.pop(method, None)
        else:
            self._failures[method] = error

    def _check(self, method: str) -> None:
        if method in self._failures:
            raise self._failures[method]

    # --- ingest ---------------------------------------------------------------------

    def import_session(self, session_id: str, metadata: dict[str, Any],
                       messages: Sequence[NewMessage], now: datetime, *,
                       session_format: str = "chat", system_tokens: int = 0) -> SessionState:
        self._check("import_session")
        if session_id in self._sessions:
            raise SessionExists(f"session {session_id!r} already exists")
        self._sessions[session_id] = _new_session(session_id, metadata, now, session_format,
                                                  system_tokens)
        self._messages[session_id] = []
        if messages:
            self._append(session_id, messages, now)
        return self._sessions[session_id]

    def append_messages(self, session_id: str, messages: Sequence[NewMessage], *,
                        now: datetime, create: bool = False,
                        metadata: dict[str, Any] | None = None) -> list[int]:
        self._check("append_messages")
        if create and session_id not in self._sessions:
            self._sessions[session_id] = _new_session(session_id, metadata or {}, now)
            self._messages[session_id] = []
        self._find(session_id)
        return self._append(session_id, messages, now) if messages else []

    def append_checked(
        self, session_id: str, check: Callable[[ToolCallState], tuple[Sequence[NewMessage], T]],
        *, now: datetime, create: bool = False, metadata: dict[str, Any] | None = None,
        session_format: str = "chat", system_tokens: int = 0,
    ) -> tuple[list[int], T]:
        self._check("append_checked")
        if create and session_id not in self._sessions:
            self._sessions[session_id] = _new_session(session_id, metadata or {}, now,
                                                      session_format, system_tokens)
            self._messages[session_id] = []
        self._find(session_id)
        messages, report = check(_tool_call_state(self._messages[session_id]))
        return (self._append(session_id, messages, now) if messages else []), report

    def messages(self, session_id: str, *, after_seq: int = 0) -> list[MessageRecord]:
        self._find(session_id)
        return [m for m in self._messages[session_id] if m.seq > after_seq]

    def projection(self, session_id: str) -> list[dict[str, Any]]:
        _state, revision, active = self._read_active(session_id)
        if revision is None:
            return [m.body for m in active]
        covered = [m.body for m in active if m.seq <= revision.through_seq]
        tail = [m.body for m in active if m.seq > revision.through_seq]
        return [*covered, revision.block, *tail]

    def list_sessions(self, *, after: str | None = None, limit: int = 100) -> list[SessionState]:
        ids = sorted(sid for sid in self._sessions if after is None or sid > after)
        return [self._sessions[sid] for sid in ids[:limit]]

    # --- the job's port (worker.job.ports.JobLedgerPort) ---------------------------------------

    def start_job(self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
                  take_over: str | None = None) -> SessionState | None:
        self._check("start_job")
        holder = self._find(session_id).lease_owner
        if take_over is not None and holder is not None and holder.endswith(f":{take_over}"):
            self.release_lease(session_id, holder)
        return self._find(session_id) if self._take_lease(session_id, owner, ttl_s, now) \
            else None

    def start_job_with_snapshot(
        self, session_id: str, owner: str, ttl_s: float, now: datetime, *,
        take_over: str | None = None, history: int = 2,
        to_message: Callable[[MessageText], M], skip_rule: SnapshotSkipRule = NO_SKIP,
    ) -> JobSnapshot[M] | None:
        if self.start_job(session_id, owner, ttl_s, now, take_over=take_over) is None:
            return None
        return self.job_snapshot(session_id, history=history, to_message=to_message,
                                 skip_rule=skip_rule)

    def job_snapshot(self, session_id: str, *, history: int = 2,
                     to_message: Callable[[MessageText], M],
                     skip_rule: SnapshotSkipRule = NO_SKIP) -> JobSnapshot[M]:
        self._check("job_snapshot")
        state, revision, active = self._read_active(session_id)
        if shut := skip_rule.row_alone(state, revision):
            return shut
        recent = tuple(RevisionSizes(r.projection_tokens_before, r.projection_tokens_after)
                       for r in self.revisions(session_id)[:history])
        # The body as the store's JSON column holds it (json.dumps, as SQLAlchemy writes).
        messages = [to_message(MessageText(
            m.seq, json.dumps(m.body), m.tokens,
            None if m.identifiers is None else json.dumps([list(i) for i in m.identifiers]),
            encode_outcomes(m.outcomes), state.session_format))
            for m in active]
        return JobSnapshot(state, revision, messages, recent)

    def commit_job(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None = None,
    ) -> int:
        self._check("commit_job")
        revision_id = self._swap(
            session_id, expected_revision_id=expected_revision_id, lease_owner=lease_owner,
            revision=revision, run=run, now=now, breaker=breaker)
        self.release_lease(session_id, lease_owner)
        self._clear_marker(session_id, run.task_id)
        return revision_id

    def finish_job(self, run: NewRun, *, lease_owner: str | None,
                   breaker: BreakerUpdate | None = None,
                   clear_queue_marker: bool = False) -> int:
        self._check("finish_job")
        run_id = self.record_run(run, breaker=breaker)
        if run.session_id in self._sessions:
            if lease_owner is not None:
                self.release_lease(run.session_id, lease_owner)
            if clear_queue_marker:
                self._clear_marker(run.session_id, run.task_id)
        return run_id

    def _take_lease(self, session_id: str, owner: str, ttl_s: float, now: datetime) -> bool:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        state = self._find(session_id)
        expires_at = state.lease_expires_at
        # As the store's SQL: a lease without an expiry never expires.
        if state.lease_owner not in (None, owner) and (expires_at is None or expires_at > now):
            return False
        self._put(state, lease_owner=owner, lease_expires_at=now + timedelta(seconds=ttl_s))
        return True

    def renew_lease(self, session_id: str, owner: str, ttl_s: float, now: datetime) -> bool:
        self._check("renew_lease")
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        state = self._find(session_id)
        if state.lease_owner != owner:
            return False
        self._put(state, lease_expires_at=now + timedelta(seconds=ttl_s))
        return True

    def release_lease(self, session_id: str, owner: str) -> bool:
        self._check("release_lease")
        state = self._find(session_id)
        if state.lease_owner != owner:
            return False
        self._put(state, lease_owner=None, lease_expires_at=None)
        return True

    def get_session(self, session_id: str) -> SessionState:
        self._check("get_session")
        return self._find(session_id)

    def set_breaker(self, session_id: str, update: BreakerUpdate) -> None:
        self._check("set_breaker")
        _check_breaker(update)
        self._put(self._find(session_id), breaker_state=update.state,
                  breaker_failures=update.failures, breaker_opened_at=update.opened_at)

    def _read_active(self, session_id: str
                     ) -> tuple[SessionState, RevisionRecord | None, list[MessageRecord]]:
        """The session, its active revision and its active messages."""
        state = self._find(session_id)
        revision = self._active(state)
        through_seq = revision.through_seq if revision else 0
        active = [m for m in self._messages[session_id]
                  if m.seq > through_seq or m.role in INSTRUCTION_ROLES]
        return state, revision, active

    def revisions(self, session_id: str) -> list[RevisionRecord]:
        self._check("revisions")
        self._find(session_id)
        return [r for r in reversed(self._revisions) if r.session_id == session_id]

    def _swap(
        self, session_id: str, *, expected_revision_id: int | None, lease_owner: str,
        revision: NewRevision, run: NewRun, now: datetime, breaker: BreakerUpdate | None,
    ) -> int:
        if run.session_id != session_id:
            raise ValueError(f"run is for {run.session_id!r}, not {session_id!r}")
        state = self._find(session_id)
        _check_lease(state, lease_owner, now)
        if state.active_revision_id != expected_revision_id:
            raise RevisionConflict(f"session {session_id!r}: active revision is "
                                   f"{state.active_revision_id}, expected {expected_revision_id}")
        parent = self._active(state)
        _check_bounds(state, parent, revision)
        projection_tokens, unsummarized = self._measure(session_id, revision.through_seq,
                                                        revision.snapshot_head_seq,
                                                        revision.block_tokens)
        created = RevisionRecord(
            id=len(self._revisions) + 1, session_id=session_id,
            parent_revision_id=parent.id if parent else None,
            **{f.name: getattr(revision, f.name) for f in dataclasses.fields(NewRevision)
               if f.name != "artifacts_json"},
            artifacts=json.loads(revision.artifacts_json),
            projection_tokens_after=projection_tokens, created_at=now)
        self._revisions.append(created)
        closed = breaker or BreakerUpdate(state="closed", failures=0, opened_at=None)
        self._put(state, active_revision_id=created.id, projection_tokens=projection_tokens,
                  tokens_since_compaction=unsummarized, last_compacted_at=now,
                  breaker_state=closed.state, breaker_failures=closed.failures,
                  breaker_opened_at=closed.opened_at)
        self._insert_run(run, created.id)
        return created.id

    def record_run(self, run: NewRun, *, breaker: BreakerUpdate | None = None) -> int:
        self._check("record_run")
        if breaker is not None:
            _check_breaker(breaker)
        run_id = self._insert_run(run, run.revision_id)
        if breaker is not None and run.session_id in self._sessions:
            self._put(self._sessions[run.session_id], breaker_state=breaker.state,
                      breaker_failures=breaker.failures, breaker_opened_at=breaker.opened_at)
        return run_id

    # --- operators --------------------------------------------------------------------

    def runs(self, *, session_id: str | None = None, outcome: str | None = None,
             limit: int = 100) -> list[RunRecord]:
        found = [r for r in reversed(self._runs)
                 if session_id in (None, r.session_id) and outcome in (None, r.outcome)]
        return found[:limit]

    def rollback(self, session_id: str) -> RevisionRecord | None:
        """Point the session at its active revision's parent (None: no summary)."""
        state = self._find(session_id)
        active = self._active(state)
        if active is None:
            raise LookupError(f"session {session_id!r} has no active revision")
        parent = next((r for r in self._revisions if r.id == active.parent_revision_id), None)
        bounds = (parent.through_seq, parent.snapshot_head_seq, parent.block_tokens) \
            if parent else (0, 0, 0)
        projection_tokens, unsummarized = self._measure(session_id, *bounds)
        self._put(state, active_revision_id=parent.id if parent else None,
                  projection_tokens=projection_tokens, tokens_since_compaction=unsummarized)
        return parent

    # --- internals --------------------------------------------------------------------

    def _find(self, session_id: str) -> SessionState:
        state = self._sessions.get(session_id)
        if state is None:
            raise SessionNotFound(f"no session {session_id!r}")
        return state

    def _clear_marker(self, session_id: str, job_id: str | None) -> None:
        state = self._find(session_id)
        if job_id is not None and state.queued_job_id == job_id:
            self._put(state, queued_at=None, queued_job_id=None)

    def _put(self, state: SessionState, **changes: Any) -> None:
        self._sessions[state.session_id] = dataclasses.replace(state, **changes)

    def _active(self, state: SessionState) -> RevisionRecord | None:
        return next((r for r in self._revisions if r.id == state.active_revision_id), None)

    def _append(self, session_id: str, messages: Sequence[NewMessage], now: datetime
                ) -> list[int]:
        state = self._find(session_id)
        seqs = list(range(state.head_seq + 1, state.head_seq + len(messages) + 1))
        self._messages[session_id] += [
            MessageRecord(seq, m.body, m.role, m.tool_call_id, m.tokens, m.identifiers,
                          m.outcomes)
            for seq, m in zip(seqs, messages, strict=True)]
        added = sum(m.tokens for m in messages)
        self._put(state, head_seq=seqs[-1], total_tokens=state.total_tokens + added,
                  projection_tokens=state.projection_tokens + added,
                  tokens_since_compaction=state.tokens_since_compaction + added,
                  last_appended_at=now)
        return seqs

    def _measure(self, session_id: str, through_seq: int, snapshot_head_seq: int,
                 block_tokens: int) -> tuple[int, int]:
        """The projection's tokens with a revision of these bounds, and those it did not see."""
        messages = self._messages[session_id]
        covered = sum(m.tokens for m in messages
                      if m.seq <= through_seq and m.role in INSTRUCTION_ROLES)
        tail = sum(m.tokens for m in messages if m.seq > through_seq)
        unsummarized = sum(m.tokens for m in messages if m.seq > snapshot_head_seq)
        system = self._sessions[session_id].system_tokens
        return (system + covered + block_tokens + tail,
                unsummarized + (system if snapshot_head_seq == 0 else 0))

    def _insert_run(self, run: NewRun, revision_id: int | None) -> int:
        fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(NewRun)}
        record = RunRecord(**{**fields, "revision_id": revision_id}, id=len(self._runs) + 1)
        self._runs.append(record)
        return record.id


def _new_session(session_id: str, metadata: dict[str, Any], now: datetime,
                 session_format: str = "chat", system_tokens: int = 0) -> SessionState:
    return SessionState(
        session_id=session_id, metadata=dict(metadata), session_format=session_format,
        head_seq=0,
        active_revision_id=None, system_tokens=system_tokens,
        total_tokens=system_tokens, projection_tokens=system_tokens,
        tokens_since_compaction=system_tokens, created_at=now,
        last_appended_at=None, last_compacted_at=None, lease_owner=None, lease_expires_at=None,
        breaker_state="closed", breaker_failures=0, breaker_opened_at=None, queued_at=None,
        queued_job_id=None)


def _check_lease(state: SessionState, owner: str | None, now: datetime) -> None:
    expires_at = state.lease_expires_at
    if owner is not None and (state.lease_owner != owner or expires_at is None
                              or expires_at <= now):
        raise LeaseLost(f"session {state.session_id!r}: lease is held by "
                        f"{state.lease_owner!r} until {expires_at}, not by {owner!r}")


def _check_bounds(state: SessionState, parent: RevisionRecord | None,
                  revision: NewRevision) -> None:
    floor_seq = parent.through_seq if parent else 0
    if not floor_seq <= revision.through_seq <= revision.snapshot_head_seq <= state.head_seq:
        raise ValueError(f"session {state.session_id!r}: revision bounds out of order")


def _check_breaker(update: BreakerUpdate) -> None:
    if update.state not in BREAKER_STATES or update.failures < 0:
        raise ValueError(f"invalid breaker update {update!r}")


def _tool_call_state(history: list[MessageRecord]) -> ToolCallState:
    """The core's rule (``find_open_tool_calls``) over the history: the contract test
    holds the store's SQL to it."""
    answered = frozenset(m.tool_call_id for m in history if m.role == "tool" and m.tool_call_id)
    last = next((i for i in range(len(history) - 1, -1, -1) if history[i].role != "tool"), 0)
    tail = [parse_message(m.body) for m in history[last:]]
    return ToolCallState(find_open_tool_calls(tail), answered)
