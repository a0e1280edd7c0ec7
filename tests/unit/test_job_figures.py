"""``JobFigures`` is the one list of a job's figures: the event, the runs row and the
README read it, and a summarizer's usage lands in it by name."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from worker.errors import Outcome
from worker.job.figures import JobFigures, figure_docs
from worker.job.outcome import event_field_docs, rejected_message_fields
from worker.job.values import JobRequest, JobTrace
from worker.summarizers import SummaryUsage

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_every_figure_is_documented_and_in_the_event() -> None:
    assert list(figure_docs()) == names(JobFigures)
    assert all(doc.strip() for doc in figure_docs().values())
    assert set(names(JobFigures)) <= set(event_field_docs())
    assert set(names(JobFigures)) <= set(rejected_message_fields(None, "r", "C", "m"))


def test_a_summarizers_usage_names_only_job_figures() -> None:
    assert set(names(SummaryUsage)) <= set(names(JobFigures))


def test_the_runs_row_holds_every_figure_with_the_outcome_reason_and_step_timings() -> None:
    trace = JobTrace(JobRequest("s", "test"), started_at=NOW)
    trace.record_figures(tokens_before=9_000, llm_calls=2)
    with trace.step("plan"):
        pass

    run = trace.new_run(Outcome.SKIPPED, "under_trigger", None, NOW)

    assert set(run.figures) == {*names(JobFigures), "outcome_reason", "durations_ms"}
    assert (run.figures["tokens_before"], run.figures["llm_calls"]) == (9_000, 2)
    assert run.figures["tokens_after"] is None
    assert (run.figures["outcome_reason"], list(run.figures["durations_ms"])) == \
        ("under_trigger", ["plan"])
