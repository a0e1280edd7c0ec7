"""The pure compaction core: plain data in, plain data out. It imports no Celery, Redis,
SQLAlchemy, OpenAI SDK, logging, settings, environment or clock (callers pass ``now``).

This module is the core's public face: code outside ``worker/compaction/`` imports from
``worker.compaction`` only, never from its modules; a test walks the imports.
"""

from worker.compaction.breaker import (
    Breaker,
    BreakerState,
    admit,
    breaker_after_failure,
    breaker_after_success,
)
from worker.compaction.budget import FittedSummary, fit_summary
from worker.compaction.call_plan import plan_summary_calls
from worker.compaction.chunking import ChunkPlan, output_budget_tokens
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
from worker.compaction.merge import MergedSummary, merge_summaries
from worker.compaction.messages import ChatMessage, StoredMessage, dump_message, parse_message
from worker.compaction.plan import Boundary, TriggerPolicy, decide_compaction, plan_boundary
from worker.compaction.prompts import PROMPT_VERSION, build_merge_messages, build_summarize_messages
from worker.compaction.pruning import prune_groups
from worker.compaction.salience import (
    Failure,
    failure_values,
    featured_values,
    find_failures,
    rank_artifacts,
)
from worker.compaction.schema import (
    Summary,
    render_summary_block,
    summary_block_message,
    summary_json_schema,
)
from worker.compaction.strategies import StrategyConfig, StrategyName, apply_strategy
from worker.compaction.tokens import TokenCounter, load_encoding
from worker.compaction.validation import parse_summary, validate_summary

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
    "StoredMessage",
    "StrategyConfig",
    "StrategyName",
    "Summary",
    "SummaryInvalid",
    "TokenCounter",
    "TokenizerUnavailable",
    "TransientError",
    "TriggerPolicy",
    "admit",
    "apply_strategy",
    "breaker_after_failure",
    "breaker_after_success",
    "build_merge_messages",
    "build_summarize_messages",
    "check_session",
    "clean_text",
    "collect_artifacts",
    "decide_compaction",
    "dump_message",
    "extract_identifiers",
    "failure_values",
    "fallback_summary",
    "featured_values",
    "find_failures",
    "find_open_tool_calls",
    "fit_summary",
    "group_messages",
    "identify_message",
    "load_encoding",
    "measure_depth",
    "measure_json_depth",
    "merge_summaries",
    "output_budget_tokens",
    "parse_message",
    "parse_summary",
    "plan_boundary",
    "plan_summary_calls",
    "prune_groups",
    "rank_artifacts",
    "render_summary_block",
    "search_text",
    "summary_block_message",
    "summary_json_schema",
    "validate_summary",
]
