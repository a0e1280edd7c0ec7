"""The size limits incoming records and messages must meet, and the iterative measures
that check them before any recursive code (JSON parsing, validation, text cleaning,
serialization) touches the data: Python's recursion limit must never decide an import.
"""

from __future__ import annotations

import re
from typing import Any

# Deepest nesting of objects and arrays in a record or message. A record needs 6 (record,
# messages, message, content parts, part, image_url); metadata gets the rest. Far below
# the roughly 1,000 frames at which json, pydantic or the text cleaner would recurse out.
MAX_NESTING_DEPTH = 64
MAX_RECORD_BYTES = 64 * 1024 * 1024  # one JSONL line, read whole before it is parsed
MAX_MESSAGES = 200_000  # per record or append: twice a 1M-token session of short turns

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")


def measure_json_depth(text: str) -> int:
    """Return the deepest nesting of brackets in JSON ``text``, without parsing it.

    Strings are cut out first, so brackets inside them do not count; text that is not
    valid JSON gets a number all the same, and the parser refuses it afterwards.
    """
    depth = deepest = 0
    for bracket in _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def measure_depth(value: Any, *, limit: int = MAX_NESTING_DEPTH) -> int:
    """Return how deeply dicts and lists nest in ``value`` (a scalar is 0), stopping at
    the first container found deeper than ``limit``."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return deepest
