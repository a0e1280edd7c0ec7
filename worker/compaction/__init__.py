"""The pure compaction core: plain data in, plain data out. It imports no Celery, Redis,
SQLAlchemy, OpenAI SDK, logging, settings, environment, files or clock (callers pass
``now``; the tokenizer's encoding is loaded outside, by ``worker.tokenizer``).

This module is the core's public face: code outside ``worker/compaction/`` imports from
``worker.compaction`` only, never from its modules; a test walks the imports.

Every name loads on first use (PEP 562 ``__getattr__``), with only the module that
defines it: a process that needs one enum (the settings' ``StrategyName``) does not
import the summary schema's pydantic models or the tokenizer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.compaction.breaker import (
        Breaker,
        BreakerState,
        admit,
        breaker_after_failure,
        breaker_after_stray_failure,
        breaker_after_success,
    )
    from worker.compaction.budget import FittedSummary, SummaryBudget, fit_summary
    from worker.compaction.call_plan import plan_summary_calls
    from worker.compaction.chunking import ChunkPlan, output_budget_tokens
    from worker.compaction.controls import (
        escape_controls,
        escape_controls_in_json,
        find_control_character,
        is_control_character,
    )
    from worker.compaction.errors import (
        BreakerScope,
        CompactionError,
        ConfigurationError,
        ContextOverflow,
        Outcome,
        SessionFailure,
        SummaryInvalid,
        TokenizerUnavailable,
        TransientError,
    )
    from worker.compaction.fallback import fallback_summary
    from worker.compaction.grouping import Group, group_messages
    from worker.compaction.identifiers import (
        Artifact,
        Mention,
        collect_artifacts,
        dump_artifacts_json,
        extract_identifiers,
        identify_message,
        search_text,
    )
    from worker.compaction.intake import (
        Action,
        IntakePolicy,
        IntakeResult,
        Problem,
        ProblemKind,
        check_session,
        clean_text,
        find_open_tool_calls,
    )
    from worker.compaction.limits import (
        MAX_MESSAGES,
        MAX_NESTING_DEPTH,
        MAX_RECORD_BYTES,
        measure_depth,
        measure_json_depth,
    )
    from worker.compaction.merge import (
        MergedSummary,
        count_identifier_lines,
        merge_summaries,
        use_stored_line_counts,
    )
    from worker.compaction.messages import (
        ChatMessage,
        StoredMessage,
        dump_message,
        parse_message,
        parse_message_json,
    )
    from worker.compaction.outcomes import (
        CallOutcome,
        CallStatus,
        Failure,
        classify_calls,
        find_failures,
    )
    from worker.compaction.plan import Boundary, TriggerPolicy, decide_compaction, plan_boundary
    from worker.compaction.prompts import (
        PROMPT_VERSION,
        build_merge_messages,
        build_summarize_messages,
    )
    from worker.compaction.pruning import prune_groups
    from worker.compaction.requests import continues_conversation
    from worker.compaction.salience import (
        failure_values,
        featured_values,
        rank_artifacts,
        rerank_featured,
    )
    from worker.compaction.schema import (
        Summary,
        render_summary_block,
        summary_block_message,
        summary_json_schema,
        verbatim_items,
    )
    from worker.compaction.strategies import StrategyConfig, StrategyName, apply_strategy
    from worker.compaction.substrings import TextGrams
    from worker.compaction.tokens import TokenCounter
    from worker.compaction.truth import SpanRecord, find_contradictions, read_record
    from worker.compaction.validation import parse_summary, validate_summary

_DEFINED_IN = {
    "Breaker": "worker.compaction.breaker",
    "BreakerState": "worker.compaction.breaker",
    "admit": "worker.compaction.breaker",
    "breaker_after_failure": "worker.compaction.breaker",
    "breaker_after_stray_failure": "worker.compaction.breaker",
    "breaker_after_success": "worker.compaction.breaker",
    "FittedSummary": "worker.compaction.budget",
    "SummaryBudget": "worker.compaction.budget",
    "fit_summary": "worker.compaction.budget",
    "plan_summary_calls": "worker.compaction.call_plan",
    "ChunkPlan": "worker.compaction.chunking",
    "output_budget_tokens": "worker.compaction.chunking",
    "escape_controls": "worker.compaction.controls",
    "escape_controls_in_json": "worker.compaction.controls",
    "find_control_character": "worker.compaction.controls",
    "is_control_character": "worker.compaction.controls",
    "BreakerScope": "worker.compaction.errors",
    "CompactionError": "worker.compaction.errors",
    "ConfigurationError": "worker.compaction.errors",
    "ContextOverflow": "worker.compaction.errors",
    "Outcome": "worker.compaction.errors",
    "SessionFailure": "worker.compaction.errors",
    "SummaryInvalid": "worker.compaction.errors",
    "TokenizerUnavailable": "worker.compaction.errors",
    "TransientError": "worker.compaction.errors",
    "fallback_summary": "worker.compaction.fallback",
    "Group": "worker.compaction.grouping",
    "group_messages": "worker.compaction.grouping",
    "Artifact": "worker.compaction.identifiers",
    "Mention": "worker.compaction.identifiers",
    "collect_artifacts": "worker.compaction.identifiers",
    "dump_artifacts_json": "worker.compaction.identifiers",
    "extract_identifiers": "worker.compaction.identifiers",
    "identify_message": "worker.compaction.identifiers",
    "search_text": "worker.compaction.identifiers",
    "Action": "worker.compaction.intake",
    "IntakePolicy": "worker.compaction.intake",
    "IntakeResult": "worker.compaction.intake",
    "Problem": "worker.compaction.intake",
    "ProblemKind": "worker.compaction.intake",
    "check_session": "worker.compaction.intake",
    "clean_text": "worker.compaction.intake",
    "find_open_tool_calls": "worker.compaction.intake",
    "MAX_MESSAGES": "worker.compaction.limits",
    "MAX_NESTING_DEPTH": "worker.compaction.limits",
    "MAX_RECORD_BYTES": "worker.compaction.limits",
    "measure_depth": "worker.compaction.limits",
    "measure_json_depth": "worker.compaction.limits",
    "MergedSummary": "worker.compaction.merge",
    "merge_summaries": "worker.compaction.merge",
    "count_identifier_lines": "worker.compaction.merge",
    "use_stored_line_counts": "worker.compaction.merge",
    "ChatMessage": "worker.compaction.messages",
    "StoredMessage": "worker.compaction.messages",
    "dump_message": "worker.compaction.messages",
    "parse_message": "worker.compaction.messages",
    "parse_message_json": "worker.compaction.messages",
    "Boundary": "worker.compaction.plan",
    "TriggerPolicy": "worker.compaction.plan",
    "decide_compaction": "worker.compaction.plan",
    "plan_boundary": "worker.compaction.plan",
    "PROMPT_VERSION": "worker.compaction.prompts",
    "build_merge_messages": "worker.compaction.prompts",
    "build_summarize_messages": "worker.compaction.prompts",
    "prune_groups": "worker.compaction.pruning",
    "CallOutcome": "worker.compaction.outcomes",
    "CallStatus": "worker.compaction.outcomes",
    "Failure": "worker.compaction.outcomes",
    "classify_calls": "worker.compaction.outcomes",
    "find_failures": "worker.compaction.outcomes",
    "failure_values": "worker.compaction.salience",
    "featured_values": "worker.compaction.salience",
    "rank_artifacts": "worker.compaction.salience",
    "rerank_featured": "worker.compaction.salience",
    "continues_conversation": "worker.compaction.requests",
    "Summary": "worker.compaction.schema",
    "render_summary_block": "worker.compaction.schema",
    "summary_block_message": "worker.compaction.schema",
    "summary_json_schema": "worker.compaction.schema",
    "verbatim_items": "worker.compaction.schema",
    "StrategyConfig": "worker.compaction.strategies",
    "StrategyName": "worker.compaction.strategies",
    "apply_strategy": "worker.compaction.strategies",
    "TextGrams": "worker.compaction.substrings",
    "TokenCounter": "worker.compaction.tokens",
    "SpanRecord": "worker.compaction.truth",
    "read_record": "worker.compaction.truth",
    "find_contradictions": "worker.compaction.truth",
    "parse_summary": "worker.compaction.validation",
    "validate_summary": "worker.compaction.validation",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module 'worker.compaction' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary global
    return value


__all__ = [
    "MAX_MESSAGES",
    "MAX_NESTING_DEPTH",
    "MAX_RECORD_BYTES",
    "PROMPT_VERSION",
    "Action",
    "Artifact",
    "Boundary",
    "Breaker",
    "BreakerScope",
    "BreakerState",
    "CallOutcome",
    "CallStatus",
    "ChatMessage",
    "ChunkPlan",
    "CompactionError",
    "ConfigurationError",
    "ContextOverflow",
    "Failure",
    "FittedSummary",
    "Group",
    "IntakePolicy",
    "IntakeResult",
    "Mention",
    "MergedSummary",
    "Outcome",
    "Problem",
    "ProblemKind",
    "SessionFailure",
    "SpanRecord",
    "StoredMessage",
    "StrategyConfig",
    "StrategyName",
    "Summary",
    "SummaryBudget",
    "SummaryInvalid",
    "TextGrams",
    "TokenCounter",
    "TokenizerUnavailable",
    "TransientError",
    "TriggerPolicy",
    "admit",
    "apply_strategy",
    "breaker_after_failure",
    "breaker_after_stray_failure",
    "breaker_after_success",
    "build_merge_messages",
    "build_summarize_messages",
    "check_session",
    "classify_calls",
    "clean_text",
    "collect_artifacts",
    "continues_conversation",
    "count_identifier_lines",
    "decide_compaction",
    "dump_artifacts_json",
    "dump_message",
    "escape_controls",
    "escape_controls_in_json",
    "extract_identifiers",
    "failure_values",
    "fallback_summary",
    "featured_values",
    "find_contradictions",
    "find_control_character",
    "find_failures",
    "find_open_tool_calls",
    "fit_summary",
    "group_messages",
    "identify_message",
    "is_control_character",
    "measure_depth",
    "measure_json_depth",
    "merge_summaries",
    "output_budget_tokens",
    "parse_message",
    "parse_message_json",
    "parse_summary",
    "plan_boundary",
    "plan_summary_calls",
    "prune_groups",
    "rank_artifacts",
    "read_record",
    "render_summary_block",
    "rerank_featured",
    "search_text",
    "summary_block_message",
    "summary_json_schema",
    "use_stored_line_counts",
    "validate_summary",
    "verbatim_items",
]
