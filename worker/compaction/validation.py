"""Summary validation with typed failure reasons, and the one JSON-from-prose reader.

Every failure is a ``SummaryInvalid`` whose ``reason`` is one of ``REASONS``; a missing
identifier is never a failure by itself: the update re-attaches it to relevant_artifacts.
A summary that says what the span's record refutes (``truth.py``) is
``summary_contradicts_history``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from worker.compaction.errors import SummaryInvalid
from worker.compaction.schema import (
    LOAD_BEARING_SECTIONS,
    Summary,
    count_summary_tokens,
)
from worker.compaction.summary_update import UpdatedSummary
from worker.compaction.tokens import TokenCounter
from worker.compaction.truth import SpanRecord, describe_contradictions, find_contradictions

REASONS = (
    "truncated",
    "empty_output",
    "malformed_json",
    "schema_mismatch",
    "empty_sections",
    "over_budget",
    "not_smaller",
    "summary_contradicts_history",
)
_FENCED = re.compile(r"```[A-Za-z]*[ \t]*\n(.*?)\n?```", re.DOTALL)
_MAX_ERRORS_SHOWN = 5


def validate_summary(
    span_summary: Summary,
    updated: UpdatedSummary,
    *,
    span_tokens: int,
    budget_tokens: int,
    replaced_tokens: int,
    counter: TokenCounter,
    min_span_tokens_for_content: int = 500,
    record: SpanRecord | None = None,
    span_summary_tokens: int | None = None,
) -> UpdatedSummary:
    """Check the span's summary and the updated one; return the updated one to store.

    For a span of ``min_span_tokens_for_content`` tokens or more, the updated summary needs
    a goal and the span's own summary some progress (the other load-bearing sections).
    The span's summary must fit ``budget_tokens``, and so must the updated block (the
    update fitted it; its count is carried, not redone), which must also be smaller than
    ``replaced_tokens`` (prior block plus span). With the span's ``record``, the span's
    summary must say nothing it refutes (``truth.find_contradictions``).
    ``span_summary_tokens``: the span's summary's block count, where the summarizer took
    it; else it is counted here.

    Raises:
        SummaryInvalid: with ``reason`` one of ``REASONS``.
    """
    if span_tokens >= min_span_tokens_for_content:
        _check_load_bearing(span_summary, updated.summary)
    reply_tokens = count_summary_tokens(span_summary, counter) \
        if span_summary_tokens is None else span_summary_tokens
    for name, tokens in (("summary", reply_tokens), ("updated summary", updated.fitted.tokens)):
        if tokens > budget_tokens:
            raise SummaryInvalid(
                f"{name} renders to {tokens} tokens, over the {budget_tokens}-token budget",
                reason="over_budget",
            )
    if updated.fitted.tokens >= replaced_tokens:
        raise SummaryInvalid(
            f"summary renders to {updated.fitted.tokens} tokens, not fewer than the "
            f"{replaced_tokens} tokens it replaces",
            reason="not_smaller",
        )
    contradictions = find_contradictions(span_summary, record) if record else []
    if contradictions:
        raise SummaryInvalid(describe_contradictions(contradictions),
                             reason="summary_contradicts_history")
    return updated


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


def _check_load_bearing(span_summary: Summary, updated: Summary) -> None:
    # The goal may stand from the prior summary; the progress must be the span's own.
    goal, *progress = LOAD_BEARING_SECTIONS
    if not getattr(updated, goal) or not any(getattr(span_summary, name) for name in progress):
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
