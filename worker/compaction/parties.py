"""Parties in a joined session: where one conversation, or one customer, ends and the next
begins. General signals only: a boundary marker, a greeting after a closing (a farewell, a
finished exchange) that does not say the user is back, a user naming in the first person
an identity of a kind the party gave with another value. Items say whose they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from worker.compaction.messages import ChatMessage, Role, StoredMessage
from worker.compaction.sentences import Cue

# A joined session marks where one conversation ends and an unrelated one starts.
BOUNDARY = Cue(
    r"conversation has ended|session boundary|new (?:customer|conversation|task)\b"
    r"|next task\b"
)
GREETING = re.compile(r"(?i:\A\W*(?:hi|hello|hey|good (?:morning|afternoon|evening))\b)")
STOP = "###STOP###"
# A farewell from either side closes a conversation; a greeting after it opens the next.
_CLOSING = re.compile(
    r"(?i:\b(?:good ?bye|bye|take care|have a (?:\w+ )?(?:day|evening|night|weekend|trip)"
    r"|that's all|that is all|nothing else|glad (?:i|we) could help|thanks for contacting)\b)"
)
# The same party coming back after a farewell ("hi again", "I'm back with the details").
_RETURNING = re.compile(
    r"(?i:\b(?:again|i'm back|i am back|as (?:discussed|promised|agreed|mentioned)"
    r"|following up|it's me)\b)"
)
# Who the user says they are, in the first person: a labelled id or address, or a name
# (asking about another account's id is not saying who one is).
_IDENTITY = re.compile(
    r"(?i:\bmy (?P<kind>user ?id|user ?name|customer (?:id|number)|account (?:id|number)"
    r"|member(?:ship)? (?:id|number)|e-?mail(?: address)?)\b(?:\s+is|\s*[:=#])?\s*)"
    r"(?P<value>[\w.@+-]*\d[\w.@+-]*\w|[\w.+-]+@[\w-]+\.[\w.]+)"
    r"|\b(?i:my name is)\s+(?P<name>[A-Z][\w'-]+(?: [A-Z][\w'-]+)?)"
)

# Words every identity statement holds: most turns hold none and skip the pattern.
_IDENTITY_HINTS = ("my ",)


@dataclass(frozen=True, slots=True)
class Party:
    """One party's stretch of the span: from ``first_seq`` on, who the user said they
    were (``identity``: "" when they did not)."""

    first_seq: int
    identity: str = ""

    def label(self) -> str:
        """How an item says whose it is: the party's first seq and identity (short: a
        joined session's items each carry one)."""
        who = f", {self.identity}" if self.identity else ""
        return f"[party {self.first_seq}{who}] "


def find_parties(messages: Sequence[StoredMessage]) -> list[Party]:
    """The span's parties in order (one when nothing starts another; none for no
    messages)."""
    if not messages:
        return []
    starts: list[int] = [messages[0].seq]
    identities: list[dict[str, str]] = [{}]
    after_boundary = False
    # The user's last turn and the agent's after it: read for a farewell only when a
    # greeting follows (a span has few greetings and many agent turns).
    since: list[ChatMessage] = []
    for stored in messages:
        message = stored.message
        if message.role is Role.ASSISTANT:
            since.append(message)
            continue
        if message.role is not Role.USER:
            continue
        text = message.text
        if not text.strip():
            continue
        said = _identities(text)
        switched = any(identities[-1].get(kind, value) != value for kind, value in said.items())
        greeted = bool(GREETING.match(text)) and not _RETURNING.search(text) \
            and _is_closed(since)
        if (after_boundary or switched or greeted) and stored.seq != starts[-1]:
            starts.append(stored.seq)
            identities.append({})
        after_boundary = BOUNDARY.search(text)
        since = [message]
        for kind, value in said.items():
            identities[-1].setdefault(kind, value)
    return [Party(seq, next(iter(found.values()), ""))
            for seq, found in zip(starts, identities, strict=True)]


def _is_closed(since: Sequence[ChatMessage]) -> bool:
    """Whether the conversation was closed: the user's last turn finished its exchange
    (``STOP``) or said farewell, or the agent did after it."""
    return bool(since) and (STOP in since[0].text
                            or any(_CLOSING.search(message.text) for message in since))


def _identities(text: str) -> dict[str, str]:
    """The identities ``text`` states, by kind; the first of each kind."""
    lowered = text.lower()
    if not any(hint in lowered for hint in _IDENTITY_HINTS):
        return {}
    found: dict[str, str] = {}
    for match in _IDENTITY.finditer(text):
        if match.group("name"):
            found.setdefault("name", match.group("name"))
        else:
            kind = re.sub(r"[\s-]+", "", match.group("kind").casefold())
            found.setdefault(kind, match.group("value"))
    return found


def party_of(parties: Sequence[Party], seq: int) -> Party:
    """The party whose stretch holds ``seq`` (``parties`` in order, at least one)."""
    found = parties[0]
    for party in parties:
        if party.first_seq > seq:
            break
        found = party
    return found
