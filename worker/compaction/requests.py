"""What the user asked in a span, read from plain language: the goal as it stands now
(the first request of the latest conversation), the requests answered, the one still open.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from worker.compaction.messages import Role, StoredMessage

MAX_ANSWERED = 4

REQUEST = re.compile(
    r"\?|(?i:\b(?:i want|i'd like|i would like|i need|i'm looking|i am looking|looking to|"
    r"trying to|help me|can you|could you|please)\b)"
)
# A joined session marks where one conversation ends and an unrelated one starts; a
# greeting or a finished exchange ("###STOP###") starts one too.
_BOUNDARY = re.compile(
    r"(?i:conversation has ended|session boundary|new (?:customer|conversation|task)\b"
    r"|next task\b)"
)
_GREETING = re.compile(r"(?i:\A\W*(?:hi|hello|hey|good (?:morning|afternoon|evening))\b)")
_STOP = "###STOP###"


@dataclass(frozen=True, slots=True)
class RequestLedger:
    """The span's user and agent texts, its current goal ("" when the span starts no
    conversation and a prior goal stands), answered requests (newest last), open ones."""

    user_texts: tuple[str, ...]
    agent_texts: tuple[str, ...]
    goal: str
    answered: tuple[str, ...]
    open_requests: tuple[str, ...]


def read_requests(messages: Sequence[StoredMessage], *, has_prior_goal: bool) -> RequestLedger:
    """Read the span's requests; ``has_prior_goal`` keeps a prior goal unless the span
    starts a new conversation."""
    user_texts = tuple(m.message.text for m in messages if m.message.role is Role.USER)
    agent_texts = tuple(m.message.text for m in messages if m.message.role is Role.ASSISTANT)
    answered: list[str] = []
    current: str | None = None
    for stored in messages:
        text = stored.message.text
        if stored.message.role is Role.USER and REQUEST.search(text) \
                and not _BOUNDARY.search(text):
            current = text
        elif stored.message.role is Role.ASSISTANT and text.strip() and current is not None:
            answered.append(current)  # the agent answered
            current = None
    return RequestLedger(user_texts, agent_texts, _find_goal(user_texts, has_prior_goal),
                         tuple(answered[-MAX_ANSWERED:]),
                         () if current is None else (current,))


def _find_goal(user_texts: Sequence[str], has_prior_goal: bool) -> str:
    """The first request of the latest conversation the span starts ("" if none starts)."""
    start: int | None = None if has_prior_goal else 0
    for index, text in enumerate(user_texts):
        if _BOUNDARY.search(text):
            start = index + 1
        elif _GREETING.match(text) or (index and _STOP in user_texts[index - 1]):
            start = index
    if start is None:
        return ""
    conversation = [t for t in user_texts[start:] if t.strip() and not _BOUNDARY.search(t)]
    substantive = [t for t in conversation if len(t.split()) >= 3]
    requests = [t for t in substantive if REQUEST.search(t)]
    return (requests or substantive or conversation or [""])[0].replace(_STOP, "").strip()
