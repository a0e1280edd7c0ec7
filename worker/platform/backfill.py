"""The backfill: identifiers and search text for messages stored before ingest computed
them (migration 0003), so jobs rank them and recall finds them. Idempotent: only
messages never indexed are read, and each is written once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

# Intake and the core load when a backfill runs: `compactor db --help` shows the
# default below without them.
if TYPE_CHECKING:
    from db import IndexedMessage
    from worker.compaction import TokenCounter
    from worker.platform.ingest import IngestStore

    class BackfillStore(IngestStore, Protocol):
        """The store as the backfill uses it (``db.Store``)."""

        def unindexed_messages(self, session_id: str, *, limit: int
                               ) -> list[tuple[int, Any]]: ...

        def index_messages(self, session_id: str, indexed: list[IndexedMessage]) -> int: ...

DEFAULT_BATCH_MESSAGES = 500


@dataclass(frozen=True)
class BackfillReport:
    """What one backfill wrote: sessions touched and messages indexed."""

    sessions: int
    messages: int


def backfill(store: BackfillStore, counter: TokenCounter, *,
             batch_messages: int = DEFAULT_BATCH_MESSAGES,
             on_batch: Callable[[int], None] | None = None) -> BackfillReport:
    """Index every unindexed message of every session, one batch per transaction, with
    ``counter`` counting its identifiers' summary lines as ingest does; ``on_batch``
    hears how many each batch wrote (a progress display)."""
    from worker.platform.ingest import iter_session_ids

    sessions = messages = 0
    for session_id in iter_session_ids(store):
        written = sum(_report(count, on_batch) for count in
                      _backfill_session(store, counter, session_id, batch_messages))
        sessions += int(written > 0)
        messages += written
    return BackfillReport(sessions, messages)


def _backfill_session(store: BackfillStore, counter: TokenCounter, session_id: str,
                      batch_messages: int) -> Iterator[int]:
    while batch := store.unindexed_messages(session_id, limit=batch_messages):
        line_counter = counter.for_job()  # a batch's messages share many values
        indexed = [index_body(seq, body, line_counter) for seq, body in batch]
        yield store.index_messages(session_id, indexed)
        if len(batch) < batch_messages:
            return


def index_body(seq: int, body: dict[str, Any], counter: TokenCounter) -> IndexedMessage:
    """Compute a stored message's index as ingest would have."""
    from db import IndexedMessage
    from worker.compaction import identify_message, parse_message, search_text

    message = parse_message(body)
    return IndexedMessage(seq, tuple(identify_message(message, counter)),
                          search_text(message))


def _report(count: int, on_batch: Callable[[int], None] | None) -> int:
    if on_batch is not None:
        on_batch(count)
    return count
