"""The import limits' measures: nesting is measured without recursion, on text before it
is parsed and on parsed values, so no depth can exhaust the interpreter's stack."""

from __future__ import annotations

import json
from typing import Any

import pytest

from worker.compaction.limits import MAX_NESTING_DEPTH, measure_depth, measure_json_depth


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@pytest.mark.parametrize("depth", [0, 1, 2, 7, 64, 65, 3_000, 100_000])
def test_text_and_parsed_measures_agree_at_any_depth(depth: int) -> None:
    value = nested(depth)
    text = json.dumps(value) if depth < 500 else "[" * depth + "]" * depth

    assert measure_json_depth(text) == depth
    if depth < 500:
        assert measure_depth(value, limit=depth) == depth


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"text": "[[[{{{ \" ]]] \\\" [[[", "list": ["[", "{"]})

    assert measure_json_depth(text) == 2


def test_a_parsed_value_is_measured_only_until_it_passes_the_limit() -> None:
    value = nested(200_000)  # built bottom up, so no recursion ever walked it

    assert measure_depth(value) == MAX_NESTING_DEPTH + 1


def test_scalars_have_no_depth() -> None:
    assert measure_depth("text") == measure_json_depth('"[{"') == 0
