"""What a job produces, pinned: a first and a second compaction of a generated tool-heavy
session (the demo generator's, ~50k tokens, then grown) write exactly these revisions
and run rows. Work that only makes a job cheaper must leave the digests unchanged; a
change of what a job writes must change them on purpose, here."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from scheduler.cli.demo_sessions import generate_sessions
from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter
from worker.compaction.intake import IntakePolicy
from worker.errors import Outcome
from worker.platform.ingest import ImportStatus, append_messages, import_sessions

SESSION = "s-pinned"
TARGET_TOKENS = 30_000
# sha256 of the canonical JSON of each job's revision and run row (durations left out).
PINNED = [
    "42af5863275a93a0941c02e108895425e7ca3722711817259a42f89ee4575ab2",
    "ccf8799eb32c935c6fbe89609f1f1905d13390560f4c7d54f3de139700bbab9a",
]


def demo_messages(target_tokens: int, seed: int) -> list[dict[str, Any]]:
    """Demo sessions joined end to end (one system prompt) until ~``target_tokens``."""
    messages: list[dict[str, Any]] = []
    index = 0
    while sum(len(json.dumps(m)) for m in messages) < target_tokens * 4:
        index += 1
        [record] = generate_sessions(1, seed * 1_000 + index)
        messages += [m for m in record["messages"] if m["role"] != "system" or not messages]
    while messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
        messages.pop()
    return messages


def job_digest(harness: JobHarness) -> str:
    revision = harness.store.revisions(SESSION)[0]
    [run] = [r for r in harness.store.runs(session_id=SESSION) if r.revision_id == revision.id]
    figures = {k: v for k, v in run.figures.items() if k != "durations_ms"}
    written = {"revision": dataclasses.asdict(revision),
               "run": {**dataclasses.asdict(run), "figures": figures}}
    canonical = json.dumps(written, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_a_first_and_a_second_compaction_write_the_pinned_revisions_and_runs() -> None:
    harness = JobHarness(shared_counter())
    harness.deps = dataclasses.replace(harness.deps, summarizer=harness.deps.fallback)
    harness.policy = dataclasses.replace(
        harness.policy, summary_budget_tokens=2_000,
        trigger=dataclasses.replace(harness.policy.trigger, trigger_tokens=20_000,
                                    floor_tokens=10_000, tail_budget_tokens=2_500))
    [report] = import_sessions(
        [{"session_id": SESSION, "messages": demo_messages(TARGET_TOKENS, seed=7)}],
        store=harness.store, counter=harness.counter, policy=IntakePolicy(),
        now=harness.clock())
    assert report.status is ImportStatus.IMPORTED, report

    digests = []
    for turn in range(2):
        result = harness.run(SESSION, force=turn > 0)
        assert result.outcome is Outcome.FALLBACK or result.outcome is Outcome.COMPACTED, result
        assert result.revision_id is not None
        digests.append(job_digest(harness))
        harness.clock.advance(60)
        append_messages(harness.store, harness.counter, IntakePolicy(), SESSION,
                        demo_messages(TARGET_TOKENS // 3, seed=8 + turn), harness.clock())
    assert digests == PINNED
