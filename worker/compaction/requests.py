"""What the user asked in a span, read from plain language: the goal as it stands now
(the first request of the latest conversation), the requests answered or acted on (a call
that succeeded followed them), the one still open. Requests are told apart by the seq of
their message: the same words asked twice are two requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.compaction.grouping import Group
from worker.compaction.messages import INSTRUCTION_ROLES, Role, StoredMessage
from worker.compaction.outcomes import CallOutcome, CallStatus
from worker.compaction.parties import BOUNDARY, GREETING, STOP, Party, find_parties
from worker.compaction.sentences import Cue

MAX_ANSWERED = 4

REQUEST = Cue(
    r"\?|\b(?:i want|i'd like|i would like|i need|i'm looking|i am looking|looking to|"
    r"trying to|help me|can you|could you|please)\b"
)


@dataclass(frozen=True, slots=True)
class Ask:
    """One request: the seq of the user's message and its text."""

    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class RequestLedger:
    """The span's user and agent texts, its current goal ("" when the span starts no
    conversation and a prior goal stands), answered requests (newest last; never the
    goal's words while the tail goes on with it), requests acted on (the newest
    ``MAX_ANSWERED`` of the two together), open ones.

    ``settled`` holds every request answered or acted on, by seq: the same words asked
    in an earlier conversation stay settled while the goal that repeats them goes on.
    ``held_open``: the request still open and the goal the tail goes on with."""

    user_texts: tuple[str, ...]
    agent_texts: tuple[str, ...]
    goal: str
    answered: tuple[str, ...]
    open_requests: tuple[str, ...]
    acted_on: tuple[str, ...] = ()
    parties: tuple[Party, ...] = ()
    settled: tuple[Ask, ...] = ()
    held_open: tuple[Ask, ...] = ()


def read_requests(messages: Sequence[StoredMessage], *, has_prior_goal: bool,
                  outcomes: Mapping[str, CallStatus] | None = None,
                  tail_continues: bool = False) -> RequestLedger:
    """Read the span's requests; ``has_prior_goal`` keeps a prior goal unless the span
    starts a new conversation. ``outcomes`` (call id → status): a request a succeeded
    call followed is acted on, not open; ``tail_continues``: the verbatim tail goes on
    with the latest conversation, so its goal is not answered yet."""
    users = [m for m in messages if m.message.role is Role.USER]
    user_texts = tuple(m.message.text for m in users)
    agent_texts = tuple(m.said_text for m in messages if m.message.role is Role.ASSISTANT)
    # Each user text is searched once for the cues the loop and the goal both read.
    asks = [REQUEST.search(text) for text in user_texts]
    boundaries = [BOUNDARY.search(text) for text in user_texts]
    settled: list[tuple[Ask, bool]] = []  # (request, acted on rather than answered)
    current: Ask | None = None
    parties = find_parties(messages)
    # An earlier party's request left open is not the current party's to answer.
    starts = {party.first_seq for party in parties[1:]}
    user_at = -1
    for stored in messages:
        message = stored.message
        if stored.seq in starts:
            current = None
        if message.role is Role.USER:
            user_at += 1
            if asks[user_at] and not boundaries[user_at]:
                current = Ask(stored.seq, user_texts[user_at])
            continue
        if message.role is not Role.ASSISTANT or current is None:
            continue
        if message.text.strip():
            settled.append((current, False))  # the agent answered
            current = None
        elif any((outcomes or {}).get(call.id) is CallStatus.SUCCEEDED
                 for call in message.tool_calls or ()):
            settled.append((current, True))
            current = None
    # A party starts at a user's message: its index among the user texts.
    user_seqs = [m.seq for m in users]
    latest = user_seqs.index(parties[-1].first_seq) if len(parties) > 1 else None
    at = _find_goal(user_texts, has_prior_goal, latest, asks, boundaries)
    goal = Ask(user_seqs[at], _goal_words(user_texts[at])) if at is not None else None
    continued = goal if tail_continues and goal and goal.text else None
    if continued:
        # The goal's words, asked again from it on, are the goal's: not answered yet.
        settled = [(ask, acted) for ask, acted in settled if acted
                   or ask.seq < continued.seq or _goal_words(ask.text) != continued.text]
    # Told by words alone for the summary: the goal's words are never listed as answered.
    shown = [(ask.text, acted) for ask, acted in settled
             if not continued or acted or _goal_words(ask.text) != continued.text]
    newest = shown[-MAX_ANSWERED:]
    return RequestLedger(user_texts, agent_texts, goal.text if goal else "",
                         tuple(text for text, acted in newest if not acted),
                         () if current is None else (current.text,),
                         tuple(text for text, acted in newest if acted), tuple(parties),
                         settled=tuple(ask for ask, _ in settled),
                         held_open=tuple(a for a in (current, continued) if a is not None))


def read_span_requests(span: Sequence[Group], *, has_prior_goal: bool,
                       outcomes: Sequence[CallOutcome], tail_continues: bool) -> RequestLedger:
    """Read the requests of ``span``'s messages (instructions left out): the ledger the
    extractive draft and the truth check share, read once per job."""
    messages = [m for g in span for m in g.messages if m.message.role not in INSTRUCTION_ROLES]
    return read_requests(messages, has_prior_goal=has_prior_goal,
                         outcomes={o.call_id: o.status for o in outcomes},
                         tail_continues=tail_continues)


def continues_conversation(span: Sequence[StoredMessage], tail: Sequence[StoredMessage]
                           ) -> bool:
    """Tell whether ``tail`` goes on with the span's latest conversation: it holds
    messages and its first user words start no new one (no boundary, greeting or stop)."""
    if not tail:
        return False
    said = [m.message.text for m in span if m.message.role is Role.USER and m.message.text]
    if said and STOP in said[-1]:
        return False
    first = next((m.message.text for m in tail
                  if m.message.role is Role.USER and m.message.text.strip()), None)
    return first is None or not (BOUNDARY.search(first) or GREETING.match(first))


def _find_goal(user_texts: Sequence[str], has_prior_goal: bool, latest_party: int | None,
               asks: Sequence[bool], boundaries: Sequence[bool]) -> int | None:
    """The index of the first request of the latest conversation the span starts (None if
    none starts); ``latest_party``: the index of the latest party's first user text, when
    one starts; ``asks`` and ``boundaries``: whether each user text holds a request or a
    boundary."""
    start: int | None = None if has_prior_goal else 0
    for index, text in enumerate(user_texts):
        if boundaries[index]:
            start = index + 1
        elif GREETING.match(text) or (index and STOP in user_texts[index - 1]) \
                or index == latest_party:
            start = index
    if start is None:
        return None
    conversation = [i for i in range(start, len(user_texts))
                    if user_texts[i].strip() and not boundaries[i]]
    substantive = [i for i in conversation if len(user_texts[i].split()) >= 3]
    requests = [i for i in substantive if asks[i]]
    first = requests or substantive or conversation
    return first[0] if first else None


def _goal_words(text: str) -> str:
    return text.replace(STOP, "").strip()
