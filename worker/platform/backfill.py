"""The backfill: identifiers and search text for messages stored before ingest computed
them (migration 0003), so jobs rank them and recall finds them; their tool results'
outcomes for messages stored before ingest classified them (migration 0010), so no job
classifies them again; and the count of an Anthropic session's system prompt stored
before sessions kept it (migration 0009), so its totals and the trigger include it.
Idempotent: only messages never indexed or classified and prompts never counted are
read, and each is written once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

# Intake and the core load when a backfill runs: `compactor db --help` shows the
# default below without them.
if TYPE_CHECKING:
    from db import IndexedMessage, UnindexedMessage
    from worker.compaction import SessionFormat, TokenCounter
    from worker.platform.ingest import IngestStore

    class BackfillStore(IngestStore, Protocol):
        """The store as the backfill uses it (``db.Store``)."""

        def unindexed_messages(self, session_id: str, *, limit: int
                               ) -> list[UnindexedMessage]: ...

        def index_messages(self, session_id: str, indexed: list[IndexedMessage]) -> int: ...

        def set_system_tokens(self, session_id: str, system_tokens: int) -> int: ...

DEFAULT_BATCH_MESSAGES = 500


@dataclass(frozen=True)
class BackfillReport:
    """What one backfill wrote: sessions whose messages it indexed or classified,
    messages indexed or classified, and system prompts counted."""

    sessions: int
    messages: int
    system_prompts: int = 0


def backfill(store: BackfillStore, counter: TokenCounter, *,
             batch_messages: int = DEFAULT_BATCH_MESSAGES,
             on_batch: Callable[[int], None] | None = None) -> BackfillReport:
    """Index and classify every message of every session stored before ingest did, one
    batch per transaction, with ``counter`` counting its identifiers' summary lines as
    ingest does; ``on_batch`` hears how many each batch wrote (a progress display)."""
    from worker.platform.ingest import iter_session_ids

    sessions = messages = system_prompts = 0
    for session_id in iter_session_ids(store):
        written = sum(_report(count, on_batch) for count in
                      _backfill_session(store, counter, session_id, batch_messages))
        sessions += int(written > 0)
        messages += written
        system_prompts += _count_system_prompt(store, counter, session_id)
    return BackfillReport(sessions, messages, system_prompts)


def _count_system_prompt(store: BackfillStore, counter: TokenCounter, session_id: str) -> int:
    """Count a system prompt stored uncounted (1), else nothing (0); a prompt that is no
    string nor text blocks (created before ``create`` checked it) stays uncounted."""
    from worker.compaction import SessionFormat
    from worker.platform.formats import count_system_prompt, system_prompt_problem

    state = store.get_session(session_id)
    session_format = SessionFormat(state.session_format)
    if state.system_tokens or system_prompt_problem(session_format, state.metadata):
        return 0
    tokens = count_system_prompt(session_format, state.metadata, counter)
    return int(tokens > 0 and store.set_system_tokens(session_id, tokens) != 0)


def _backfill_session(store: BackfillStore, counter: TokenCounter, session_id: str,
                      batch_messages: int) -> Iterator[int]:
    from worker.compaction import SessionFormat

    session_format = SessionFormat(store.get_session(session_id).session_format)
    while batch := store.unindexed_messages(session_id, limit=batch_messages):
        line_counter = counter.for_job()  # a batch's messages share many values
        indexed = [index_message(session_format, message, line_counter) for message in batch]
        yield store.index_messages(session_id, indexed)
        if len(batch) < batch_messages:
            return


def index_message(session_format: SessionFormat, message: UnindexedMessage,
                  counter: TokenCounter) -> IndexedMessage:
    """Compute what a stored message lacks of what ingest computes, as ingest would have."""
    from db import IndexedMessage
    from worker.platform.formats import index_stored_body

    identifiers, text, outcomes = index_stored_body(
        session_format, message.body, counter, with_identifiers=message.needs_identifiers,
        with_outcomes=message.needs_outcomes)
    return IndexedMessage(message.seq, identifiers, text, outcomes)


def _report(count: int, on_batch: Callable[[int], None] | None) -> int:
    if on_batch is not None:
        on_batch(count)
    return count
