"""Recall: the stored messages of a session where a value or phrase appears, found by
the database's own text index (PostgreSQL pg_trgm, SQLite FTS5 trigram; migration 0003).

Both match the query as written, case-insensitively, anywhere in a message's text or
its tool calls, so ``E3283-SCHEMA`` or ``/src/app/main.py`` is found exactly.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

from db.records import RecallHit

MIN_QUERY_CHARS = 3  # a trigram index cannot look up shorter text
EXCERPT_CHARS = 240

_POSTGRESQL = text(
    "SELECT seq, role, search_text FROM messages WHERE session_id = :session_pk "
    "AND search_text ILIKE :pattern ESCAPE '\\' ORDER BY seq LIMIT :limit"
)
_SQLITE = text(
    # CROSS JOIN keeps the FTS lookup as the outer loop (SQLite would otherwise walk the
    # session's messages and run the MATCH once per row).
    "SELECT m.seq, m.role, m.search_text FROM message_search "
    "CROSS JOIN messages AS m ON m.id = message_search.rowid "
    "WHERE message_search MATCH :phrase AND m.session_id = :session_pk "
    "ORDER BY m.seq LIMIT :limit"
)


def check_query(query: str) -> str:
    """Return the query to search for; ValueError when it is too short to index."""
    if len(query.strip()) < MIN_QUERY_CHARS:
        raise ValueError(f"a recall query needs at least {MIN_QUERY_CHARS} characters")
    return query.strip()


def search_messages(session: Session, session_pk: int, query: str, *, limit: int
                    ) -> list[RecallHit]:
    """Return up to ``limit`` messages holding ``query``, in seq order."""
    if session.get_bind().dialect.name == "postgresql":
        escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = session.execute(_POSTGRESQL, {"session_pk": session_pk, "limit": limit,
                                             "pattern": f"%{escaped}%"})
    else:
        phrase = '"' + query.replace('"', '""') + '"'
        rows = session.execute(_SQLITE, {"session_pk": session_pk, "limit": limit,
                                         "phrase": phrase})
    return [RecallHit(seq, role, excerpt(found, query)) for seq, role, found in rows]


def excerpt(found: str, query: str) -> str:
    """The part of ``found`` around the first occurrence of ``query``, on one line."""
    at = max(found.casefold().find(query.casefold()), 0)
    start = max(at - (EXCERPT_CHARS - len(query)) // 2, 0)
    end = min(start + EXCERPT_CHARS, len(found))
    clipped = " ".join(found[start:end].split())
    return ("…" if start else "") + clipped + ("…" if end < len(found) else "")
