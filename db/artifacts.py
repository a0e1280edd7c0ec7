"""The per-session artifact index: one row per identifier, upserted in the transaction
that stores (or backfills) the messages mentioning it, recounted in the one that erases a
message, and read back as ``ArtifactRecord`` values; and the backfill's reads and writes
of messages unindexed or unclassified."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from sqlalchemy import Table, bindparam, case, delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from db.models import SOURCE_BITS, ArtifactRow, MessageRow
from db.records import (
    ArtifactRecord,
    IndexedMessage,
    StoredMention,
    UnindexedMessage,
    encode_outcomes,
)


def upsert_artifacts(
    session: Session, session_pk: int, mentions: Iterable[tuple[int, Sequence[StoredMention]]]
) -> None:
    """Fold ``(seq, mentions)`` of messages just indexed, in seq order, into the
    session's rows (called under the session's row lock)."""
    rows = [{"session_id": session_pk, **row} for row in fold_mentions(mentions).values()]
    if not rows:
        return
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(ArtifactRow)
    table = ArtifactRow.__table__.c
    new = statement.excluded
    # A backfill folds in messages older than those already indexed: widen both ends.
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[table.session_id, table.value],
            set_={"first_seq": case((new.first_seq < table.first_seq, new.first_seq),
                                    else_=table.first_seq),
                  "last_seq": case((new.last_seq > table.last_seq, new.last_seq),
                                   else_=table.last_seq),
                  "count": table.count + new.count,
                  "sources": table.sources.op("|")(new.sources)},
        ),
        rows,
    )


def fold_mentions(mentions: Iterable[tuple[int, Sequence[StoredMention]]],
                  only: Collection[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each value's artifact row, by value, folded from ``(seq, mentions)`` in seq order
    (only the values in ``only`` when given)."""
    rows: dict[str, dict[str, Any]] = {}
    for seq, found in mentions:
        for value, kind, source, count, *_ in found:
            if only is not None and value not in only:
                continue
            row = rows.get(value)
            if row is None:
                rows[value] = {"value": value, "kind": kind, "first_seq": seq,
                               "last_seq": seq, "count": count,
                               "sources": SOURCE_BITS.get(source, 0)}
                continue
            row["last_seq"] = seq
            row["count"] += count
            row["sources"] |= SOURCE_BITS.get(source, 0)
    return rows


_ARTIFACTS: Table = ArtifactRow.__table__  # type: ignore[assignment]  # a Table at runtime
_RECOUNT = (update(_ARTIFACTS)
            .where(_ARTIFACTS.c.session_id == bindparam("pk"),
                   _ARTIFACTS.c.value == bindparam("old_value"))
            .values(first_seq=bindparam("first_seq"), last_seq=bindparam("last_seq"),
                    count=bindparam("count"), sources=bindparam("sources")))


def recount_artifacts(session: Session, session_pk: int, values: Collection[str]) -> None:
    """Recount the rows of ``values`` from the session's stored messages, after a message
    mentioning them was erased (under the session's row lock): a value no stored message
    mentions leaves the index, the others keep only what the stored messages say. It
    reads the identifiers of every message of the session: erasing is rare, and a row
    kept from the erased message would point at a seq the next append takes."""
    wanted = set(values)
    if not wanted:
        return
    stored = session.execute(
        select(MessageRow.seq, MessageRow.identifiers)
        .where(MessageRow.session_id == session_pk, MessageRow.identifiers.is_not(None))
        .order_by(MessageRow.seq))
    rows = fold_mentions(((seq, found) for seq, found in stored), only=wanted)
    gone = sorted(wanted - rows.keys())
    if gone:
        session.execute(delete(ArtifactRow).where(ArtifactRow.session_id == session_pk,
                                                  ArtifactRow.value.in_(gone)),
                        execution_options={"synchronize_session": False})
    if rows:
        session.connection().execute(_RECOUNT, [
            {"pk": session_pk, "old_value": row["value"], "first_seq": row["first_seq"],
             "last_seq": row["last_seq"], "count": row["count"], "sources": row["sources"]}
            for row in rows.values()])


def select_artifacts(session: Session, session_pk: int, *, limit: int) -> list[ArtifactRecord]:
    """Return the session's identifiers, most frequent first."""
    rows = session.scalars(
        select(ArtifactRow).where(ArtifactRow.session_id == session_pk)
        .order_by(ArtifactRow.count.desc(), ArtifactRow.first_seq, ArtifactRow.value)
        .limit(limit)
    )
    return [ArtifactRecord(row.value, row.kind, row.first_seq, row.last_seq, row.count,
                           frozenset(name for name, bit in SOURCE_BITS.items()
                                     if row.sources & bit))
            for row in rows]


def select_unindexed(session: Session, session_pk: int, *, limit: int
                     ) -> list[UnindexedMessage]:
    """Return the session's first ``limit`` messages never indexed or never classified."""
    rows = session.execute(
        select(MessageRow.seq, MessageRow.body, MessageRow.identifiers.is_(None),
               MessageRow.outcomes.is_(None))
        .where(MessageRow.session_id == session_pk, _UNINDEXED)
        .order_by(MessageRow.seq).limit(limit)
    )
    return [UnindexedMessage(seq, body, bool(no_identifiers), bool(no_outcomes))
            for seq, body, no_identifiers, no_outcomes in rows]


def count_unindexed(session: Session) -> int:
    """Count the messages of every session that were never indexed or classified."""
    return int(session.scalar(
        select(func.count()).select_from(MessageRow).where(_UNINDEXED)
    ) or 0)


# A message stored before ingest computed its identifiers (0003) or its outcomes (0010).
_UNINDEXED = or_(MessageRow.identifiers.is_(None), MessageRow.outcomes.is_(None))


def write_index(session: Session, session_pk: int, indexed: Sequence[IndexedMessage]) -> int:
    """Store what was computed of messages never indexed or classified (their
    identifiers and search text, their outcomes), each where it is still missing, and
    fold the identifiers into the artifact index; return how many messages were written
    (a concurrent backfill may have written the others)."""
    written: list[IndexedMessage] = []
    for item in indexed:
        values: dict[str, Any] = {}
        missing = []
        if item.identifiers is not None:
            values.update(identifiers=[list(m) for m in item.identifiers],
                          search_text=item.search_text)
            missing.append(MessageRow.identifiers.is_(None))
        if item.outcomes is not None:
            values["outcomes"] = encode_outcomes(item.outcomes)
            missing.append(MessageRow.outcomes.is_(None))
        if not values:
            continue
        changed = session.execute(
            update(MessageRow)
            .where(MessageRow.session_id == session_pk, MessageRow.seq == item.seq, *missing)
            .values(**values)
            .returning(MessageRow.id),
            execution_options={"synchronize_session": False},
        ).first()
        if changed is not None:
            written.append(item)
    upsert_artifacts(session, session_pk, [(i.seq, i.identifiers) for i in written
                                           if i.identifiers is not None])
    return len(written)
