"""The per-session artifact index: one row per identifier, upserted in the transaction
that stores the messages mentioning it, and read back as ``ArtifactRecord`` values."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from db.models import SOURCE_BITS, ArtifactRow
from db.records import ArtifactRecord, StoredMention


def upsert_artifacts(
    session: Session, session_pk: int, mentions: Iterable[tuple[int, Sequence[StoredMention]]]
) -> None:
    """Fold ``(seq, mentions)`` of new messages, in seq order, into the session's rows."""
    rows: dict[str, dict[str, Any]] = {}
    for seq, found in mentions:
        for value, kind, source, count in found:
            row = rows.get(value)
            if row is None:
                rows[value] = {"session_id": session_pk, "value": value, "kind": kind,
                               "first_seq": seq, "last_seq": seq, "count": count,
                               "sources": SOURCE_BITS.get(source, 0)}
                continue
            row["last_seq"] = seq
            row["count"] += count
            row["sources"] |= SOURCE_BITS.get(source, 0)
    if not rows:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(ArtifactRow)
    table = ArtifactRow.__table__.c
    # Appends come in seq order under the session's row lock: the new last_seq is later.
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[table.session_id, table.value],
            set_={"last_seq": statement.excluded.last_seq,
                  "count": table.count + statement.excluded.count,
                  "sources": table.sources.op("|")(statement.excluded.sources)},
        ),
        list(rows.values()),
    )


def select_artifacts(session: Session, session_pk: int, *, limit: int) -> list[ArtifactRecord]:
    """Return the session's identifiers, most frequent first."""
    rows = session.scalars(
        select(ArtifactRow).where(ArtifactRow.session_id == session_pk)
        .order_by(ArtifactRow.count.desc(), ArtifactRow.first_seq).limit(limit)
    )
    return [ArtifactRecord(row.value, row.kind, row.first_seq, row.last_seq, row.count,
                           frozenset(name for name, bit in SOURCE_BITS.items()
                                     if row.sources & bit))
            for row in rows]
