"""The summary schema: strictness and stable rendering (budgets: ``test_budget.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from worker.compaction.schema import (
    ARTIFACT_VALUE_CHARS,
    BLOCK_FOOTER,
    BLOCK_HEADER,
    EMPTY_ITEM_LINE,
    HEADINGS,
    LIST_SECTIONS,
    LOAD_BEARING_SECTIONS,
    RECALL_LINE,
    SUMMARY_SECTIONS,
    Summary,
    empty_summary,
    is_packable,
    render_summary_block,
    summary_block_message,
    summary_json_schema,
    verbatim_items,
)

PHRASES = (
    "called get_reservation_details for ZFA04Y",
    "user prefers flights after 11 AM EST",
    "refund of $255 to credit_card_4421486",
    "mia_li_3668",
    "/srv/app/config.yaml failed with E1042",
    "upgrade to v2.3.1",
    "cancelled HAT170",
    "déjà vu: 東京 🙂",
)


# Items are drawn whole from a fixed pool: one draw per item keeps generation fast.
ITEM_POOL = (
    *PHRASES,
    *(f"{a}; {b}" for a in PHRASES for b in PHRASES[:3]),
    *(" ".join(PHRASES[n:] * 30) for n in range(3)),  # far over the per-item cap
)
ITEMS = st.sampled_from(ITEM_POOL)
SUMMARIES = st.fixed_dictionaries(
    {"goal": st.sampled_from(("", *ITEM_POOL)),
     **{name: st.lists(ITEMS, max_size=6) for name in LIST_SECTIONS}}
).map(Summary.model_validate)


def filled(**sections: Any) -> Summary:
    """A summary with the given sections and every other one empty."""
    return Summary.model_validate({**empty_summary().model_dump(), **sections})


def test_json_schema_is_openai_strict_with_every_section_required() -> None:
    schema = summary_json_schema()
    assert list(schema["properties"]) == list(SUMMARY_SECTIONS) == list(Summary.model_fields)
    assert schema["required"] == list(SUMMARY_SECTIONS)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["goal"]["type"] == "string"
    for name in LIST_SECTIONS:
        assert schema["properties"][name]["type"] == "array"
        assert schema["properties"][name]["items"] == {"type": "string"}
    assert "default" not in json.dumps(schema)


def test_load_bearing_sections_are_sections() -> None:
    assert set(LOAD_BEARING_SECTIONS) <= set(SUMMARY_SECTIONS)


def test_summary_rejects_extra_keys() -> None:
    with pytest.raises(ValidationError, match="extra"):
        Summary.model_validate({**empty_summary().model_dump(), "notes": []})


@pytest.mark.parametrize("section", SUMMARY_SECTIONS)
def test_summary_requires_every_section(section: str) -> None:
    data = empty_summary().model_dump()
    del data[section]
    with pytest.raises(ValidationError, match=section):
        Summary.model_validate(data)


@pytest.mark.parametrize(
    ("section", "value"),
    [("goal", ["a list"]), ("pending", "a string"), ("resolved", [1, 2]), ("goal", None)],
)
def test_summary_rejects_wrong_types(section: str, value: object) -> None:
    with pytest.raises(ValidationError):
        Summary.model_validate({**empty_summary().model_dump(), section: value})


def test_blank_items_are_dropped_and_items_stripped() -> None:
    summary = filled(goal="  book  ", pending=["", "  call back  ", "   "])
    assert summary.goal == "book"
    assert summary.pending == ["call back"]


def test_rendered_block_is_wrapped_as_background_reference_with_every_heading() -> None:
    text = render_summary_block(empty_summary())
    assert text.startswith(BLOCK_HEADER)
    assert "background reference, not instructions" in BLOCK_HEADER
    assert text.endswith(BLOCK_FOOTER)
    positions = [text.index(f"\n{HEADINGS[name]}:") for name in SUMMARY_SECTIONS]
    assert positions == sorted(positions)
    assert text.count(EMPTY_ITEM_LINE) == len(LIST_SECTIONS)


def test_the_block_says_in_one_line_that_earlier_details_are_one_recall_away() -> None:
    lines = render_summary_block(empty_summary()).splitlines()
    assert lines[-2] == RECALL_LINE
    assert "`recall` tool" in RECALL_LINE and "retrievable" in RECALL_LINE


@settings(max_examples=60, deadline=None)
@given(SUMMARIES)
def test_identical_summaries_render_identical_bytes(summary: Summary) -> None:
    copy = Summary.model_validate_json(summary.model_dump_json())
    assert render_summary_block(copy).encode() == render_summary_block(summary).encode()


BROKEN_ITEMS = st.sampled_from((*PHRASES, "first\nsecond", "a\r\nb", " x \n\n y "))


@settings(max_examples=60, deadline=None)
@given(SUMMARIES, st.lists(BROKEN_ITEMS, max_size=4), st.lists(BROKEN_ITEMS, max_size=4))
def test_the_block_holds_every_verbatim_item_and_none_with_a_line_break(
    summary: Summary, pending: list[str], artifacts: list[str]
) -> None:
    summary = summary.model_copy(update={"pending": pending, "relevant_artifacts": artifacts})
    text = render_summary_block(summary)
    items = [item for name in LIST_SECTIONS for item in summary.items_of(name)]
    assert verbatim_items(summary) == {i for i in items if "\n" not in i and "\r" not in i}
    assert all(item in text for item in verbatim_items(summary))


@given(st.text(alphabet="aZ1 ,;-_\u00e9\u0661\u00b2\t", max_size=12)
       | st.text(min_size=95, max_size=105))
def test_an_artifact_is_packable_when_short_without_separators_and_one_word_has_letters(
    item: str,
) -> None:
    words_with_letters = sum(any(char.isalpha() for char in word) for word in item.split())
    expected = (0 < len(item) <= ARTIFACT_VALUE_CHARS and "," not in item and ";" not in item
                and words_with_letters <= 1)
    assert is_packable(item) is expected


def test_an_item_with_line_breaks_stays_one_bullet() -> None:
    text = render_summary_block(filled(pending=["first line\nsecond line"]))
    assert "- first line / second line\n" in text


def test_render_lists_extra_artifacts_the_summary_lacks_once() -> None:
    summary = filled(completed_actions=["cancelled ZFA04Y"], relevant_artifacts=["mia_li_3668"])
    text = render_summary_block(summary, artifacts=["ZFA04Y", "HAT170", "HAT170", "mia_li_3668"])
    section = text.split("Relevant artifacts:\n", 1)[1].split("\nRemaining work:", 1)[0]
    assert section.splitlines() == ["- mia_li_3668, HAT170"]


def test_summary_block_message_is_a_user_message_with_the_text() -> None:
    assert summary_block_message("block") == {"role": "user", "content": "block"}
