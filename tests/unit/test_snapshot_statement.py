"""The one-statement snapshot (PostgreSQL) reads its parts by ``part`` and orders them
itself: SQL promises a ``UNION ALL``'s rows no order, so messages that come out of seq
order are sorted, and the sizes are newest first whatever order they come in."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from db import job_lease
from db import job_snapshot as job
from db.records import MessageText, RevisionSizes

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = [str(key) for key in job.SNAPSHOT_POSITIONS]


def row(part: int, **values: Any) -> tuple[Any, ...]:
    return tuple(part if key == "part" else values.get(key) for key in KEYS)


NO_PROCESSORS = (None,) * len(KEYS)


def message(seq: int, session_format: str = "chat") -> tuple[Any, ...]:
    return row(job.MESSAGE_PART, m_seq=seq, m_body="{}", m_tokens=seq, m_identifiers=None,
               m_outcomes=f'[["c{seq}","failed",["exit code {seq}"]]]', format=session_format)


def test_rows_out_of_order_still_give_the_messages_in_seq_order_and_sizes_newest_first(
) -> None:
    head = row(job.HEAD_PART, id=1, session_id="s", metadata={}, head_seq=3,
               total_tokens=6, projection_tokens=6, tokens_since_compaction=6,
               created_at=T0, last_appended_at=T0, breaker_state="closed",
               breaker_failures=0)
    sizes = [row(job.SIZE_PART, s_id=revision_id, s_before=before,
                 s_after=after) for revision_id, before, after in ((5, 50, 5), (7, 70, 7))]
    rows = [message(3), sizes[0], message(1), head, sizes[1], message(2)]

    snapshot = job.snapshot_from_rows(rows, "s", to_message=lambda text: text,
                                      head_processors=NO_PROCESSORS)

    assert [m.seq for m in snapshot.messages] == [1, 2, 3]
    assert all(isinstance(m, MessageText) for m in snapshot.messages)
    assert [m.outcomes_json for m in snapshot.messages] == [
        f'[["c{seq}","failed",["exit code {seq}"]]]' for seq in (1, 2, 3)]
    assert snapshot.recent_revisions == (RevisionSizes(70, 7), RevisionSizes(50, 5))
    assert (snapshot.session.session_id, snapshot.session.head_seq, snapshot.revision) == \
        ("s", 3, None)


def test_only_the_head_rows_values_go_through_the_processors_of_their_columns() -> None:
    head = row(job.HEAD_PART, id=1, session_id="s", metadata={}, head_seq=1,
               total_tokens=1, projection_tokens=1, tokens_since_compaction=1,
               created_at=T0, breaker_state="closed", breaker_failures=0)
    created = job.SNAPSHOT_POSITIONS["created_at"]
    processors = tuple((lambda value: value.replace(year=2030)) if position == created
                       else None for position in range(len(KEYS)))

    snapshot = job.snapshot_from_rows([head, message(1, "anthropic")], "s",
                                      to_message=lambda text: text, head_processors=processors)

    assert snapshot.session.created_at == T0.replace(year=2030)
    assert snapshot.session.last_appended_at is None  # a NULL is never processed
    assert [(m.body_json, m.session_format) for m in snapshot.messages] == [("{}", "anthropic")]


def test_the_leased_snapshot_names_its_columns_where_the_plain_snapshot_does() -> None:
    # snapshot_from_rows reads both statements' rows by _SNAPSHOT_KEYS' positions.
    for statement in job_lease._LEASED_SNAPSHOT_STATEMENTS.values():
        assert tuple(str(c.key) for c in statement.selected_columns) == job.SNAPSHOT_KEYS
