"""Reading plain language by sentence: cues (case-insensitive patterns, fast on ASCII) and
each text's sentences, split once per job however many rules read them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


class Cue:
    """A case-insensitive pattern written in lowercase. ASCII text is lowercased and
    searched case-sensitively: the same answer (an ASCII letter matches only its own two
    cases), in a third of the time (a 1M-token span has ~8k sentences to try)."""

    def __init__(self, pattern: str) -> None:
        if any(char.isupper() for char in re.sub(r"\\.", "", pattern)):
            raise ValueError(f"a cue is written in lowercase: {pattern!r}")
        self._any_case = re.compile(pattern, re.IGNORECASE)
        self._lowercase = re.compile(pattern)

    def search(self, text: str) -> bool:
        """Tell whether the cue occurs in ``text``."""
        if text.isascii():
            return self._lowercase.search(text.lower()) is not None
        return self._any_case.search(text) is not None


class Sentences(dict[str, list[str]]):
    """Each text's sentences, split on first use: facts and decisions read the user's
    texts, decisions and completions the agent's."""

    def __missing__(self, text: str) -> list[str]:
        sentences = self[text] = [s.strip() for s in SENTENCE_BREAK.split(text) if s.strip()]
        return sentences

    def of(self, texts: Iterable[str]) -> list[str]:
        return [sentence for text in texts for sentence in self[text]]
