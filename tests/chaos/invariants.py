"""The checks of every session after the chaos run, and the counts it prints.

Per session: the stored history equals the ledger message by message; the projection is
valid for the chat API and is instructions + block + every later message; the active
revision's chain is intact, every revision of the session is on it and no two share a
parent (at most one revision per snapshot); each revision was written with exactly one
``compacted`` run pointing at it (a swap is never half-written); and the session ended
compacted, unchanged with a recorded failure, or breaker-open.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from db import RunRecord, SessionState, Store
from tests.chaos.traffic import Ledger
from tests.support.chaos import check_stored_session

MAX_RUNS_PER_SESSION = 10_000


class Ending(StrEnum):
    COMPACTED = "compacted"
    FAILED = "unchanged_with_failure"
    BREAKER_OPEN = "breaker_open"
    UNSETTLED = "unsettled"


VIOLATION_KINDS = ("lost_or_altered_messages", "invalid_projections", "broken_revision_chains",
                   "half_written_swaps", "unsettled_sessions", "false_successes",
                   "traffic_problems", "worker_crashes", "beat_crashes", "stranded_markers",
                   "stranded_leases", "broker_not_empty", "attempts_without_event",
                   "attempts_without_run",
                   "runs_not_recorded", "poison_not_refused_once", "hostile_headers_obeyed",
                   "healthy_not_compacted", "cached_token_counts_wrong",
                   "llm_calls_over_plan", "acknowledged_appends_erased")


@dataclass
class Verdict:
    """What the checks found over all sessions."""

    endings: Counter[str] = field(default_factory=Counter)
    session_endings: dict[str, str] = field(default_factory=dict)
    runs: Counter[str] = field(default_factory=Counter)
    revisions: int = 0
    over_trigger_at_end: int = 0
    violation_kinds: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    _by_kind: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, problems: list[str]) -> None:
        if problems:
            self.violation_kinds[kind] += len(problems)
            self.violations.extend(problems)
            self._by_kind.setdefault(kind, []).extend(problems)

    def examples(self, per_kind: int) -> list[str]:
        """The first few violations of each kind, named by it."""
        return [f"[{kind}] {problem}" for kind, problems in self._by_kind.items()
                for problem in problems[:per_kind]]


def classify(session: SessionState, runs: list[RunRecord]) -> Ending:
    if session.breaker_state == "open":
        return Ending.BREAKER_OPEN
    if session.active_revision_id is not None:
        return Ending.COMPACTED
    if any(run.outcome == "failed" and run.failure_class for run in runs):
        return Ending.FAILED
    return Ending.UNSETTLED


def check_all_sessions(store: Store, ledger: Ledger, *, never_compacted: set[str],
                       trigger_tokens: int) -> Verdict:
    """Check every session of the ledger; ``never_compacted`` are sessions whose every
    summary is malformed (they must not end compacted)."""
    verdict = Verdict()
    for problem in ledger.problems:
        verdict.add("traffic_problems", [problem])
    for session_id in ledger.session_ids():
        check_session(store, ledger, session_id, verdict,
                      must_fail=session_id in never_compacted, trigger_tokens=trigger_tokens)
    return verdict


def check_session(store: Store, ledger: Ledger, session_id: str, verdict: Verdict, *,
                  must_fail: bool, trigger_tokens: int) -> None:
    stored = check_stored_session(store, session_id, ledger.expected(session_id))

    def named(problems: list[str]) -> list[str]:
        return [f"{session_id}: {problem}" for problem in problems]

    verdict.add("lost_or_altered_messages", named(stored.history))
    verdict.add("invalid_projections", named(stored.projection))
    verdict.add("broken_revision_chains", named(stored.revisions))
    session = store.get_session(session_id)
    runs = store.runs(session_id=session_id, limit=MAX_RUNS_PER_SESSION)
    revisions = store.revisions(session_id)
    verdict.add("half_written_swaps", named(find_half_written(runs, [r.id for r in revisions])))
    ending = classify(session, runs)
    if ending is Ending.UNSETTLED:
        verdict.add("unsettled_sessions", named([
            f"ended neither compacted, failed nor breaker-open ({len(runs)} runs, "
            f"projection {session.projection_tokens} tokens, breaker "
            f"{session.breaker_state}/{session.breaker_failures}, last appended "
            f"{session.last_appended_at})"]))
    if must_fail and ending is Ending.COMPACTED:
        verdict.add("false_successes", named(["compacted although every summary was "
                                              "malformed"]))
    verdict.endings[ending.value] += 1
    verdict.session_endings[session_id] = ending.value
    verdict.runs.update(run.outcome for run in runs)
    verdict.revisions += len(revisions)
    verdict.over_trigger_at_end += int(session.projection_tokens > trigger_tokens)


def find_half_written(runs: list[RunRecord], revision_ids: list[int]) -> list[str]:
    """A swap writes its revision and its ``compacted`` run in one transaction: each
    revision has exactly one run naming it, and only ``compacted`` runs name one."""
    written_by = Counter(run.revision_id for run in runs if run.revision_id is not None)
    problems = [f"revision {rid} is named by {written_by[rid]} runs, not one"
                for rid in revision_ids if written_by[rid] != 1]
    problems += [f"run {run.id} ({run.outcome}) names a revision" for run in runs
                 if run.revision_id is not None and run.outcome != "compacted"]
    problems += [f"run {run.id} names revision {run.revision_id} of another session"
                 for run in runs if run.revision_id is not None
                 and run.revision_id not in revision_ids]
    return problems
