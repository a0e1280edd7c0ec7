"""Hypothesis generators of valid stored sessions, shared by the pure core's unit tests.

Sessions hold system prompts, user turns (plain or as content parts), assistant text
(sometimes with reasoning extras), parallel tool calls whose results come back in
shuffled order, mid-session developer messages, huge single messages (worded or one
unbroken run), and optionally a trailing call still waiting for results. Empty and
system-only sessions are drawn too.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from worker.compaction.grouping import Group
from worker.compaction.messages import StoredMessage, parse_message
from worker.compaction.tokens import TokenCounter
from worker.tokenizer.offline import load_encoding

Message = dict[str, Any]

PHRASES = (
    "The customer wants to change the seat on reservation ZFA04Y.",
    "user mia_li_3668 asked for a refund",
    "see /srv/app/config.yaml line 12",
    "error E1042: payment declined",
    "upgraded to v2.3.1 per https://example.com/api/docs",
    '{"status": "ok", "flights": [{"id": "HAT001", "price": 412}]}',
    "{",
    "],",
    "",
    "Sure, let me look that up for you.",
    "Thanks, that is all.",
    "ünïcödé 漢字 and emoji 🛫 survive",
)
TOOL_NAMES = ("get_user_details", "search_flights", "book_reservation", "cancel", "read_file")
_TOOL_NAME = st.sampled_from(TOOL_NAMES)
_PHRASE = st.sampled_from(PHRASES)


@functools.cache
def shared_counter() -> TokenCounter:
    """Load the o200k_base counter once per test process (loading takes most of a second)."""
    return TokenCounter(load_encoding("o200k_base"))


@dataclass(frozen=True)
class _MemoizedCounter(TokenCounter):
    """The same counts; hypothesis redraws the same texts often, so each is counted once."""

    @functools.lru_cache(maxsize=4_096)  # noqa: B019 - one instance lives for the process
    def count_text(self, text: str) -> int:
        return super().count_text(text)


@functools.cache
def _generator_counter() -> TokenCounter:
    return _MemoizedCounter(shared_counter().encoding)


@functools.cache
def huge_texts(min_repeats: int = 500, max_repeats: int = 6_000) -> st.SearchStrategy[str]:
    """Very long single messages: many lines, or one unbroken run of characters."""
    worded = st.builds(
        lambda line, repeats: "\n".join([line] * repeats),
        st.sampled_from([p for p in PHRASES if len(p) > 3]),
        st.integers(min_repeats // 8, max_repeats // 8),
    )
    unbroken = st.builds(
        lambda chunk, repeats: chunk * repeats,
        st.sampled_from(["QUJD", "x", "é漢", "0123456789abcdef"]),
        st.integers(min_repeats, max_repeats),
    )
    return st.one_of(worded, unbroken)


@functools.cache
def _text_pool() -> tuple[list[str], list[str]]:
    """Message texts from empty to ~30k tokens, built once: one draw then picks a text,
    where drawing phrase by phrase made sessions slow to generate."""
    rows = [" ".join(PHRASES[i:i + n]) for n in (1, 2, 3) for i in range(0, len(PHRASES), 2)]
    lines = ["\n".join(PHRASES[: k]) for k in (4, 8, 12)]
    lines += ["\n".join(PHRASES) * repeats for repeats in (10, 40)]
    huge = ["\n".join(PHRASES[:6]) * 400, "\n".join(PHRASES) * 200, "QUJD" * 2_500,
            "x" * 6_000, "é漢" * 3_000, "0123456789abcdef" * 2_000]
    return rows + lines, huge


@functools.cache  # building strategies anew on every draw is slow
def texts(allow_huge: bool) -> st.SearchStrategy[str]:
    """Message texts; with ``allow_huge`` about one in ten is huge."""
    common, huge = _text_pool()
    if not allow_huge:
        return st.sampled_from(common)
    return st.sampled_from(common * 3 + huge)


@st.composite
def _user_message(draw: st.DrawFn, allow_huge: bool) -> Message:
    text = draw(texts(allow_huge))
    if draw(st.booleans()):
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "text", "text": text}]}


@st.composite
def _assistant_text(draw: st.DrawFn, allow_huge: bool) -> Message:
    message: Message = {"role": "assistant", "content": draw(texts(allow_huge))}
    if draw(st.integers(0, 4)) == 0:
        message["reasoning_content"] = draw(_PHRASE)
    return message


@st.composite
def _tool_exchange(
    draw: st.DrawFn, ids: list[int], allow_huge: bool, answered: str = "all"
) -> list[Message]:
    """An assistant message with 1-4 parallel calls, then results in shuffled order.

    ``answered``: "all" results, or "some" (a strict subset, possibly none) for a call
    still pending at the end of a session.
    """
    calls = []
    for _ in range(draw(st.integers(1, 4))):
        ids.append(len(ids))
        arguments = json.dumps({"query": draw(_PHRASE)})
        calls.append({"id": f"call_{ids[-1]}", "type": "function",
                      "function": {"name": draw(_TOOL_NAME),
                                   "arguments": arguments}})
    content = draw(st.one_of(st.none(), _PHRASE))
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": draw(texts(allow_huge))}
        for call in draw(st.permutations(calls))
    ]
    if answered == "some":
        results = results[:draw(st.integers(0, len(results) - 1))]
    return [{"role": "assistant", "content": content, "tool_calls": calls}, *results]


@st.composite
def _turn(draw: st.DrawFn, ids: list[int], allow_huge: bool) -> list[Message]:
    """A user message and the agent's steps that answer it."""
    messages: list[Message] = [draw(_user_message(allow_huge))]
    for _ in range(draw(st.integers(0, 4))):
        step = draw(st.sampled_from(["text", "tools", "tools", "developer"]))
        if step == "text":
            messages.append(draw(_assistant_text(allow_huge)))
        elif step == "tools":
            messages.extend(draw(_tool_exchange(ids, allow_huge)))
        else:
            messages.append({"role": "developer", "content": draw(_PHRASE)})
    return messages


@st.composite
def session_messages(
    draw: st.DrawFn, *, max_turns: int = 10, allow_pending: bool = True, allow_huge: bool = True
) -> list[Message]:
    """A valid session as OpenAI chat message dicts."""
    shape = draw(st.sampled_from(["empty", "system_only", "conversation", "conversation",
                                  "conversation", "conversation"]))
    if shape == "empty":
        return []
    system = [{"role": "system", "content": draw(texts(allow_huge=False))}
              for _ in range(draw(st.integers(1, 2)))]
    if shape == "system_only":
        return system
    ids: list[int] = []
    messages = list(system)
    for _ in range(draw(st.integers(1, max_turns))):
        messages.extend(draw(_turn(ids, allow_huge)))
    if allow_pending and draw(st.booleans()):
        messages.extend(draw(_tool_exchange(ids, allow_huge, answered="some")))
    return messages


def to_stored(
    messages: Sequence[Message], counter: TokenCounter, first_seq: int = 1
) -> list[StoredMessage]:
    """Number messages from ``first_seq`` and cache their token counts, as intake does."""
    stored = []
    for offset, data in enumerate(messages):
        message = parse_message(data)
        stored.append(StoredMessage(first_seq + offset, message, counter.count_message(message)))
    return stored


@st.composite
def sessions(
    draw: st.DrawFn, *, max_turns: int = 10, allow_pending: bool = True, allow_huge: bool = True
) -> list[StoredMessage]:
    """A valid session as stored messages with cached token counts."""
    messages = draw(session_messages(
        max_turns=max_turns, allow_pending=allow_pending, allow_huge=allow_huge
    ))
    return to_stored(messages, _generator_counter(), first_seq=draw(st.integers(1, 1_000)))


def render_plain(group: Group) -> str:
    """Render a group as ``role: text`` lines (calls as ``name(arguments)``), for tests
    that need span text without depending on the prompt module's rendering."""
    lines = []
    for stored in group.messages:
        message = stored.message
        calls = "".join(f" {c.function.name}({c.function.arguments})"
                        for c in message.tool_calls or ())
        lines.append(f"{message.role.value}:{calls} {message.text}")
    return "\n".join(lines) + "\n"


CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"


def drawn_request(rng: random.Random) -> tuple[str, str]:
    """A request of the grammar "<opening> <verb> my <thing> <code> <when>?", and the
    thing and code it names."""
    thing = rng.choice(["reservation", "order", "booking", "ticket"])
    code = "".join(rng.choice(CODE_CHARS) for _ in range(6))
    opening = rng.choice(["Could you please", "Can you", "I would like you to"])
    verb = rng.choice(["rebook", "cancel", "refund", "upgrade"])
    when = rng.choice(["before the weekend", "today", "for my trip next week"])
    return f"{opening} {verb} my {thing} {code} {when}?", f"{thing} {code}"
