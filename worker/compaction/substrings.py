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
from itertools import compress, filterfalse
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
        """``contains`` of each of ``values``. Every step is one C-level pass over all the
        values (a map, a join, a compress): a Python step per value would cost more
        than the look-ups; only the values that pass the filter are read one by one."""
        known = self._known
        asked = list(filterfalse(known.__contains__, values)) if known else list(values)
        text = self.text
        if len(asked) <= self._scans_left or len(text) < GRAM:
            # Few values, or a text too short for a window: plain scans.
            self._scans_left = max(self._scans_left - len(asked), 0)
            held = set(compress(asked, map(text.__contains__, asked)))
        else:
            self._scans_left = 0
            if self._grams is None:
                self._grams = _windows(text)
            held = set(filter(text.__contains__, _passing(self._grams, asked)))
        return list(map(held.union(known).__contains__, values))


def _passing(grams: set[int], values: list[str]) -> list[str]:
    """The ``values`` whose first, last and middle windows are all in ``grams``, and those
    shorter than a window (which the filter cannot read): the rest are not in the text.
    The values are read as the text is (``?`` past ASCII), their windows laid end to end
    and read in one pass each; most absent values fail at the first window."""
    firsts_text = "".join(map(itemgetter(slice(None, GRAM)), values))
    short: list[str] = []
    if len(firsts_text) < GRAM * len(values):  # a value shorter than a window
        short = [value for value in values if len(value) < GRAM]
        values = [value for value in values if len(value) >= GRAM]
        firsts_text = "".join(map(itemgetter(slice(None, GRAM)), values))
    firsts = _read_windows(firsts_text).tolist()
    first_hits = grams.intersection(firsts)
    if not first_hits:
        return short
    candidates = list(compress(values, map(first_hits.__contains__, firsts)))
    lasts = _read_windows("".join(map(itemgetter(slice(-GRAM, None)), candidates))).tolist()
    candidates = list(compress(candidates, map(grams.__contains__, lasts)))
    middles = _read_windows("".join(
        value[(len(value) - GRAM) // 2:(len(value) - GRAM) // 2 + GRAM]
        for value in candidates))
    return [*short, *compress(candidates, map(grams.__contains__, middles))]


def _read_windows(text: str) -> memoryview:
    """``text``'s ``GRAM``-character windows laid end to end, read as integers (a
    character past ASCII as ``?``)."""
    return memoryview(text.encode("ascii", "replace")).cast(_WINDOW_FORMAT)


def _windows(text: str) -> set[int]:
    """Every ``GRAM``-character window of ``text`` as an integer: one C-level read per
    alignment."""
    encoded = memoryview(text.encode("ascii", "replace"))  # one byte per character
    windows: set[int] = set()
    for offset in range(GRAM):
        whole = (len(encoded) - offset) // GRAM * GRAM
        windows.update(encoded[offset:offset + whole].cast(_WINDOW_FORMAT).tolist())
    return windows
