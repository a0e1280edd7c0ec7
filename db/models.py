"""The tables: sessions, their messages and identifiers, summary revisions, and job runs.

Messages are append-only and never touched by compaction; a revision summarizes
``seq <= through_seq`` and the session points at its active one. The schema itself is
created by the alembic migrations in ``db/migrations``, never by ``create_all``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    ForeignKey,
    Index,
    MetaData,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from db.types import IdType, JsonData, JsonDocument, KeyString, UTCDateTime

# Names for every constraint, so migrations (and SQLite batch rebuilds) can address them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BREAKER_STATES = ("closed", "open", "half_open")
SUMMARIZER_KINDS = ("llm", "extractive", "fallback")
# A parked job's requests wait for a batch (open), are in one (submitted), or its answers
# are in (answered).
PARK_STATES = ("open", "submitted", "answered")
# Mirrors worker.compaction.formats.SessionFormat (db/ may not import worker/).
SESSION_FORMATS = ("chat", "responses", "anthropic")
# The artifacts table stores an identifier's sources as bits; mirrors
# worker.compaction.identifiers.SOURCES (db/ may not import worker/).
SOURCE_BITS = {"user": 1, "assistant": 2, "tool_argument": 4, "tool_output": 8}
# Recall's text index lives outside the models (migration 0003): PostgreSQL's trigram
# index and SQLite's FTS5 table with its shadow tables; schema comparisons skip them.
SEARCH_OBJECT_PREFIXES = ("message_search", "ix_messages_search_text")
# Mirrors worker.compaction.messages.INSTRUCTION_ROLES (db/ may not import worker/).
INSTRUCTION_ROLES = ("system", "developer")


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


_INSTRUCTION_ROLES_SQL = f"role IN ({_quoted(INSTRUCTION_ROLES)})"
_LEASED_SQL = "lease_owner IS NOT NULL"
_QUEUED_SQL = "queued_job_id IS NOT NULL"


# JSON data whose None is SQL NULL (not JSON null), so "never indexed" is IS NULL.
NullableJsonData = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class SessionRow(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        CheckConstraint(f"breaker_state IN ({_quoted(BREAKER_STATES)})", name="breaker_state"),
        CheckConstraint(f"format IN ({_quoted(SESSION_FORMATS)})", name="format"),
        # The due-session scan's keyset tiers (migration 0002, db/scan.py).
        Index(None, "projection_tokens", "id"),
        Index(None, "tokens_since_compaction", "id"),
        # The reconciler's sweeps read only the sessions holding a lease or a marker
        # (migration 0008, db/reconcile.py).
        Index("ix_sessions_leased", "id", postgresql_where=text(_LEASED_SQL),
              sqlite_where=text(_LEASED_SQL)),
        Index("ix_sessions_queued", "id", postgresql_where=text(_QUEUED_SQL),
              sqlite_where=text(_QUEUED_SQL)),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[str] = mapped_column(KeyString, unique=True)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JsonDocument)
    # The wire format of its messages' bodies, fixed at creation (migration 0006).
    format: Mapped[str] = mapped_column(server_default="chat")
    head_seq: Mapped[int] = mapped_column(default=0)
    active_revision_id: Mapped[int | None] = mapped_column(
        IdType, ForeignKey("revisions.id", use_alter=True)
    )
    # The system prompt kept outside the messages (an Anthropic record's ``system``),
    # counted once at creation (migration 0009); it never changes, and it is counted in
    # total_tokens and projection_tokens, as a chat session's system message is.
    system_tokens: Mapped[int] = mapped_column(server_default="0")
    total_tokens: Mapped[int] = mapped_column(default=0)
    projection_tokens: Mapped[int] = mapped_column(default=0)
    tokens_since_compaction: Mapped[int] = mapped_column(default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_appended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_compacted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_owner: Mapped[str | None]
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    breaker_state: Mapped[str] = mapped_column(default="closed")
    breaker_failures: Mapped[int] = mapped_column(default=0)
    breaker_opened_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    queued_job_id: Mapped[str | None]


class MessageRow(Base):
    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "seq"),
        # The snapshot and projection read a session's instructions below through_seq.
        Index(
            "ix_messages_instructions",
            "session_id",
            "seq",
            postgresql_where=text(_INSTRUCTION_ROLES_SQL),
            sqlite_where=text(_INSTRUCTION_ROLES_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(IdType, ForeignKey("sessions.id"))
    seq: Mapped[int]
    role: Mapped[str]
    tool_call_id: Mapped[str | None]
    body: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    tokens: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Computed by the worker at ingest (NULL: stored before migration 0003, not backfilled).
    identifiers: Mapped[list[list[Any]] | None] = mapped_column(NullableJsonData)
    search_text: Mapped[str | None] = mapped_column(Text)
    # Its tool results' outcomes as JSON text, classified by the worker at ingest (NULL:
    # stored before migration 0010, not backfilled).
    outcomes: Mapped[str | None] = mapped_column(Text)


class ArtifactRow(Base):
    """One identifier of a session, upserted with every append (migration 0003)."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("session_id", "value"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(IdType, ForeignKey("sessions.id"))
    value: Mapped[str] = mapped_column(Text)
    kind: Mapped[str]
    first_seq: Mapped[int]
    last_seq: Mapped[int]
    count: Mapped[int]
    sources: Mapped[int]  # a bit per source, SOURCE_BITS


class RevisionRow(Base):
    __tablename__ = "revisions"
    __table_args__ = (
        CheckConstraint(f"summarizer IN ({_quoted(SUMMARIZER_KINDS)})", name="summarizer"),
        CheckConstraint("through_seq <= snapshot_head_seq", name="through_within_snapshot"),
    )

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(IdType, ForeignKey("sessions.id"), index=True)
    parent_revision_id: Mapped[int | None] = mapped_column(IdType, ForeignKey("revisions.id"))
    through_seq: Mapped[int]
    snapshot_head_seq: Mapped[int]
    summary: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    block: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    block_tokens: Mapped[int]
    artifacts: Mapped[list[dict[str, Any]]] = mapped_column(JsonData)
    summary_tokens: Mapped[int]
    span_tokens: Mapped[int]
    projection_tokens_before: Mapped[int]
    projection_tokens_after: Mapped[int]
    model: Mapped[str | None]
    prompt_version: Mapped[str | None]
    summarizer: Mapped[str]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RunRow(Base):
    __tablename__ = "runs"
    __table_args__ = (Index(None, "session_id", "started_at"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    # The external id, not a foreign key: a run may be for a session that is unknown.
    session_id: Mapped[str] = mapped_column(KeyString)
    task_id: Mapped[str | None]
    attempt: Mapped[int]
    reason: Mapped[str]
    outcome: Mapped[str] = mapped_column(index=True)
    failure_class: Mapped[str | None]
    failure_message: Mapped[str | None] = mapped_column(Text)
    figures: Mapped[dict[str, Any]] = mapped_column(JsonData)
    revision_id: Mapped[int | None] = mapped_column(IdType, ForeignKey("revisions.id"))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ParkedJobRow(Base):
    """A job waiting on the Batch API: what its snapshot read (the active revision and
    head it must still find), the summarizer requests for the batch to come, the batch
    they went into, and the answers batches gave so far (their output or error lines)."""

    __tablename__ = "parked_jobs"
    __table_args__ = (CheckConstraint(f"state IN ({_quoted(PARK_STATES)})", name="state"),)

    id: Mapped[int] = mapped_column(IdType, primary_key=True)
    session_id: Mapped[int] = mapped_column(IdType, ForeignKey("sessions.id"), unique=True)
    revision_id: Mapped[int | None] = mapped_column(IdType)
    head_seq: Mapped[int]
    state: Mapped[str] = mapped_column(index=True)
    requests: Mapped[list[dict[str, Any]]] = mapped_column(JsonData)
    batch_id: Mapped[str | None] = mapped_column(index=True)
    answers: Mapped[dict[str, Any]] = mapped_column(JsonData)
    parked_at: Mapped[datetime] = mapped_column(UTCDateTime)
