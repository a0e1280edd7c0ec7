"""The user's facts: every sentence of a user's turn that states a constraint, a preference
or a fact about the user's situation (where they are, their device or plan, a deadline),
however many sentences the turn has and wherever in it the sentence stands.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from worker.compaction.messages import Role, StoredMessage
from worker.compaction.sentences import Cue, Sentences

_DAYS = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
# Word families, not a corpus's phrases: wishes and limits, where the user is, what they
# use or subscribe to, when something must happen.
_FACT = Cue(
    # constraints and preferences
    r"\b(?:prefer(?:red|ably)?|don't want|do not want|don't|do not|doesn't|does not|must|"
    r"only|instead|rather|no later than|not before|not after|at most|at least|without|"
    r"can't|cannot|unable|need to|have to|has to|never|always|avoid|allergic|budget|"
    r"afford|i (?:like|love|hate|dislike)|"
    # where the user is
    r"abroad|overseas|travell?ing|on (?:a )?(?:trip|vacation|holiday)|"
    r"(?:live|living|based|located|staying|moving|relocat\w+) (?:in|at|to|near)|"
    # device, connection, plan, account
    r"phone(?! number)|mobile|cellular|wi-?fi|internet|broadband|roaming|laptop|desktop|computer|"
    r"tablet|ipad|iphone|android|windows|mac ?os|linux|browser|router|modem|device|"
    r"plan|subscription|membership|tier|premium|prepaid|postpaid|contract|"
    # deadlines and times
    r"deadline|due|urgent|asap|as soon as possible|until|till|tomorrow|tonight|"
    rf"this (?:week|weekend|month|morning|afternoon|evening)|next (?:week|month|year|{_DAYS})|"
    rf"(?:by|before|on|after) (?:the )?(?:{_DAYS}|end|noon|midnight|\d)|"
    r"within \d|in \d+ (?:minutes?|hours?|days?|weeks?|months?))\b"
)
# A named place the user is in, at or going to ("in France", "to Lisbon").
_PLACE = re.compile(r"\b(?:in|at|to|from|near) (?:the )?[A-Z][a-z]{2,}")


def is_fact(sentence: str) -> bool:
    """Tell whether a user's sentence states a constraint, a preference or a fact about
    their situation; a question asks for one and states none."""
    if sentence.endswith("?"):
        return False
    return _FACT.search(sentence) or _PLACE.search(sentence) is not None


def find_facts(messages: Sequence[StoredMessage], sentences: Sentences
               ) -> Iterator[tuple[int, str]]:
    """Each fact sentence of the users' turns with its message's seq, in order."""
    for stored in messages:
        if stored.message.role is Role.USER:
            for sentence in sentences[stored.message.text]:
                if is_fact(sentence):
                    yield stored.seq, sentence
