"""The deterministic (extractive) summary: same schema, budget and update contract as the
LLM's, built by plain-language rules from the span, for when no LLM may or can be called.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.compaction.budget import FittedSummary, fit_summary, truncate_text
from worker.compaction.facts import find_facts
from worker.compaction.grouping import Group
from worker.compaction.identifier_rules import find_identifiers
from worker.compaction.identifiers import Artifact
from worker.compaction.messages import INSTRUCTION_ROLES, Role, StoredMessage
from worker.compaction.number_labels import is_bare_number, label_number
from worker.compaction.outcomes import CallOutcome, CallStatus, Failure, classify_calls
from worker.compaction.parties import Party, party_of
from worker.compaction.requests import RequestLedger, read_span_requests
from worker.compaction.salience import featured_values, rank_artifacts, rerank_featured
from worker.compaction.schema import LIST_SECTIONS, Summary
from worker.compaction.sentences import Cue, Sentences
from worker.compaction.tokens import TokenCounter

NO_WORDS_GOAL = "Continue the session: the compacted messages state no request in words"
TIMES = "\u00d7"  # the multiplication sign: "looked up with get_user_details" TIMES "2"
GOAL_TOKENS = 60
SENTENCE_TOKENS = 48
RESULT_TOKENS = 20
# A user turn keeps every fact it states; a span keeps its newest this many.
MAX_FACTS = 16
MAX_DECISIONS = 60
MAX_COMPLETIONS = 8
MAX_CALL_VALUES = 4
MAX_ARTIFACTS = 60
# Item prefixes a later span's summary recognises when it settles them.
UNANSWERED = "Unanswered user request: "
OPEN_ERROR = "Open error: "
ANSWERED = "Answered: "
ACTED_ON = "Acted on: "
# How a completed action's line states its call's outcome (the truth check reads them).
ARROW = " → "
SAID_OK = "ok"
SAID_FAILED = "failed: "
SAID_UNKNOWN = "unknown"
NO_RESULT = "no result yet"


# Choices, pins and refusals: what was decided, by whom, and why.
_DECISION = Cue(
    r"\bdecision\s*:|\bdecided\b|\b(?:we|i)(?:'ll| will) (?:go with|use|pin|keep|stick)"
    r"|\blet's (?:go with|use|pin|keep)|\bgoing with\b|\bchose\b|\bopted\b|\bsettled on\b"
    r"|\bpinn?(?:ed|ing)?\b|\bagreed\b"
)
# What the agent confirmed or refused is a decision too; a user's "can't" is not.
_AGENT_DECISION = Cue(
    r"\bconfirmed\b|\bcannot\b|\bcan't\b|\bunable\b|\bnot eligible\b|\bdenied\b"
    r"|\bapproved\b|\bunfortunately\b|\bnot (?:possible|allowed|permitted)\b"
)
# A question, a conditional or a promise about work is not a report of it.
_NOT_DONE = re.compile(
    r"\?\s*\Z|(?i:\b(?:if|whether|could|would|cannot|can't|can be|will|shall|once|"
    r"as soon as|going to|about to|ready to|let me|i'll|we'll|you'll|it'll|confirm)\b)")
# Work reported done, in the agent's words.
_DONE = Cue(
    r"\b(?:done|fixed|successfully|has been|have been|completed|cancell?ed|booked|"
    r"refunded|transferred|merged|deployed|installed|upgraded|downgraded)\b"
)
_CONFIRMATION = re.compile(
    r"(?i:\A\W*(?:yes|yeah|yep|confirm(?:ed)?|correct|go ahead|please proceed|"
    r"that works|sounds good)\b)"
)
# Tools that only read: many calls, one line.
_LOOKUP = re.compile(r"(?i:\A(?:get|search|list|find|read|fetch|lookup|view|show|cat|grep|ls|"
                     r"think|calculate|query|check|describe)(?:_|\b|[A-Z]))")
# A pinned version as people write it: "sqlalchemy==2.0.1", "node@20.1", "v1 >= 1.4".
_VERSION_PIN = re.compile(r"\b([A-Za-z][\w.-]*?)\s*(?:==|>=|<=|~=|@)\s*(v?\d[\w.+-]*\w)")


def fallback_summary(
    span: Sequence[Group],
    *,
    artifacts: Sequence[Artifact],
    budget_tokens: int,
    counter: TokenCounter,
    prior: Summary | None = None,
    outcomes: Sequence[CallOutcome] | None = None,
    ranked: Sequence[Artifact] | None = None,
    tail_continues: bool = False,
    ledger: RequestLedger | None = None,
    passed_values: Mapping[int, Sequence[str]] | None = None,
) -> FittedSummary:
    """Summarize ``span`` alone without an LLM, within ``budget_tokens``; return it fitted
    (rendered and counted: validation need not count it again).

    Goal: the first request of the span's latest conversation (the prior's stands when
    the span starts none); constraints: every sentence of a user's turn that states a
    constraint, a preference or a fact about the user's situation (where, device or plan,
    deadlines), the newest first when the budget is short; completed
    actions: each call that changed something with its result, look-ups tallied, work the
    agent reports done; key decisions: choices, pins, refusals and confirmations;
    resolved: answered requests, fixed errors, and the prior's items the span settled
    (verbatim, the update contract); pending: the open request, calls without a result,
    errors not fixed; relevant artifacts: the span's identifiers by salience.
    ``outcomes``: the span's calls classified from their original results (``span`` may be
    pruned), else classified from ``span``; a call's line states its outcome, never one
    read from a digest. ``ranked``: ``artifacts`` as ``rank_artifacts`` orders them with
    the error codes that ended the failures featured (``failure_values``), when the caller
    already has them. ``tail_continues``: the verbatim tail goes on with the span's latest
    conversation (its goal is not answered yet). ``ledger``: the span's requests, when
    the caller has read them (``read_span_requests``). ``passed_values``: per indexed
    message, the values its calls passed (``noting_passed_values``); the arguments of a
    message it lacks are read for them.
    """
    messages = [m for g in span for m in g.messages if m.message.role not in INSTRUCTION_ROLES]
    outcomes = classify_calls(span) if outcomes is None else outcomes
    by_call = {outcome.call_id: outcome for outcome in outcomes}
    if ledger is None:
        ledger = read_span_requests(span, has_prior_goal=bool(prior and prior.goal),
                                    outcomes=outcomes, tail_continues=tail_continues)
    failures = [outcome for outcome in outcomes if outcome.failed]
    succeeded = _succeeded_tools(outcomes)
    fixed = _fixed_failures(outcomes, failures)
    sentences, whose = Sentences(), _Whose(ledger.parties)
    decisions = _draft_decisions(messages, counter, sentences, whose)
    # By identity: ``fixed`` holds some of these very failures (comparing each with each
    # by value cost ~30 ms at 1M tokens).
    fixed_ids = {id(failure) for failure in fixed}
    # An earlier party's errors are its own: its call lines say they failed.
    open_errors = [_describe_failure(f, counter) for f in failures
                   if id(f) not in fixed_ids and f.seq >= whose.current_seq]
    drafted = Summary(
        goal=_draft_goal(ledger, has_prior_goal=bool(prior and prior.goal), counter=counter),
        constraints_and_preferences=_draft_facts(messages, counter, sentences, whose),
        completed_actions=[*_describe_span(messages),
                           *_draft_actions(messages, counter, by_call, passed_values or {}),
                           *_draft_completions(ledger.agent_texts, counter, sentences)],
        key_decisions=decisions,
        resolved=[*_settled_pending(prior, messages, succeeded, until_seq=ledger.parties[-1]
                                    .first_seq if prior and prior.goal and ledger.goal
                                    else math.inf),
                  *_superseded(prior, decisions),
                  *(f"{ANSWERED}{_clip(t, SENTENCE_TOKENS, counter)}" for t in ledger.answered
                    if t not in ledger.open_requests),
                  *(f"{ACTED_ON}{_clip(t, SENTENCE_TOKENS, counter)}" for t in ledger.acted_on
                    if t not in ledger.open_requests),
                  *(f"Fixed: {_describe_failure(f, counter)}" for f in fixed)],
        pending=[*_draft_pending(span, ledger, counter),
                 *(f"{OPEN_ERROR}{error}" for error in open_errors)],
        relevant_artifacts=_rank_values(artifacts, ranked, failures, decisions, ledger),
        remaining_work=[],
    )
    return fit_summary(_without_repeats(drafted), budget_tokens, counter)


def _without_repeats(summary: Summary) -> Summary:
    """The same line twice (a retried call, a repeated report) says nothing new."""
    return summary.model_copy(update={name: list(dict.fromkeys(summary.items_of(name)))
                                      for name in LIST_SECTIONS})


def _rank_values(artifacts: Sequence[Artifact], ranked: Sequence[Artifact] | None,
                 failures: Sequence[Failure], decisions: Sequence[str],
                 ledger: RequestLedger) -> list[str]:
    featured = featured_values(failures, [*decisions, *ledger.open_requests], artifacts)
    order = (rank_artifacts(artifacts, featured=featured) if ranked is None
             else rerank_featured(ranked, featured))
    return [a.value for a in order if a.kind != "tool"][:MAX_ARTIFACTS]


def _draft_goal(ledger: RequestLedger, *, has_prior_goal: bool, counter: TokenCounter) -> str:
    if ledger.goal:
        return f"User request: {_clip(ledger.goal, GOAL_TOKENS, counter)}"
    if has_prior_goal or any(text.strip() for text in ledger.user_texts):
        return ""
    # No user words in the span: the agent's first words are the best available topic.
    topic = next((text for text in ledger.agent_texts if text.strip()), "")
    if topic:
        return f"Agent topic: {_clip(topic, GOAL_TOKENS, counter)}"
    # No words at all (empty parts, bare tool traffic): say so rather than leave no goal.
    return NO_WORDS_GOAL


def _describe_span(messages: Sequence[StoredMessage]) -> list[str]:
    """One line on what the span held: its seq range and messages by role."""
    if not messages:
        return []
    roles = [stored.message.role for stored in messages]
    counts = ", ".join(f"{roles.count(role)} {role.value}" for role in dict.fromkeys(roles))
    return [f"Compacted seq {messages[0].seq} to {messages[-1].seq}: {counts} messages"]


def _clip(text: str, max_tokens: int, counter: TokenCounter) -> str:
    return truncate_text(re.sub(r"\s+", " ", text).strip(), max_tokens, counter)


class _Whose:
    """Whose an item is: in a span of several parties, each item says its party's
    (``Party.label``); in a span of one, none needs to."""

    def __init__(self, parties: Sequence[Party]) -> None:
        self._parties = parties if len(parties) > 1 else ()
        self.current_seq = self._parties[-1].first_seq if self._parties else 0

    def __call__(self, seq: int) -> str:
        return party_of(self._parties, seq).label() if self._parties else ""


def _draft_facts(messages: Sequence[StoredMessage], counter: TokenCounter,
                 sentences: Sentences, whose: _Whose) -> list[str]:
    """Every fact sentence of the users' turns (``facts.find_facts``) but decisions, with
    whose it is, the newest ``MAX_FACTS`` distinct ones, in order."""
    # Distinct by party and words; a decision is listed with the decisions, not twice;
    # only the kept ones are clipped (an encode each).
    facts = dict.fromkeys((whose(seq), sentence)
                          for seq, sentence in find_facts(messages, sentences)
                          if not _DECISION.search(sentence))
    return list(dict.fromkeys(label + _clip(sentence, SENTENCE_TOKENS, counter)
                              for label, sentence in list(facts)[-MAX_FACTS:]))


def _draft_completions(agent_texts: Sequence[str], counter: TokenCounter,
                       sentences: Sentences) -> list[str]:
    """The agent's last reports of work done (not questions or conditionals about it)."""
    done = [s for s in sentences.of(agent_texts)
            if _DONE.search(s) and not _NOT_DONE.search(s)]
    latest = list(dict.fromkeys(done))[-MAX_COMPLETIONS:]
    return [_clip(sentence, SENTENCE_TOKENS, counter) for sentence in latest]


def _draft_decisions(messages: Sequence[StoredMessage], counter: TokenCounter,
                     sentences: Sentences, whose: _Whose) -> list[str]:
    """Decision sentences of either side, and user confirmations with what they confirm,
    each with whose it is."""
    decisions: list[str] = []
    asked = ""
    for stored in messages:
        message, text = stored.message, stored.said_text
        if message.role not in (Role.USER, Role.ASSISTANT):
            continue
        said, label = sentences[text], whose(stored.seq)
        if message.role is Role.ASSISTANT and text.strip():
            questions = [s for s in said if s.endswith("?")]
            asked = questions[-1] if questions else asked
        if message.role is Role.USER and _CONFIRMATION.match(text):
            context = f" (to: {_clip(asked, SENTENCE_TOKENS // 2, counter)})" if asked else ""
            decisions.append(
                f"{label}User confirmed: {_clip(text, SENTENCE_TOKENS, counter)}{context}")
            continue
        agent = message.role is Role.ASSISTANT
        decisions.extend(
            label + _clip(s, SENTENCE_TOKENS, counter) for s in said
            if _DECISION.search(s) or (agent and _AGENT_DECISION.search(s)))
    return list(dict.fromkeys(decisions))[-MAX_DECISIONS:]


@dataclass
class _Lookups:
    calls: int
    values: dict[str, None]  # distinct, in first-seen order


def _draft_actions(messages: Sequence[StoredMessage], counter: TokenCounter,
                   outcomes: Mapping[str, CallOutcome],
                   passed_values: Mapping[int, Sequence[str]]) -> list[str]:
    """Each call that changed something, with its outcome; look-ups tallied per tool."""
    lookups: dict[str, _Lookups] = {}
    actions: list[str] = []
    for stored in messages:
        calls = stored.message.tool_calls
        if not calls:
            continue
        passed = passed_values.get(stored.seq)
        if passed is None:  # a message stored before its identifiers were indexed
            passed = list(dict.fromkeys(value for call in calls for value, _ in
                                        find_identifiers(call.function.arguments)))
        for call in calls:
            name = call.function.name
            values = _call_values(call.function.arguments, passed)
            if _LOOKUP.match(name):
                tally = lookups.setdefault(name, _Lookups(0, {}))
                tally.calls += 1
                tally.values.update((v, None) for v in values[:MAX_CALL_VALUES])
                continue
            shown = ", ".join(values[:MAX_CALL_VALUES])
            outcome = outcomes.get(call.id)
            result = NO_RESULT if outcome is None else _say_outcome(outcome, counter)
            actions.append(f"called {name}({shown}){ARROW}{result}")
    looked = [f"looked up with {name} {TIMES}{t.calls}"
              + (f" ({', '.join(list(t.values)[:MAX_CALL_VALUES])})" if t.values else "")
              for name, t in lookups.items()]
    return looked + actions


def _call_values(arguments: str, passed: Sequence[str]) -> list[str]:
    """The identifiers a call passed, in argument order, of those its message ``passed``;
    a bare number with the argument's name (``order_id 1536995876``)."""
    found = [(arguments.find(value), value) for value in passed if value in arguments]
    return [label_number(value, (arguments,)) if is_bare_number(value) else value
            for _, value in sorted(found)]


def _say_outcome(outcome: CallOutcome, counter: TokenCounter) -> str:
    """A call's outcome as classified from its original result: failed with the line
    that says so, ok, or unknown (never "ok" for a result that does not say)."""
    if outcome.status is CallStatus.FAILED:  # its first line; an open error shows them all
        return SAID_FAILED + _clip(outcome.lines[0], SENTENCE_TOKENS, counter)
    if outcome.status is CallStatus.SUCCEEDED:
        return SAID_OK
    said = f" ({_clip(outcome.lines[0], RESULT_TOKENS, counter)})" if outcome.lines else ""
    return SAID_UNKNOWN + said


def _describe_failure(failure: Failure, counter: TokenCounter) -> str:
    return f"{failure.tool} failed: {_clip(' / '.join(failure.lines), SENTENCE_TOKENS, counter)}"


def _fixed_failures(outcomes: Sequence[CallOutcome], failures: Sequence[Failure]
                    ) -> list[Failure]:
    """Failures followed later in the span by a call of the same tool on the same target
    that succeeded."""
    failed_tools = {failure.tool for failure in failures}
    fixes = {(o.tool, o.target): o.seq for o in outcomes
             if o.status is CallStatus.SUCCEEDED and o.tool in failed_tools}
    return [f for f in failures if fixes.get((f.tool, f.target), -1) > f.seq]


def _succeeded_tools(outcomes: Sequence[CallOutcome]) -> dict[str, int]:
    """Each tool's last call in the span that succeeded: tool name → seq."""
    return {o.tool: o.seq for o in outcomes if o.status is CallStatus.SUCCEEDED}


def _settled_pending(prior: Summary | None, messages: Sequence[StoredMessage],
                     succeeded: Mapping[str, int], *, until_seq: float) -> list[str]:
    """The prior's pending items this span settles, copied verbatim: a request the agent
    answered, a call whose result arrived, an error whose tool has since succeeded
    (``succeeded``: ``_succeeded_tools`` of the span). Only before ``until_seq`` (where the
    span starts another conversation): the next party's exchange settles nothing of the
    earlier party's, whose open items stay open (``party_items.left_open``)."""
    if prior is None:
        return []
    answered = any(m.message.role is Role.ASSISTANT and m.message.text.strip()
                   for m in messages if m.seq < until_seq)
    result_ids = {m.message.tool_call_id for m in messages if m.message.role is Role.TOOL}
    return [item for item in prior.pending
            if (item.startswith(UNANSWERED) and answered)
            or any(f"({call_id})" in item for call_id in result_ids if call_id)
            or (item.startswith(OPEN_ERROR) and succeeded.get(
                item.removeprefix(OPEN_ERROR).split(" ", 1)[0], until_seq) < until_seq)]


def _superseded(prior: Summary | None, decisions: Sequence[str]) -> list[str]:
    """The prior's decisions that pin a version this span's decisions pin differently."""
    new_pins = _pins("\n".join(decisions))
    return [item for item in (prior.key_decisions if prior else [])
            if any(new_pins.get(name, value) != value for name, value in _pins(item).items())]


def _pins(text: str) -> dict[str, str]:
    """Pinned versions named in ``text``: package name → version."""
    return {match.group(1).casefold(): match.group(2) for match in _VERSION_PIN.finditer(text)}


def _draft_pending(span: Sequence[Group], ledger: RequestLedger, counter: TokenCounter
                   ) -> list[str]:
    pending = [f"{UNANSWERED}{_clip(text, SENTENCE_TOKENS, counter)}"
               for text in ledger.open_requests]
    for group in span:
        calls = {c.id: c.function.name for m in group.messages for c in m.message.tool_calls or ()}
        for call_id in group.unanswered_call_ids:
            pending.append(f"Tool call {calls.get(call_id, '?')} ({call_id}) has no result yet")
    return pending
