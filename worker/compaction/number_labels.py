"""Labels for bare numbers: a value of 9-12 digits says nothing alone (an order, an item,
an account, a phone?), so a summary lists it with the word the text put before it and a
name the text gave it beside it: ``order_id 1536995876``, ``item_id 2260101338 (Kettle)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from worker.compaction.grouping import Group

MIN_DIGITS, MAX_DIGITS = 9, 12
# Such a number standing alone in a text: no word character, dot, sign or slash glued to
# it (an order, item, account or phone number, not a piece of a longer code).
BARE_NUMBER = re.compile(rf"(?<![\w.#/+-])\d{{{MIN_DIGITS},{MAX_DIGITS}}}(?![\w.-]*\w)")
# A bare number as a stored mention list names it: ``["1536995876", "id", ...``.
_NUMBER_MENTION = re.compile(rf'\["(\d{{{MIN_DIGITS},{MAX_DIGITS}}})"')
# Looked for this far before the value: a key, a word, "order number is", "#".
_BEFORE_CHARS = 48
_BEFORE = re.compile(
    r"(?P<label>[A-Za-z][A-Za-z_-]*(?:[ _](?:id|number|no|code))?)[\"']?\s*(?:[:=]|\bis\b)?"
    r"\s*[\"']?#?\s*\Z", re.IGNORECASE)
# Words that stand before a number without naming it.
_NOT_LABELS = frozenset({"a", "an", "the", "at", "to", "in", "on", "of", "for", "from", "by",
                         "with", "and", "or", "is", "was", "are", "me", "my", "your", "our",
                         "it", "its", "this", "that", "number", "id", "no", "code"})
# A name beside it: "(laptop)", or a JSON record's name next to its id.
_AFTER = re.compile(
    r"[\"']?\s*(?:\((?P<said>[A-Za-z][^()\n]{0,30})\)"
    r"|,\s*\"(?:name|title|product|description)\"\s*:\s*\"(?P<keyed>[^\"\n]{1,40})\")")


def is_bare_number(value: str) -> bool:
    """Tell whether ``value`` is a number of 9-12 digits and nothing else."""
    return MIN_DIGITS <= len(value) <= MAX_DIGITS and value.isascii() and value.isdigit()


def label_number(value: str, texts: Iterable[str]) -> str:
    """Return ``value`` with the label the first of ``texts`` that gives one gives it
    (the word before it, a name beside it), or ``value`` alone when none does."""
    for text in texts:
        at = _find_whole(text, value)
        if at < 0:
            continue
        before = _BEFORE.search(text, max(0, at - _BEFORE_CHARS), at)
        after = _AFTER.match(text, at + len(value))
        name = (after.group("said") or after.group("keyed")) if after else ""
        word = before.group("label") if before else ""
        if word.casefold() in _NOT_LABELS:
            word = ""
        if word or name:
            label = f"{word} " if word else ""
            return f"{label}{value}" + (f" ({name.strip()})" if name else "")
    return value


def _find_whole(text: str, value: str) -> int:
    """Where ``value`` first stands whole in ``text`` (no digit on either side), or -1."""
    at = text.find(value)
    while at >= 0:
        end = at + len(value)
        if not (at and text[at - 1].isdigit()) and not (end < len(text) and text[end].isdigit()):
            return at
        at = text.find(value, at + 1)
    return at


def label_numbers(span: Iterable[Group], mentions: Mapping[int, str]) -> dict[str, str]:
    """The bare numbers the span's stored mentions name (``mentions``: each message's JSON
    mention list by seq, as ingest stored it), each labelled by the first message that
    labels it, read as stored (``span`` unpruned: a digest may have cut the label). The
    mentions say which messages hold one: no text is scanned for numbers."""
    labels: dict[str, str] = {}
    for group in span:
        for stored in group.messages:
            listed = mentions.get(stored.seq)
            if not listed or not _NUMBER_MENTION.search(listed):
                continue
            texts = [stored.message.text,
                     *(call.function.arguments for call in stored.message.tool_calls or ())]
            for value in _NUMBER_MENTION.findall(listed):
                if labels.get(value, value) == value:
                    labels[value] = label_number(value, texts)
    return labels
