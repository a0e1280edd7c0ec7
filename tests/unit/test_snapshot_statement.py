"""The one-statement snapshot (PostgreSQL) reads its parts by ``part`` and orders them
itself: SQL promises a ``UNION ALL``'s rows no order, so messages that come out of seq
order are sorted, and the sizes are newest first whatever order they come in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from db import job_transactions as job
from db.records import MessageText, RevisionSizes

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = [str(key) for key in job._SNAPSHOT_POSITIONS]


class FakeRow(tuple[Any, ...]):
    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(KEYS, self, strict=True))


def row(part: int, **values: Any) -> FakeRow:
    return FakeRow(part if key == "part" else values.get(key) for key in KEYS)


class FakeConnection:
    def __init__(self, rows: list[FakeRow]) -> None:
        self.rows = rows

    def execute(self, _statement: Any, _parameters: Any) -> list[FakeRow]:
        return self.rows


def message(seq: int) -> FakeRow:
    return row(job._MESSAGE_PART, message_seq=seq, message_body="{}", message_tokens=seq,
               message_identifiers=None)


def test_rows_out_of_order_still_give_the_messages_in_seq_order_and_sizes_newest_first(
) -> None:
    head = row(job._HEAD_PART, id=1, session_id="s", metadata={}, head_seq=3,
               total_tokens=6, projection_tokens=6, tokens_since_compaction=6,
               created_at=T0, last_appended_at=T0, breaker_state="closed",
               breaker_failures=0)
    sizes = [row(job._SIZE_PART, size_revision_id=revision_id, size_before=before,
                 size_after=after) for revision_id, before, after in ((5, 50, 5), (7, 70, 7))]
    rows = [message(3), sizes[0], message(1), head, sizes[1], message(2)]

    snapshot = job._read_snapshot_in_one_statement(
        FakeConnection(rows), "s", history=2,  # type: ignore[arg-type]  # a fake
        to_message=lambda text: text)

    assert [m.seq for m in snapshot.messages] == [1, 2, 3]
    assert all(isinstance(m, MessageText) for m in snapshot.messages)
    assert snapshot.recent_revisions == (RevisionSizes(70, 7), RevisionSizes(50, 5))
    assert (snapshot.session.session_id, snapshot.session.head_seq, snapshot.revision) == \
        ("s", 3, None)
