"""Which of many values a text contains, exactly as ``value in text`` answers, without
scanning the text once per value: a job asks it of every identifier of its span against
the summary block, where one scan per value would cost more than the rest of the job.

The index answers values the caller knows the text holds (the block's own items) from a
set, and filters the rest on a necessary condition (a contained value's first, middle
and last ``GRAM`` characters occur in the text); every value that passes is still
checked with ``in``, so the answers are the same, only cheaper. The grams are built only
once plain scans have cost about half a build: a text asked few values never pays for
them.

The grams are the text's ``GRAM``-byte windows read as integers, in C (``memoryview``),
with every character past ASCII read as ``?``: the same mapping of a contained value
gives windows the text has, so nothing contained is filtered out. No library offered a
substring filter for many needles that is exact and needs no compiled extension.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Final, Literal

GRAM = 4
# Values scanned for with ``in`` before the grams are built, about half a build's cost
# in scans of the same text (both grow with its length).
SCANS_BEFORE_GRAMS = 256
# Native unsigned ints of ``GRAM`` bytes: how ``memoryview.cast`` reads every window,
# the text's and the values'.
_WINDOW_FORMAT: Final[Literal["I"]] = "I"


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
        self._grams: set[int] | None = None
        self._scans_left = 0 if asked > scans_before_grams else scans_before_grams
        self._known = frozenset(known)

    def contains(self, value: str) -> bool:
        return self.contains_each([value])[0]

    def contains_each(self, values: Sequence[str]) -> list[bool]:
        """``contains`` of each of ``values``: the grams' filter reads the values' first
        and last windows in one C-level pass each, where one call per value would cost
        more than the look-ups."""
        answers = list(map(self._known.__contains__, values))
        asked = [index for index, held in enumerate(answers) if not held]
        text = self.text
        if len(asked) <= self._scans_left:
            self._scans_left -= len(asked)
            for index in asked:
                answers[index] = values[index] in text
            return answers
        self._scans_left = 0
        grams = self._grams
        if grams is None:
            grams = self._grams = _windows(text)
        windowed = [index for index in asked if len(values[index]) >= GRAM]
        # Values shorter than a window are scanned for; the others only past the filter.
        scanned = [index for index in asked if len(values[index]) < GRAM]
        encoded = [values[index].encode("ascii", "replace") for index in windowed]
        firsts = _read_windows(b"".join(map(itemgetter(slice(None, GRAM)), encoded)))
        lasts = _read_windows(b"".join(map(itemgetter(slice(-GRAM, None)), encoded)))
        for index, value, first, last in zip(windowed, encoded, map(grams.__contains__, firsts),
                                             map(grams.__contains__, lasts), strict=True):
            if first and last:
                middle = (len(value) - GRAM) // 2
                if _read_windows(value[middle:middle + GRAM])[0] in grams:
                    scanned.append(index)
        for index in scanned:
            answers[index] = values[index] in text
        return answers


def _read_windows(encoded: bytes) -> memoryview:
    """``encoded``'s ``GRAM``-byte windows laid end to end, read as integers."""
    return memoryview(encoded).cast(_WINDOW_FORMAT)


def _windows(text: str) -> set[int]:
    """Every ``GRAM``-character window of ``text`` as an integer: one C-level read per
    alignment."""
    encoded = memoryview(text.encode("ascii", "replace"))  # one byte per character
    windows: set[int] = set()
    for offset in range(GRAM):
        whole = (len(encoded) - offset) // GRAM * GRAM
        windows.update(encoded[offset:offset + whole].cast(_WINDOW_FORMAT))
    return windows
