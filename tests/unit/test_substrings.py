"""The substring index answers exactly as ``value in text`` does, on any text and values,
including values shorter than a gram, repeated, empty, or overlapping in the text, before
and after it builds its grams."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.compaction.substrings import TextGrams

# A small alphabet makes values occur in texts (and overlap) often; characters past ASCII
# (one of them astral) share the grams' ``?`` with the ``?`` itself.
ALPHABET = "ab/-_1?\u0131\u2192\U0001f600"
TEXTS = st.text(alphabet=ALPHABET, max_size=60)
VALUES = st.lists(st.text(alphabet=ALPHABET, max_size=8), max_size=20)
# Plain scans before the grams: none, some of the values, all of them.
SCANS = st.sampled_from([0, 3, 20])


@given(TEXTS, VALUES, SCANS, st.integers(0, 30))
def test_text_grams_contains_what_in_contains(text: str, values: list[str], scans: int,
                                              asked: int) -> None:
    grams = TextGrams(text, scans_before_grams=scans, asked=asked)
    assert [grams.contains(v) for v in values] == [v in text for v in values]
    # All at once, on a fresh index and on one whose scans are spent or grams built.
    for index in (TextGrams(text, scans_before_grams=scans, asked=asked), grams):
        assert index.contains_each(values) == [v in text for v in values]


@given(TEXTS, VALUES, SCANS, st.data())
def test_values_known_to_occur_are_answered_as_in_answers(
    text: str, values: list[str], scans: int, data: st.DataObject
) -> None:
    windows = [text[i:j] for i in range(len(text)) for j in range(i, len(text) + 1)]
    known = data.draw(st.lists(st.sampled_from(windows), max_size=5)) if windows else []
    grams = TextGrams(text, known=known, scans_before_grams=scans)
    assert [grams.contains(v) for v in [*values, *known]] == \
        [v in text for v in [*values, *known]]
    assert TextGrams(text, known=known, scans_before_grams=scans).contains_each(
        [*values, *known]) == [v in text for v in [*values, *known]]


def test_a_long_text_rejects_absent_identifiers_and_keeps_present_ones() -> None:
    text = "- src/app/models.py, ERR-4412, v2.3.1\n" * 200 + "tail 0xdeadbeef"
    values = ["src/app/models.py", "ERR-4412", "0xdeadbeef", "src/app/views.py", "ERR-4413"]
    for scans in (0, 2, 10):
        grams = TextGrams(text, scans_before_grams=scans)
        assert [grams.contains(v) for v in values] == [True, True, True, False, False]
        assert TextGrams(text, scans_before_grams=scans).contains_each(values) == \
            [True, True, True, False, False]
