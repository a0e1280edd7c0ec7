"""A job encodes no more than its span plus one summary: token counts of the stored
messages come from ingest, and what the summarizer counted (its lines, its block) the
merge and validation do not encode again (``TokenCounter.for_job``). Counted on the real
encoding, wrapped, for whole jobs on the in-memory store."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from tests.support.generated import generated_turns
from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter
from tests.unit.test_counting_once import CountingEncoding
from worker.compaction import parse_message
from worker.compaction.intake import IntakePolicy
from worker.compaction.tokens import TokenCounter
from worker.errors import Outcome
from worker.ingest import append_messages
from worker.job import JobResult

SESSION = "s-encoding"


def run_counted(harness: JobHarness, encoding: CountingEncoding) -> JobResult:
    encoding.calls, encoding.encoded_tokens = 0, 0
    encoding.texts.clear()
    result = harness.run(SESSION)
    assert result.outcome is Outcome.COMPACTED, result
    return result


@pytest.mark.parametrize("summarizer", ["extractive", "llm"])
def test_a_first_and_a_second_compaction_encode_at_most_the_span_and_one_summary(
    summarizer: str,
) -> None:
    encoding = CountingEncoding(shared_counter().encoding)
    harness = JobHarness(TokenCounter(cast(Any, encoding)))
    if summarizer == "extractive":
        harness.deps = dataclasses.replace(harness.deps, summarizer=harness.deps.fallback)
    harness.add_session(SESSION, 40)

    for turn in range(2):
        result = run_counted(harness, encoding)
        span_tokens, summary_tokens = result.figures.span_tokens, result.figures.summary_tokens
        assert span_tokens and summary_tokens
        assert encoding.encoded_tokens <= span_tokens + summary_tokens, \
            (turn, encoding.calls, encoding.encoded_tokens, span_tokens, summary_tokens)
        # No text is encoded twice in one job.
        repeated = {text for text in encoding.texts if encoding.texts.count(text) > 1}
        assert repeated == set(), repeated
        append_messages(harness.store, harness.counter, IntakePolicy(), SESSION,
                        generated_turns(f"{SESSION}-{turn}", 30), harness.clock())


def test_the_job_counter_encodes_a_text_once_and_counts_as_the_plain_one() -> None:
    encoding = CountingEncoding(shared_counter().encoding)
    plain = TokenCounter(cast(Any, encoding))
    job = plain.for_job()
    message = parse_message({"role": "user", "content": "Reservation R1 is confirmed"})

    assert [job.count_message(message) for _ in range(3)] == [plain.count_message(message)] * 3
    assert encoding.texts.count("Reservation R1 is confirmed") == 2  # plain once, job once
