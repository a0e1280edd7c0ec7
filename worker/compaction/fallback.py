"""The deterministic (extractive) summary: same schema and budget as the LLM's, built by
simple rules from the span, for when no LLM may or can be called.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from worker.compaction.grouping import Group
from worker.compaction.identifiers import Artifact, find_identifiers
from worker.compaction.messages import INSTRUCTION_ROLES, Role, StoredMessage
from worker.compaction.schema import (
    Summary,
    enforce_summary_budget,
    truncate_text,
)
from worker.compaction.tokens import TokenCounter
from worker.compaction.validation import reattach_identifiers

TIMES = "\u00d7"  # the multiplication sign: "called get_user_details" TIMES "2"
GOAL_TOKENS = 60
SENTENCE_TOKENS = 48
MAX_PREFERENCES = 6
MAX_DECISIONS = 8
MAX_ERRORS = 5
MAX_CALL_VALUES = 4
MAX_ARTIFACTS = 40

_REQUEST = re.compile(
    r"\?|(?i:\b(?:i want|i'd like|i would like|i need|i'm looking|i am looking|looking to|"
    r"trying to|help me|can you|could you|please)\b)"
)
_PREFERENCE = re.compile(
    r"(?i:\b(?:prefer|don't want|do not want|don't|do not|must|only|instead|rather|"
    r"no later than|not before|not after|at most|at least|without)\b)"
)
_DECISION = re.compile(
    r"(?i:\b(?:i will|i'll|i have|i've|confirmed|cancell?ed|booked|updated|modified|"
    r"refunded|transferred|approved|denied|cannot|can't|unable|not eligible|successfully)\b)"
)
# A failing tool says so up front ("Error: ...", {"error": ...}, a traceback); a word
# like "failed" deep in a log or a test report ("0 failed") is not a failure of the call.
_ERROR = re.compile(
    r'(?i:\A\s*(?:\{\s*"(?:error|errors)"|(?:error|failed|failure|fatal|exception|traceback)\b))'
)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
_ARGUMENT_KINDS = frozenset({"id", "path", "url", "uuid", "hash", "ticket", "email"})


def fallback_summary(
    span: Sequence[Group],
    *,
    artifacts: Sequence[Artifact],
    budget_tokens: int,
    counter: TokenCounter,
) -> Summary:
    """Summarize ``span`` alone without an LLM, within ``budget_tokens``.

    Goal: the first user request; constraints: user sentences stating preferences;
    completed actions: the span's seq range and message counts, tool names with call
    counts and id arguments, then tool errors;
    key decisions: the agent's sentences that commit, confirm or refuse; pending: the
    last user request (a question or an ask) with no agent reply after it, and any tool
    call still unanswered.
    The artifact index (ranked) fills relevant_artifacts last, as far as the budget allows.
    """
    messages = [m for g in span for m in g.messages if m.message.role not in INSTRUCTION_ROLES]
    user_texts = [m.message.text for m in messages if m.message.role is Role.USER]
    agent_texts = [m.message.text for m in messages if m.message.role is Role.ASSISTANT]
    drafted = Summary(
        goal=_draft_goal(user_texts, agent_texts, counter),
        constraints_and_preferences=_pick_sentences(
            user_texts, _PREFERENCE, MAX_PREFERENCES, counter
        ),
        completed_actions=[*_describe_span(messages), *_draft_actions(messages, counter)],
        key_decisions=_pick_sentences(agent_texts, _DECISION, MAX_DECISIONS, counter),
        resolved=[],
        pending=_draft_pending(span, messages, counter),
        relevant_artifacts=[],
        remaining_work=[],
    )
    fitted = enforce_summary_budget(drafted, budget_tokens, counter)
    values = [a.value for a in artifacts if a.kind != "tool"][:MAX_ARTIFACTS]
    listed = "\n".join(fitted.relevant_artifacts)
    return reattach_identifiers(fitted, values, budget_tokens, counter, known_text=listed)[0]


def _is_substantive(text: str, min_words: int) -> bool:
    return len(text.split()) >= min_words


def _draft_goal(
    user_texts: Sequence[str], agent_texts: Sequence[str], counter: TokenCounter
) -> str:
    substantive = [text for text in user_texts if _is_substantive(text, 3)]
    requests = [text for text in substantive if _REQUEST.search(text)]
    said = [text for text in user_texts if text.strip()]
    chosen = (requests or substantive or said or [""])[0]
    if chosen:
        return f"User request: {_clip(chosen, GOAL_TOKENS, counter)}"
    # No user words in the span: the agent's first words are the best available topic.
    topic = next((text for text in agent_texts if text.strip()), "")
    return f"Agent topic: {_clip(topic, GOAL_TOKENS, counter)}" if topic else ""


def _describe_span(messages: Sequence[StoredMessage]) -> list[str]:
    """One line on what the span held: its seq range and messages by role."""
    if not messages:
        return []
    roles = [stored.message.role for stored in messages]
    counts = ", ".join(f"{roles.count(role)} {role.value}" for role in dict.fromkeys(roles))
    return [f"Compacted seq {messages[0].seq} to {messages[-1].seq}: {counts} messages"]


def _clip(text: str, max_tokens: int, counter: TokenCounter) -> str:
    return truncate_text(re.sub(r"\s+", " ", text).strip(), max_tokens, counter)


def _pick_sentences(
    texts: Sequence[str], cue: re.Pattern[str], limit: int, counter: TokenCounter
) -> list[str]:
    """Return the last ``limit`` distinct sentences matching ``cue``, in order."""
    sentences = (s.strip() for text in texts for s in _SENTENCE_BREAK.split(text))
    matching = dict.fromkeys(s for s in sentences if s and cue.search(s))
    return [_clip(sentence, SENTENCE_TOKENS, counter) for sentence in list(matching)[-limit:]]


@dataclass
class _ToolTally:
    calls: int = 0
    values: dict[str, None] = field(default_factory=dict)  # distinct, in first-seen order


def _draft_actions(messages: Sequence[StoredMessage], counter: TokenCounter) -> list[str]:
    tallies: dict[str, _ToolTally] = {}
    names: dict[str, str] = {}
    errors: list[str] = []
    for stored in messages:
        message = stored.message
        for call in message.tool_calls or ():
            names[call.id] = call.function.name
            tally = tallies.setdefault(call.function.name, _ToolTally())
            tally.calls += 1
            if len(tally.values) < MAX_CALL_VALUES:
                found = find_identifiers(call.function.arguments)
                tally.values.update((v, None) for v, kind in found if kind in _ARGUMENT_KINDS)
        if message.role is Role.TOOL and _ERROR.match(message.text):
            name = names.get(message.tool_call_id or "", "a tool")
            errors.append(f"{name} failed: {_clip(message.text, SENTENCE_TOKENS, counter)}")
    actions = [_describe_calls(name, tally) for name, tally in tallies.items()]
    return actions + list(dict.fromkeys(errors))[-MAX_ERRORS:]


def _describe_calls(name: str, tally: _ToolTally) -> str:
    values = list(tally.values)[:MAX_CALL_VALUES]
    suffix = f" ({', '.join(values)})" if values else ""
    return f"called {name} {TIMES}{tally.calls}{suffix}"


def _draft_pending(
    span: Sequence[Group], messages: Sequence[StoredMessage], counter: TokenCounter
) -> list[str]:
    pending: list[str] = []
    last_request: str | None = None
    for stored in messages:
        message = stored.message
        if message.role is Role.USER and _REQUEST.search(message.text):
            last_request = message.text
        elif message.role is Role.ASSISTANT and message.text.strip():
            last_request = None  # the agent answered
    if last_request is not None:
        request = _clip(last_request, SENTENCE_TOKENS, counter)
        pending.append(f"Unanswered user request: {request}")
    for group in span:
        calls = {c.id: c.function.name for m in group.messages for c in m.message.tool_calls or ()}
        for call_id in group.unanswered_call_ids:
            pending.append(f"Tool call {calls.get(call_id, '?')} ({call_id}) has no result yet")
    return pending
