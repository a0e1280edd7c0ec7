"""The fidelity benchmark's figures, from what a model would see: a planted fact is kept
when its value occurs verbatim in the projection (system messages, the summary block and
the verbatim tail, tool-call arguments included), however it got there. Pure functions
over plain values: the runner observes, these count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.fidelity_sessions import Fact, PlantedSession
from bench.fidelity_truth import Untruths
from worker.compaction import SessionFormat, view_item

LAGS = (0, 1, 5, 10)  # compactions after the one that first covered a round's facts
SAID_SOURCES = frozenset({"user", "assistant", "tool_argument"})
OPEN_SECTIONS = ("pending", "remaining_work")


@dataclass(frozen=True)
class Observation:
    """The projection after one round's compaction, reduced to what the figures need."""

    round: int
    outcome: str
    through_seq: int
    summary_tokens: int  # of the rendered block's text: what the budget limits
    budget_tokens: int  # the job's budget: grows with what the summary covers
    history_tokens: int
    goal: str  # the summary's goal
    visible: frozenset[str]  # fact values that occur in the projection
    listed_open: frozenset[str]  # request keys the summary lists as pending or remaining
    recalled: frozenset[str] | None = None  # hidden values a recall found (first round only)
    untruths: Untruths = field(default_factory=Untruths)  # against the originals, the tail


@dataclass(frozen=True)
class SessionRun:
    """One session compacted round after round by one summarizer."""

    session: PlantedSession
    summarizer: str
    observations: tuple[Observation, ...]


def projection_text(projection: Iterable[Mapping[str, Any]],
                    session_format: SessionFormat = SessionFormat.CHAT) -> str:
    """Everything a model reads in the projection: texts and tool calls, one per line
    (of a Responses or Anthropic item: its view's, reasoning and thinking text included)."""
    parts: list[str] = []
    for body in projection:
        for message in view_item(session_format, dict(body)).chat_messages():
            parts.append(message.text)
            parts.extend(f"{call.function.name} {call.function.arguments}"
                         for call in message.tool_calls or ())
    return "\n".join(parts)


def visible_values(values: Iterable[str], text: str) -> frozenset[str]:
    """The values that occur verbatim in ``text``."""
    return frozenset(value for value in values if value in text)


def listed_open(keys: Iterable[str], summary: Mapping[str, Any] | None) -> frozenset[str]:
    """The request keys named by the summary's pending or remaining-work items."""
    if not summary:
        return frozenset()
    items = "\n".join(str(item) for name in OPEN_SECTIONS for item in summary.get(name) or ())
    return frozenset(key for key in keys if key in items)


def share(hits: int, total: int) -> float | None:
    """``hits`` of ``total`` in percent; None when there is nothing to count."""
    return round(100 * hits / total, 1) if total else None


def retention_rows(runs: Sequence[SessionRun], group: Callable[[Fact], str | None]
                   ) -> list[dict[str, Any]]:
    """Per group of the initial session's facts, after its first compaction: how many were
    planted, how many the summary replaced (seq ≤ through_seq), and the share visible."""
    tally: dict[str, list[int]] = {}
    for run in runs:
        first = run.observations[0]
        for fact in run.session.facts:
            name = group(fact) if fact.round == 0 else None
            if name is None:
                continue
            counts = tally.setdefault(name, [0, 0, 0, 0])
            compacted, seen = fact.seq <= first.through_seq, fact.value in first.visible
            counts[0] += 1
            counts[1] += seen
            counts[2] += compacted
            counts[3] += compacted and seen
    return [{"group": name, "facts": c[0], "visible_pct": share(c[1], c[0]),
             "compacted": c[2], "compacted_visible_pct": share(c[3], c[2])}
            for name, c in sorted(tally.items())]


def target_class(fact: Fact) -> str | None:
    """The class a target is set for: said identifiers, ended errors, pinned values."""
    if fact.pinned:
        return "decision's pinned value"
    if fact.ended_call:
        return "error that ended a tool call/test"
    return "identifier said by user/assistant" if fact.source in SAID_SOURCES else None


def lag_rows(runs: Sequence[SessionRun]) -> list[dict[str, Any]]:
    """Per round of first sighting: the share of its facts visible ``LAGS`` rounds on."""
    rounds = max((len(run.observations) for run in runs), default=0)
    rows = []
    for first_round in range(rounds):
        row: dict[str, Any] = {"round": first_round, "facts": 0}
        for lag in LAGS:
            hits = total = 0
            for run in runs:
                at = first_round + lag
                if at >= len(run.observations):
                    continue
                facts = [f for f in run.session.facts if f.round == first_round]
                visible = run.observations[at].visible
                total += len(facts)
                hits += sum(f.value in visible for f in facts)
            row[f"after_{lag}_pct"] = share(hits, total)
        row["facts"] = sum(1 for run in runs for f in run.session.facts if f.round == first_round)
        rows.append(row)
    return rows


def round_rows(runs: Sequence[SessionRun]) -> list[dict[str, Any]]:
    """Per round, over all sessions: summary tokens against the budget, stale items
    (requests whose answer the summary covers, still listed as open), the requests still
    open where the summary ends and how many it lists, and outcomes."""
    rows = []
    for index in range(max((len(run.observations) for run in runs), default=0)):
        present = [(run, run.observations[index]) for run in runs
                   if index < len(run.observations)]
        summary_tokens = [seen.summary_tokens for _, seen in present]
        rows.append({
            "round": index,
            "history_tokens": sum(seen.history_tokens for _, seen in present),
            "summary_tokens_max": max(summary_tokens),
            "summary_tokens_mean": round(sum(summary_tokens) / len(summary_tokens)),
            "budget_tokens_max": max(seen.budget_tokens for _, seen in present),
            "over_budget": sum(seen.summary_tokens > seen.budget_tokens for _, seen in present),
            # The compaction ratio: the blocks against all the sessions hold.
            "summary_pct_of_history": round(100 * sum(summary_tokens) / max(
                sum(seen.history_tokens for _, seen in present), 1), 1),
            "stale": sum(len(stale_keys(run, seen)) for run, seen in present),
            "open_requests": sum(len(open_keys(run, seen)) for run, seen in present),
            "open_listed": sum(len(set(open_keys(run, seen)) & seen.listed_open)
                               for run, seen in present),
            "joined_goals_current": _count_current_goals(present),
            "false_outcome_lines": sum(seen.untruths.false_outcomes for _, seen in present),
            "open_and_done": sum(seen.untruths.open_and_done for _, seen in present),
            "goals_answered_while_continued": sum(
                seen.untruths.goal_answered_while_continued for _, seen in present),
            "bare_numbers": sum(seen.untruths.bare_numbers for _, seen in present),
            "unlabelled_numbers": sum(seen.untruths.unlabelled_numbers for _, seen in present),
            "not_compacted": sum(seen.outcome != "compacted" for _, seen in present),
        })
    return rows


def _count_current_goals(present: Sequence[tuple[SessionRun, Observation]]) -> str:
    verdicts = [is_goal_current(run, seen) for run, seen in present]
    judged = [verdict for verdict in verdicts if verdict is not None]
    return f"{sum(judged)}/{len(judged)}" if judged else "-"


def is_goal_current(run: SessionRun, seen: Observation) -> bool | None:
    """Whether the goal names the last customer the summary covers (joined sessions only):
    a value that customer or the agent said to them."""
    session = run.session
    covered = [r.conversation for r in session.requests if r.seq <= seen.through_seq]
    if session.shape != "joined" or not covered:
        return None
    latest = max(covered)
    values = [f.value for f in session.facts if f.conversation == latest]
    values += [r.key for r in session.requests if r.conversation == latest]
    return any(value in seen.goal for value in values)


def open_keys(run: SessionRun, seen: Observation) -> list[str]:
    """Requests the summary covers that are still unanswered where it ends."""
    return [r.key for r in run.session.requests if r.seq <= seen.through_seq
            and (r.answered_seq is None or r.answered_seq > seen.through_seq)]


def stale_keys(run: SessionRun, seen: Observation) -> list[str]:
    """Requests answered within what the summary covers, yet listed as open by it."""
    return [r.key for r in run.session.requests
            if r.answered_seq is not None and r.answered_seq <= seen.through_seq
            and r.key in seen.listed_open]


def session_rows(runs: Sequence[SessionRun]) -> list[dict[str, Any]]:
    """One line per session: size, facts, first-compaction retention, last round's state."""
    rows = []
    for run in runs:
        first, last = run.observations[0], run.observations[-1]
        initial = [f for f in run.session.facts if f.round == 0]
        compacted = [f for f in initial if f.seq <= first.through_seq]
        tail = [f for f in initial if f.seq > first.through_seq]
        rows.append({
            "session": run.session.name, "tokens": run.session.round_tokens[0],
            "facts": len(initial), "compacted": len(compacted),
            "visible_pct": share(sum(f.value in first.visible for f in initial), len(initial)),
            "compacted_visible_pct": share(
                sum(f.value in first.visible for f in compacted), len(compacted)),
            "tail_facts": len(tail), "tail_visible": sum(f.value in first.visible for f in tail),
            "summary_tokens": first.summary_tokens, "rounds": len(run.observations) - 1,
            "last_summary_tokens": last.summary_tokens,
            "outcomes": ",".join(sorted({seen.outcome for seen in run.observations})),
        })
    return rows


def recall_figures(runs: Sequence[SessionRun]) -> dict[str, Any]:
    """Of the initial facts the first compaction hid, the share a recall finds."""
    hidden = found = 0
    for run in runs:
        first = run.observations[0]
        recalled = first.recalled or frozenset()
        gone = [f for f in run.session.facts if f.round == 0 and f.value not in first.visible]
        hidden += len(gone)
        found += sum(f.value in recalled for f in gone)
    return {"hidden": hidden, "recalled": found, "recalled_pct": share(found, hidden)}


def target_rows(runs: Sequence[SessionRun]) -> list[dict[str, Any]]:
    """Issue 12's targets (one round later and ten rounds later as issue 34 item 6 sets
    them), each with its figure and whether it is met."""
    classes = {row["group"]: row["visible_pct"] for row in retention_rows(runs, target_class)}
    kinds = retention_rows(runs, lambda fact: fact.kind)
    lowest = min(kinds, key=lambda row: row["visible_pct"] or 0.0, default=None)
    rounds, lags = round_rows(runs), lag_rows(runs)
    one_round_on = [row["after_1_pct"] for row in lags if row["after_1_pct"] is not None]
    rows = [_target(f"{name} visible", f">= {floor}%", classes.get(name), floor)
            for name, floor in (("identifier said by user/assistant", 95),
                                ("error that ended a tool call/test", 90),
                                ("decision's pinned value", 99))]
    rows.append(_target(f"lowest kind visible ({lowest['group'] if lowest else '-'})",
                        ">= 80%", lowest["visible_pct"] if lowest else None, 80))
    said = retention_rows(runs, lambda fact: fact.kind if fact.source in SAID_SOURCES else None)
    lowest_said = min(said, key=lambda row: row["visible_pct"] or 0.0, default=None)
    said_name = lowest_said["group"] if lowest_said else "-"
    rows.append(_target(f"lowest kind said by user/assistant visible ({said_name})", ">= 97%",
                        lowest_said["visible_pct"] if lowest_said else None, 97))
    if len(rounds) > 1:
        over = sum(row["over_budget"] for row in rounds)
        rows.append({"target": "summaries over budget, all rounds", "wanted": "0",
                     "figure": over, "met": over == 0})
        rows.append(_target("facts of each round visible one round later (lowest)",
                            ">= 95%", min(one_round_on, default=None), 95))
        ten_on = lags[0]["after_10_pct"] if lags else None
        if ten_on is not None:
            rows.append(_target("initial session's facts visible 10 rounds later",
                                ">= 90%", ten_on, 90))
        for name, key in (("false outcome lines (ok/failed against the originals)",
                           "false_outcome_lines"), ("items both open and done", "open_and_done"),
                          ("goals listed as answered while the tail continues them",
                           "goals_answered_while_continued"),
                          ("bare 9-12 digit numbers without their label", "unlabelled_numbers")):
            figure = sum(row[key] for row in rounds)
            rows.append({"target": f"{name}, all rounds", "wanted": "0", "figure": figure,
                         "met": figure == 0})
        stale = sum(row["stale"] for row in rounds[1:])
        rows.append({"target": "answered requests listed as open, rounds 1+", "wanted": "0",
                     "figure": stale, "met": stale == 0})
    return rows


def _target(name: str, wanted: str, figure: float | None, floor: float) -> dict[str, Any]:
    return {"target": name, "wanted": wanted, "figure": figure,
            "met": figure is not None and figure >= floor}
