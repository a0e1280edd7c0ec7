"""A job encodes no more than its span plus one summary: token counts of the stored
messages come from ingest, and what the summarizer counted (its lines, its block) the
summary update and validation do not encode again (``TokenCounter.for_job``). Counted on the real
encoding, wrapped, for whole jobs on the in-memory store."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from tests.support.generated import generated_session, generated_turns
from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter
from tests.unit.test_counting_once import CountingEncoding
from worker.compaction import parse_message
from worker.compaction.intake import IntakePolicy
from worker.compaction.tokens import JobCounter, TokenCounter
from worker.errors import Outcome
from worker.job.values import JobResult
from worker.platform.ingest import append_messages, check_record, count_messages

SESSION = "s-encoding"


def with_summarizer(harness: JobHarness, summarizer: str) -> JobHarness:
    """``harness`` with the named summarizer: "llm" (its scripted one) or "extractive"."""
    if summarizer == "extractive":
        harness.deps = dataclasses.replace(harness.deps, summarizer=harness.deps.fallback)
    return harness


def counting_harness(summarizer: str) -> tuple[JobHarness, CountingEncoding]:
    """A harness with the named summarizer whose counter's encoding counts its calls."""
    encoding = CountingEncoding(shared_counter().encoding)
    return with_summarizer(JobHarness(TokenCounter(cast(Any, encoding))), summarizer), encoding


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
    harness, encoding = counting_harness(summarizer)
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


@pytest.mark.parametrize("summarizer", ["extractive", "llm"])
def test_a_job_encodes_no_identifier_line_ingest_counted_and_summarizes_as_if_it_had(
    summarizer: str,
) -> None:
    counted, encoding = counting_harness(summarizer)
    # The same session as stored before ingest kept line counts (four-field mentions).
    uncounted = with_summarizer(JobHarness(shared_counter()), summarizer)
    counted.add_session(SESSION, 40)
    _, metadata, checked = check_record(generated_session(SESSION, 40), IntakePolicy())
    uncounted.store.import_session(SESSION, metadata, [
        dataclasses.replace(row, identifiers=tuple(
            cast(Any, mention[:4]) for mention in row.identifiers or ()))
        for row in count_messages(checked.messages, shared_counter())], uncounted.clock())
    stored = [mention for message in counted.store.messages(SESSION)
              for mention in message.identifiers or () if mention[1] != "tool"]
    assert stored and all(mention[4] is not None for mention in stored)

    run_counted(counted, encoding)
    assert uncounted.run(SESSION).outcome is Outcome.COMPACTED

    encoded = "".join(encoding.texts)
    lines = {f"- {value}\n" for value, *_ in stored}
    assert [line for line in lines if line in encoded] == []
    [revision] = counted.store.revisions(SESSION)
    [as_before] = uncounted.store.revisions(SESSION)
    assert (revision.summary, revision.summary_tokens) == \
        (as_before.summary, as_before.summary_tokens)


def test_the_job_counter_answers_the_lines_of_stored_counts_and_encodes_the_rest() -> None:
    encoding = CountingEncoding(shared_counter().encoding)
    job = TokenCounter(cast(Any, encoding)).for_job()
    assert isinstance(job, JobCounter)
    job.use_line_counts([("- R1\n", 99), ("- R2\n", 98)])  # figures no encoding gives

    assert job.count_lines(["- R1\n", "- R3\n", "- R1\n"]) == \
        [99, shared_counter().count_text("- R3\n"), 99]
    assert job.count_text("R2") == shared_counter().count_text("R2")  # not a line
    assert encoding.texts == ["- R3\n", "R2"]
