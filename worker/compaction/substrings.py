"""Which of many values a text contains, exactly as ``value in text`` answers, without
scanning the text once per value: a job asks it of every identifier of its span against
the summary block (~14k values on a 1M-token session, where one scan per value cost
~0.3 s).

The index answers values the caller knows the text holds (the block's own items) from a
set, and filters the rest on a necessary condition (a contained value's first, middle
and last ``GRAM`` characters occur in the text); every value that passes is still
checked with ``in``, so the answers are the same, only cheaper.
"""

from __future__ import annotations

from collections.abc import Iterable

GRAM = 4


class TextGrams:
    """A text and the set of its ``GRAM``-character windows: ``contains`` rejects most
    absent values with set look-ups. ``known``: values the caller knows ``text`` holds
    verbatim (a wrong one would be answered as contained)."""

    __slots__ = ("_grams", "_known", "text")

    def __init__(self, text: str, known: Iterable[str] = ()) -> None:
        self.text = text
        self._grams = {text[i:i + GRAM] for i in range(len(text) - GRAM + 1)}
        self._known = frozenset(known)

    def contains(self, value: str) -> bool:
        if value in self._known:
            return True
        if len(value) >= GRAM:
            grams, middle = self._grams, (len(value) - GRAM) // 2
            if (value[:GRAM] not in grams or value[-GRAM:] not in grams
                    or value[middle:middle + GRAM] not in grams):
                return False
        return value in self.text
