"""A compaction job's three transactions, in SQLAlchemy Core (no ORM unit of work).

1. :func:`take_lease`: one ``UPDATE ... RETURNING`` takes the lease and reads the row.
2. :func:`read_snapshot`: the session with its active revision (one join), its active
   messages, and the sizes of its last few revisions, in one read snapshot.
3. :func:`commit_swap` or :func:`commit_failure`: everything the job writes at its end,
   under the session's row lock: the revision (compare-and-swap), the session's figures,
   the breaker, the lease release, the queue marker and the run row.

``db/store.py`` owns the transactions; these functions never commit. Statements are built
the same way every call, so SQLAlchemy's compiled cache serves them after the first job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Table,
    and_,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)

from db.errors import LeaseLost, RevisionConflict, SessionNotFound
from db.models import INSTRUCTION_ROLES, MessageRow, RevisionRow, SessionRow
from db.queries import insert_run, iterate_active_texts, json_text_value
from db.records import (
    BreakerUpdate,
    JobMessage,
    JobSnapshot,
    MessageText,
    NewRevision,
    NewRun,
    RevisionRecord,
    RevisionSizes,
    SessionState,
)

_SESSIONS: Table = SessionRow.__table__  # type: ignore[assignment]
_REVISIONS: Table = RevisionRow.__table__  # type: ignore[assignment]
_MESSAGES: Table = MessageRow.__table__  # type: ignore[assignment]
_SESSION_COLUMNS = tuple(_SESSIONS.c)
# The active revision's columns in the snapshot's join, prefixed apart from the session's.
_REVISION_LABELS = tuple(column.label(f"revision_{column.name}") for column in _REVISIONS.c)
CLOSED = BreakerUpdate(state="closed", failures=0, opened_at=None)


def take_lease(connection: Connection, session_id: str, owner: str, ttl_s: float,
               now: datetime, *, take_over: str | None = None) -> SessionState | None:
    """Take or renew the lease and return the session row as it now is; None when another
    owner holds an unexpired lease. ``take_over`` also takes a lease whose owner ends
    with ``":" + take_over`` (an earlier delivery of the same message, lost with its
    worker). SessionNotFound when the session does not exist."""
    if ttl_s <= 0:
        raise ValueError(f"ttl_s must be positive, got {ttl_s}")
    free = [_SESSIONS.c.lease_owner.is_(None), _SESSIONS.c.lease_owner == owner,
            _SESSIONS.c.lease_expires_at <= now]
    if take_over is not None:
        free.append(_SESSIONS.c.lease_owner.endswith(f":{take_over}", autoescape=True))
    row = connection.execute(
        update(_SESSIONS)
        .where(_SESSIONS.c.session_id == session_id, or_(*free))
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=ttl_s))
        .returning(*_SESSION_COLUMNS)
    ).first()
    if row is not None:
        return to_session_state(row)
    _check_exists(connection, session_id)
    return None


def read_snapshot(connection: Connection, session_id: str, *, history: int,
                  to_message: Callable[[MessageText], JobMessage]) -> JobSnapshot[JobMessage]:
    """Read the session, its active revision, its active messages (each converted by
    ``to_message`` as its row is fetched) and the sizes of its ``history`` newest
    revisions (never their summaries); run it in a read snapshot."""
    row = connection.execute(
        select(*_SESSION_COLUMNS, *_REVISION_LABELS)
        .select_from(_SESSIONS.outerjoin(
            _REVISIONS, _REVISIONS.c.id == _SESSIONS.c.active_revision_id))
        .where(_SESSIONS.c.session_id == session_id)
    ).first()
    if row is None:
        raise SessionNotFound(f"no session {session_id!r}")
    mapping = row._mapping
    revision = None if mapping["revision_id"] is None else RevisionRecord(
        session_id=session_id,
        **{c.name: mapping[f"revision_{c.name}"] for c in _REVISIONS.c if c.name != "session_id"},
    )
    recent: tuple[RevisionSizes, ...] = ()
    if history > 0:
        sizes = connection.execute(
            select(_REVISIONS.c.projection_tokens_before, _REVISIONS.c.projection_tokens_after)
            .where(_REVISIONS.c.session_id == mapping["id"])
            .order_by(_REVISIONS.c.id.desc())
            .limit(history)
        )
        recent = tuple(RevisionSizes(before, after) for before, after in sizes)
    through_seq = revision.through_seq if revision else 0
    messages = [to_message(text)
                for text in iterate_active_texts(connection, mapping["id"], through_seq)]
    return JobSnapshot(session=to_session_state(row), revision=revision, messages=messages,
                       recent_revisions=recent)


def commit_swap(
    connection: Connection, session_id: str, *, expected_revision_id: int | None,
    lease_owner: str | None, revision: NewRevision, run: NewRun, now: datetime,
    breaker: BreakerUpdate | None = None, release_lease: bool = False,
    queue_job_id: str | None = None,
) -> int:
    """Compare-and-swap the active revision and record the run; with ``release_lease``
    also release ``lease_owner``'s lease, and clear the queue marker if it is still
    ``queue_job_id``'s. Return the revision id.

    Four statements under the row lock: the lock (with the parent's bounds), the revision
    (its projection size measured by the INSERT itself), the session, the run.
    """
    if run.session_id != session_id:
        raise ValueError(f"run is for {run.session_id!r}, not {session_id!r}")
    parent_through_seq = (
        select(_REVISIONS.c.through_seq)
        .where(_REVISIONS.c.id == _SESSIONS.c.active_revision_id)
        .scalar_subquery()
    )
    locked = connection.execute(
        select(_SESSIONS.c.id, _SESSIONS.c.head_seq, _SESSIONS.c.active_revision_id,
               _SESSIONS.c.lease_owner, _SESSIONS.c.lease_expires_at,
               _SESSIONS.c.queued_job_id, parent_through_seq.label("parent_through_seq"))
        .where(_SESSIONS.c.session_id == session_id)
        .with_for_update(of=_SESSIONS)
    ).first()
    if locked is None:
        raise SessionNotFound(f"no session {session_id!r}")
    _check_lease(session_id, locked.lease_owner, locked.lease_expires_at, lease_owner, now)
    if locked.active_revision_id != expected_revision_id:
        raise RevisionConflict(f"session {session_id!r}: active revision is "
                               f"{locked.active_revision_id}, expected {expected_revision_id}")
    _check_bounds(session_id, locked.parent_through_seq or 0, locked.head_seq, revision)
    revision_id, projection_tokens = _insert_revision(connection, locked.id, revision,
                                                      expected_revision_id, now)
    breaker = breaker or CLOSED
    values: dict[str, Any] = {
        "active_revision_id": revision_id, "projection_tokens": projection_tokens,
        "tokens_since_compaction": _tokens_where(_MESSAGES.c.seq > revision.snapshot_head_seq,
                                                 locked.id),
        "last_compacted_at": now, "breaker_state": breaker.state,
        "breaker_failures": breaker.failures, "breaker_opened_at": breaker.opened_at,
    }
    if release_lease:
        values |= {"lease_owner": None, "lease_expires_at": None}
    if queue_job_id is not None and locked.queued_job_id == queue_job_id:
        values |= {"queued_at": None, "queued_job_id": None}
    connection.execute(update(_SESSIONS).where(_SESSIONS.c.id == locked.id).values(values))
    insert_run(connection, run, revision_id=revision_id)
    return revision_id


def commit_failure(connection: Connection, run: NewRun, *, breaker: BreakerUpdate | None,
                   lease_owner: str | None, queue_job_id: str | None = None) -> int:
    """Record a run, and for its session (ignored when unknown) in one UPDATE: set the
    breaker, release ``lease_owner``'s lease, clear ``queue_job_id``'s queue marker.
    Return the run id."""
    run_id = insert_run(connection, run, revision_id=run.revision_id)
    values: dict[str, Any] = {}
    if breaker is not None:
        values |= {"breaker_state": breaker.state, "breaker_failures": breaker.failures,
                   "breaker_opened_at": breaker.opened_at}
    if lease_owner is not None:
        owned = _SESSIONS.c.lease_owner == lease_owner
        values |= {"lease_owner": case((owned, None), else_=_SESSIONS.c.lease_owner),
                   "lease_expires_at": case((owned, None), else_=_SESSIONS.c.lease_expires_at)}
    if queue_job_id is not None:
        queued = _SESSIONS.c.queued_job_id == queue_job_id
        values |= {"queued_at": case((queued, None), else_=_SESSIONS.c.queued_at),
                   "queued_job_id": case((queued, None), else_=_SESSIONS.c.queued_job_id)}
    if values:
        connection.execute(
            update(_SESSIONS).where(_SESSIONS.c.session_id == run.session_id).values(values))
    return run_id


def to_session_state(row: Row[Any]) -> SessionState:
    """The session's record from a Core row of its table's columns."""
    m = row._mapping
    return SessionState(
        session_id=m["session_id"], metadata=m["metadata"], head_seq=m["head_seq"],
        active_revision_id=m["active_revision_id"], total_tokens=m["total_tokens"],
        projection_tokens=m["projection_tokens"],
        tokens_since_compaction=m["tokens_since_compaction"], created_at=m["created_at"],
        last_appended_at=m["last_appended_at"], last_compacted_at=m["last_compacted_at"],
        lease_owner=m["lease_owner"], lease_expires_at=m["lease_expires_at"],
        breaker_state=m["breaker_state"], breaker_failures=m["breaker_failures"],
        breaker_opened_at=m["breaker_opened_at"], queued_at=m["queued_at"],
        queued_job_id=m["queued_job_id"],
    )


def _insert_revision(connection: Connection, session_pk: int, revision: NewRevision,
                     parent_id: int | None, now: datetime) -> tuple[int, int]:
    """INSERT ... SELECT the revision with its projection size summed from the messages
    in the same statement (under the row lock no append can commit meanwhile)."""
    covered_instructions = and_(_MESSAGES.c.seq <= revision.through_seq,
                                _MESSAGES.c.role.in_(INSTRUCTION_ROLES))
    kept = or_(covered_instructions, _MESSAGES.c.seq > revision.through_seq)
    projection = literal(revision.block_tokens) + func.coalesce(
        func.sum(case((kept, _MESSAGES.c.tokens), else_=0)), 0)
    constants = {
        "session_id": session_pk, "parent_revision_id": parent_id,
        "through_seq": revision.through_seq, "snapshot_head_seq": revision.snapshot_head_seq,
        "summary": revision.summary, "block": revision.block,
        "block_tokens": revision.block_tokens,
        "summary_tokens": revision.summary_tokens, "span_tokens": revision.span_tokens,
        "projection_tokens_before": revision.projection_tokens_before,
        "model": revision.model, "prompt_version": revision.prompt_version,
        "summarizer": revision.summarizer, "created_at": now,
    }
    columns = [*constants, "artifacts", "projection_tokens_after"]
    source = select(
        *(literal(value, _REVISIONS.c[name].type) for name, value in constants.items()),
        json_text_value(revision.artifacts_json, _REVISIONS.c.artifacts,
                        connection.dialect.name),
        projection,
    ).where(_MESSAGES.c.session_id == session_pk)
    created = connection.execute(
        insert(_REVISIONS).from_select(columns, source)
        .returning(_REVISIONS.c.id, _REVISIONS.c.projection_tokens_after)
    ).one()
    return int(created.id), int(created.projection_tokens_after)


def _tokens_where(condition: ColumnElement[bool], session_pk: int) -> Any:
    """A scalar subquery: the tokens of the session's messages that meet ``condition``."""
    return (
        select(func.coalesce(func.sum(_MESSAGES.c.tokens), 0))
        .where(_MESSAGES.c.session_id == session_pk, condition)
        .scalar_subquery()
    )


def _check_exists(connection: Connection, session_id: str) -> None:
    found = connection.execute(
        select(_SESSIONS.c.id).where(_SESSIONS.c.session_id == session_id)).first()
    if found is None:
        raise SessionNotFound(f"no session {session_id!r}")


def _check_lease(session_id: str, holder: str | None, expires_at: datetime | None,
                 owner: str | None, now: datetime) -> None:
    if owner is None:
        return
    if holder != owner or expires_at is None or expires_at <= now:
        raise LeaseLost(f"session {session_id!r}: lease is held by {holder!r} until "
                        f"{expires_at}, not by {owner!r}")


def _check_bounds(session_id: str, floor_seq: int, head_seq: int,
                  revision: NewRevision) -> None:
    """Refuse a revision that would un-summarize its parent's span or see the future."""
    if not floor_seq <= revision.through_seq <= revision.snapshot_head_seq <= head_seq:
        raise ValueError(
            f"session {session_id!r}: need parent through_seq {floor_seq} <= through_seq "
            f"{revision.through_seq} <= snapshot_head_seq {revision.snapshot_head_seq} <= "
            f"head_seq {head_seq}"
        )
