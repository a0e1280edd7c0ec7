"""Sessions the benchmarks compact: tool-heavy coding-agent sessions of any size (the
demo generator's sessions joined end to end, as the corpus builds its long ones), the
corpus's largest, and their import into a store with every message counted once."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from db import NewMessage, Store
from scheduler.cli.demo_sessions import generate_sessions
from tests.support.corpus import corpus_path, load_corpus
from tests.support.wire_convert import chat_to_anthropic, chat_to_responses
from worker.compaction import IntakePolicy, SessionFormat
from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.platform.formats import check_items, count_system_prompt, item_rows
from worker.platform.ingest import count_messages
from worker.tokenizer.offline import load_encoding

# Imported sessions were last appended to long ago: no quiet-period effects.
IMPORTED_AGO = timedelta(days=1)
# A session sized in its own format is regenerated from a shorter conversation until it
# is within this share above its target (a conversation grows a user turn at a time).
SIZE_TOLERANCE = 0.03
SIZING_ROUNDS = 3


@dataclass(frozen=True)
class BenchSession:
    """A session's messages as store rows, with its size in tokens and JSON bytes."""

    name: str
    rows: tuple[NewMessage, ...]
    session_format: SessionFormat = SessionFormat.CHAT
    metadata: dict[str, Any] | None = None  # an Anthropic session's system prompt
    system_tokens: int = 0  # that prompt's tokens (sessions.system_tokens)

    @property
    def tokens(self) -> int:
        return sum(row.tokens for row in self.rows)

    @property
    def json_bytes(self) -> int:
        """Size of the session's messages as compact JSON (its raw size)."""
        return len(json.dumps([row.body for row in self.rows], ensure_ascii=False,
                              separators=(",", ":")).encode())


def new_counter() -> TokenCounter:
    return TokenCounter(load_encoding())


def tool_heavy_messages(target_tokens: int, counter: TokenCounter, *, seed: int = 1,
                        with_system: bool = True) -> list[dict[str, Any]]:
    """Join demo sessions (system prompt once) until ``target_tokens`` are reached.

    The result ends where a user turn would begin, so never inside a tool call.
    """
    messages: list[dict[str, Any]] = []
    total = 0
    index = 0
    while True:
        index += 1
        [record] = generate_sessions(1, seed * 100_000 + index)
        for message in record["messages"]:
            if message["role"] == "user" and total >= target_tokens:
                return messages
            if message["role"] == "system" and (messages or not with_system):
                continue
            messages.append(message)
            total += counter.count_message(parse_message(message))


def generated_session(target_tokens: int, counter: TokenCounter, *, seed: int = 1,
                      with_system: bool = True,
                      session_format: SessionFormat = SessionFormat.CHAT,
                      sized_in_format: bool = False) -> BenchSession:
    """A tool-heavy session of at least ``target_tokens`` tokens (of chat messages), in
    ``session_format``: its Responses or Anthropic equivalent, reasoning or thinking
    added (``tests/support/wire_convert.py``). With ``sized_in_format``, the tokens are
    the rewritten session's (a shorter conversation), so formats compare at one size."""
    session = _rewritten_session(target_tokens, counter, seed, with_system, session_format)
    for _ in range(SIZING_ROUNDS if sized_in_format else 0):
        if session.tokens <= target_tokens * (1 + SIZE_TOLERANCE):
            break
        chat_tokens = round(target_tokens * target_tokens / session.tokens)
        session = _rewritten_session(chat_tokens, counter, seed, with_system, session_format)
    return BenchSession(f"generated-{target_tokens}", session.rows, session.session_format,
                        session.metadata)


def _rewritten_session(chat_tokens: int, counter: TokenCounter, seed: int, with_system: bool,
                       session_format: SessionFormat) -> BenchSession:
    messages = tool_heavy_messages(chat_tokens, counter, seed=seed, with_system=with_system)
    name = f"generated-{chat_tokens}"
    if session_format is SessionFormat.CHAT:
        return BenchSession(name, tuple(to_rows(messages, counter)))
    metadata = None
    if session_format is SessionFormat.RESPONSES:
        items = chat_to_responses(messages, seed=seed)
    else:
        system, items = chat_to_anthropic(messages, seed=seed)
        metadata = {"system": system}
    checked = check_items(session_format, items, IntakePolicy.strict())
    if checked.rejected:
        raise ValueError(f"the {session_format} rewrite was refused: {checked.problems[:3]}")
    return BenchSession(name, tuple(item_rows(session_format, checked, counter)),
                        session_format, metadata,
                        count_system_prompt(session_format, metadata or {}, counter))


def largest_corpus_session(counter: TokenCounter, name: str = "dev_long") -> BenchSession | None:
    """The corpus file's largest session (by JSON size); None where the corpus is absent."""
    if not corpus_path(name).is_file():
        return None
    record = max(load_corpus(name), key=lambda r: len(json.dumps(r["messages"])))
    return BenchSession(str(record["session_id"]), tuple(to_rows(record["messages"], counter)))


def smallest_corpus_session(counter: TokenCounter, name: str = "dev_long") -> BenchSession | None:
    """The corpus file's smallest session; None where the corpus is absent."""
    if not corpus_path(name).is_file():
        return None
    record = min(load_corpus(name), key=lambda r: len(json.dumps(r["messages"])))
    return BenchSession(str(record["session_id"]), tuple(to_rows(record["messages"], counter)))


def to_rows(messages: Iterable[dict[str, Any]], counter: TokenCounter) -> list[NewMessage]:
    return count_messages([parse_message(m) for m in messages], counter)


def import_copies(store: Store, session: BenchSession, session_ids: Sequence[str]) -> None:
    """Store ``session`` under each id (counted once, so copies cost only the inserts)."""
    now = datetime.now(UTC) - IMPORTED_AGO
    metadata = {"bench": session.name, **(session.metadata or {})}
    for session_id in session_ids:
        store.import_session(session_id, metadata, list(session.rows), now,
                             session_format=session.session_format.value,
                             system_tokens=session.system_tokens)


def append_rows(store: Store, session_id: str, rows: Sequence[NewMessage]) -> None:
    """Append rows to a stored session, as the platform would."""
    store.append_messages(session_id, list(rows), now=datetime.now(UTC) - IMPORTED_AGO)
