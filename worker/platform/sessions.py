"""The platform's door: create sessions, append messages, read what a model is sent.

A small, stable face over the store for an agent platform in Python::

    from worker.platform.sessions import SessionsAPI

    with SessionsAPI.open("postgresql://app@db/compactor") as sessions:
        sessions.create("chat-42", metadata={"user": "u1"})
        sessions.append("chat-42", [{"role": "user", "content": "Hi"}])
        reply = client.chat.completions.create(model=..., messages=sessions.projection("chat-42"))

One ``SessionsAPI`` per process, shared by its threads: it holds one engine (a pool) and
the immutable policy and tokenizer, nothing else. Every method is one transaction; errors
are the store's (``SessionNotFound``, ``SessionExists``, ``SchemaMissing``,
``StoreUnavailable``, all ``StoreError``) and intake's ``MessagesRejected``, all importable
from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from db import (
    ArtifactRecord,
    DeletedSession,
    MessagePinned,
    MessageRecord,
    RevisionRecord,
    SchemaMissing,
    SessionExists,
    SessionLeased,
    SessionNotFound,
    SessionState,
    StoreError,
    StoreUnavailable,
)
from worker.compaction import (
    Action,
    IntakePolicy,
    Problem,
    ProblemKind,
    SessionFormat,
    TokenCounter,
)
from worker.errors import MessagesRejected
from worker.platform.ingest import (
    AppendReport,
    append_checked,
    check_session_id,
    count_checked_system_prompt,
)
from worker.tokenizer.offline import load_encoding

if TYPE_CHECKING:
    from db import Store

__all__ = [
    "Action",
    "AppendReport",
    "ArtifactRecord",
    "DeletedSession",
    "IntakePolicy",
    "MessagePinned",
    "MessageRecord",
    "MessagesRejected",
    "Problem",
    "ProblemKind",
    "RevisionRecord",
    "SchemaMissing",
    "SessionExists",
    "SessionFormat",
    "SessionLeased",
    "SessionNotFound",
    "SessionState",
    "SessionsAPI",
    "StoreError",
    "StoreUnavailable",
]


class SessionsAPI:
    """Sessions of one database, checked on the way in like ``compactor import``."""

    def __init__(
        self, store: Store, counter: TokenCounter, policy: IntakePolicy | None = None
    ) -> None:
        self._store = store
        self._counter = counter
        self._policy = policy or IntakePolicy()

    @classmethod
    def open(
        cls, url: str, *, policy: IntakePolicy | None = None, encoding: str = "o200k_base",
        tiktoken_cache_dir: Path | None = None, sqlite_busy_timeout_ms: int = 10_000,
    ) -> SessionsAPI:
        """Open the database at ``url`` (migrated with ``compactor db upgrade``).

        ``encoding`` must be the workers' (``COMPACTOR_TOKENIZER_ENCODING``): stored token
        counts drive their scheduling. Raises SchemaMissing on an unmigrated database.
        """
        from db import Store  # SQLAlchemy loads when a store is opened, not on import

        counter = TokenCounter(load_encoding(encoding, tiktoken_cache_dir))
        store = Store.from_url(url, sqlite_busy_timeout_ms=sqlite_busy_timeout_ms)
        try:
            store.check_schema()
        except StoreError:
            store.close()
            raise
        return cls(store, counter, policy)

    def close(self) -> None:
        """Close the pool's connections; the instance is unusable afterwards."""
        self._store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def create(self, session_id: str, metadata: dict[str, Any] | None = None, *,
               session_format: SessionFormat = SessionFormat.CHAT) -> SessionState:
        """Create an empty session of ``session_format`` (fixed from then on; an
        Anthropic session's system prompt is its metadata's ``system``, counted in its
        token totals); SessionExists when the id is taken, MessagesRejected when it holds
        a control character or ``system`` is not a string or a list of text blocks."""
        check_session_id(session_id)
        metadata, new_format = metadata or {}, SessionFormat(session_format)
        system_tokens = count_checked_system_prompt(session_id, new_format, metadata,
                                                    self._counter)
        return self._store.create_session(session_id, metadata, datetime.now(UTC),
                                          session_format=new_format.value,
                                          system_tokens=system_tokens)

    def append(
        self, session_id: str, messages: Sequence[dict[str, Any]], *, create: bool = False,
        session_format: SessionFormat | None = None,
    ) -> AppendReport:
        """Check and append items of the session's format in one transaction (chat
        messages, Responses input items or Anthropic messages); return their seqs and
        the problems intake repaired on the way.

        Intake runs under the session's row lock with the import rules and this store's
        policy: results for a call left open by an earlier append are accepted; a result
        for a call already answered is an orphan. ``session_format``, when given, must
        be the session's; ``create`` makes a missing session of it (chat when None).

        Raises:
            MessagesRejected: the policy rejected a problem (``problems``), or the items
                are another format's (``format_mismatch``); nothing stored.
            SessionNotFound: no such session and ``create`` is False.
        """
        return append_checked(
            self._store, self._counter, self._policy, session_id, messages,
            datetime.now(UTC), create=create,
            session_format=None if session_format is None else SessionFormat(session_format),
        )

    def projection(self, session_id: str) -> list[dict[str, Any]]:
        """Return the items to send a model (one query), in the session's format:
        instructions, the summary block when compacted, the recent items verbatim (an
        Anthropic session's system prompt is its metadata's ``system``)."""
        return self._store.projection(session_id)

    def history(self, session_id: str, *, after_seq: int = 0) -> list[MessageRecord]:
        """Return every stored message after ``after_seq``; compaction deletes none."""
        return self._store.messages(session_id, after_seq=after_seq)

    def revisions(self, session_id: str) -> list[RevisionRecord]:
        """Return the session's summary revisions, newest first (rolled back included)."""
        return self._store.revisions(session_id)

    def artifacts(self, session_id: str, *, limit: int = 1000) -> list[ArtifactRecord]:
        """Return the identifiers worth keeping verbatim (paths, ids, URLs, codes...) of
        every message stored, with where they occurred, most frequent first."""
        return self._store.artifacts(session_id, limit=limit)

    def newest(self, session_id: str) -> MessageRecord | None:
        """Return the newest stored message (None: no session, or no message yet)."""
        try:
            head_seq = self._store.get_session(session_id).head_seq
        except SessionNotFound:
            return None
        newest = self._store.messages(session_id, after_seq=max(0, head_seq - 1))
        return newest[-1] if newest else None

    def pop(self, session_id: str, seq: int) -> MessageRecord:
        """Erase message ``seq`` if it is still the newest and no compaction has read it,
        with its search text and its identifiers' part of the artifact index.

        Raises:
            MessagePinned: it is not the newest, or a summary read it (a rolled-back one
                too).
            SessionLeased: a job holds the session's lease, or held it and has not
                released it yet (the reconciler releases a dead job's).
        """
        return self._store.pop_message(session_id, seq=seq, now=datetime.now(UTC))

    def delete(self, session_id: str, *, force: bool = False) -> DeletedSession:
        """Erase the session with its messages, revisions, runs, identifier index and
        queue marker, in one transaction; say what was removed.

        Raises:
            SessionLeased: a job holds the session's lease and ``force`` is False (a
                forced delete makes that job end without writing).
            SessionNotFound: no such session.
        """
        return self._store.delete_session(session_id, force=force, now=datetime.now(UTC))

    def session(self, session_id: str) -> SessionState:
        """Return the session's state (head seq, token totals, active revision)."""
        return self._store.get_session(session_id)
