"""Which of many values a text contains, exactly as ``value in text`` answers, without
scanning the text once per value: a job asks it of every identifier of its span against
the summary block (~14k values on a 1M-token session, where one scan per value cost
~0.3 s).

The index answers values the caller knows the text holds (the block's own items) from a
set, and filters the rest on a necessary condition (a contained value's first, middle
and last ``GRAM`` characters occur in the text); every value that passes is still
checked with ``in``, so the answers are the same, only cheaper. The grams are built only
once plain scans have cost a good part of building them: a 5.5k-token job asks ~100
values of each of its texts, where the build alone would cost ~5x the scans.
"""

from __future__ import annotations

from collections.abc import Iterable

GRAM = 4
# Values scanned for with ``in`` before the grams are built. Building them costs ~500
# scans of the same text (both grow with its length): a text asked few values never pays
# for them, one asked many pays at most half a build more.
SCANS_BEFORE_GRAMS = 256


class TextGrams:
    """A text and the set of its ``GRAM``-character windows: ``contains`` rejects most
    absent values with set look-ups. ``known``: values the caller knows ``text`` holds
    verbatim (a wrong one would be answered as contained). ``scans_before_grams``: values
    answered by a plain scan before the grams are built; ``asked``: how many values the
    caller will ask, when it knows: more than ``scans_before_grams`` build the grams at
    the first value the set does not answer (the scans would be spent for nothing)."""

    __slots__ = ("_grams", "_known", "_scans_left", "text")

    def __init__(self, text: str, known: Iterable[str] = (), *,
                 scans_before_grams: int = SCANS_BEFORE_GRAMS, asked: int = 0) -> None:
        self.text = text
        self._grams: set[str] | None = None
        self._scans_left = 0 if asked > scans_before_grams else scans_before_grams
        self._known = frozenset(known)

    def contains(self, value: str) -> bool:
        if value in self._known:
            return True
        if self._scans_left > 0:
            self._scans_left -= 1
            return value in self.text
        if len(value) >= GRAM:
            grams = self._grams
            if grams is None:
                text = self.text
                grams = self._grams = {text[i:i + GRAM] for i in range(len(text) - GRAM + 1)}
            middle = (len(value) - GRAM) // 2
            if (value[:GRAM] not in grams or value[-GRAM:] not in grams
                    or value[middle:middle + GRAM] not in grams):
                return False
        return value in self.text
