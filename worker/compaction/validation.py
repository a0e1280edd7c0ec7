"""Summary validation with typed failure reasons, and identifier re-attachment.

Every failure is a ``SummaryInvalid`` whose ``reason`` is one of ``REASONS``; a missing
identifier is never a failure by itself: it is re-attached to relevant_artifacts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from worker.compaction.errors import SummaryInvalid
from worker.compaction.schema import (
    LOAD_BEARING_SECTIONS,
    Summary,
    count_summary_tokens,
    summary_text,
)
from worker.compaction.tokens import TokenCounter

REASONS = (
    "truncated",
    "empty_output",
    "malformed_json",
    "schema_mismatch",
    "empty_sections",
    "over_budget",
    "not_smaller",
)
_FENCED = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)\n?```", re.DOTALL)
_MAX_ERRORS_SHOWN = 5


@dataclass(frozen=True, slots=True)
class Validated:
    """A summary that passed validation, and the identifiers re-attached to it."""

    summary: Summary
    reattached: tuple[str, ...]


def validate_summary(
    span_summary: Summary,
    merged: Summary,
    *,
    span_tokens: int,
    identifiers: Sequence[str],
    budget_tokens: int,
    replaced_tokens: int,
    counter: TokenCounter,
    min_span_tokens_for_content: int = 500,
) -> Validated:
    """Check the span's summary and the merged one, and return the summary to store.

    For a span of ``min_span_tokens_for_content`` tokens or more, the merged summary needs
    a goal and the span's own summary some progress (the other load-bearing sections);
    the span's summary must fit ``budget_tokens``. The
    merged summary gets the identifiers (most important first) absent from its text
    re-attached while they fit; its block must then be smaller than ``replaced_tokens``
    (prior block plus span).

    Raises:
        SummaryInvalid: with ``reason`` one of ``REASONS``.
    """
    if span_tokens >= min_span_tokens_for_content:
        _check_load_bearing(span_summary, merged)
    reply_tokens = count_summary_tokens(span_summary, counter)
    if reply_tokens > budget_tokens:
        raise SummaryInvalid(
            f"summary renders to {reply_tokens} tokens, over the {budget_tokens}-token budget",
            reason="over_budget",
        )
    final, reattached = reattach_identifiers(merged, identifiers, budget_tokens, counter)
    final_tokens = count_summary_tokens(final, counter)
    if final_tokens >= replaced_tokens:
        raise SummaryInvalid(
            f"summary renders to {final_tokens} tokens, not fewer than the "
            f"{replaced_tokens} tokens it replaces",
            reason="not_smaller",
        )
    return Validated(final, reattached)


def parse_summary(raw: str | dict[str, Any] | None) -> Summary:
    """Parse a reply (JSON text, a JSON object in prose, or a dict) into a ``Summary``."""
    if raw is None or raw == {} or (isinstance(raw, str) and not raw.strip()):
        raise SummaryInvalid("the summarizer returned nothing", reason="empty_output")
    data: object = raw
    if isinstance(raw, str):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            data = extract_json_object(raw)
    if not isinstance(data, dict):
        raise SummaryInvalid(
            f"expected a JSON object, got {type(data).__name__}", reason="schema_mismatch"
        )
    try:
        return Summary.model_validate(data)
    except ValidationError as exc:
        raise SummaryInvalid(
            f"summary does not match the schema: {_describe_errors(exc)}",
            reason="schema_mismatch",
        ) from exc


def _describe_errors(exc: ValidationError) -> str:
    errors = exc.errors()
    shown = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in errors]
    more = len(shown) - _MAX_ERRORS_SHOWN
    text = "; ".join(shown[:_MAX_ERRORS_SHOWN])
    return f"{text}; and {more} more" if more > 0 else text


def _check_load_bearing(span_summary: Summary, merged: Summary) -> None:
    # The goal may stand from the prior summary; the progress must be the span's own.
    goal, *progress = LOAD_BEARING_SECTIONS
    if not getattr(merged, goal) or not any(getattr(span_summary, name) for name in progress):
        raise SummaryInvalid(
            f"a long span needs a goal and at least one of {', '.join(progress)}",
            reason="empty_sections",
        )


def extract_json_object(text: str) -> dict[str, Any]:
    """Return the JSON object in a plain-text reply: a fenced block, else the first
    balanced top-level ``{...}`` that parses.

    Raises:
        SummaryInvalid: ``reason="malformed_json"`` when no object can be read.
    """
    candidates = [match.group(1) for match in _FENCED.finditer(text)]
    candidates.extend(_balanced_objects(text))
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise SummaryInvalid("no JSON object could be read from the reply", reason="malformed_json")


def _balanced_objects(text: str) -> Iterator[str]:
    """Yield each top-level ``{...}`` span, braces inside JSON strings ignored."""
    depth, start, in_string, escaped = 0, -1, False, False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"' and depth:
            in_string = True
        elif char == "{":
            start = index if depth == 0 else start
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                yield text[start : index + 1]


def reattach_identifiers(
    summary: Summary,
    identifiers: Sequence[str],
    budget_tokens: int,
    counter: TokenCounter,
    *,
    known_text: str | None = None,
) -> tuple[Summary, tuple[str, ...]]:
    """Append the identifiers absent from ``known_text`` (default: the whole summary text)
    to relevant_artifacts, in the given order, as many as fit ``budget_tokens``.

    Returns the summary and the identifiers appended.
    """
    known = summary_text(summary) if known_text is None else known_text
    wanted = dict.fromkeys(value.strip() for value in identifiers)
    missing = [value for value in wanted if value and value not in known]
    low, high = 0, len(missing)
    # More identifiers never render shorter, so the longest prefix that fits is found by
    # bisection.
    while low < high:
        middle = (low + high + 1) // 2
        trial = _with_artifacts(summary, missing[:middle])
        if count_summary_tokens(trial, counter) <= budget_tokens:
            low = middle
        else:
            high = middle - 1
    return _with_artifacts(summary, missing[:low]), tuple(missing[:low])


def _with_artifacts(summary: Summary, values: Sequence[str]) -> Summary:
    if not values:
        return summary
    artifacts = [*summary.relevant_artifacts, *values]
    return summary.model_copy(update={"relevant_artifacts": artifacts})
