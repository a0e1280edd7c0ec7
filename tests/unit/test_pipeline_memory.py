"""While the summarizer runs, no frame of the job still holds the stored span: the plan
that carried it (every old tool output in full) has been dropped for its pruned copy."""

from __future__ import annotations

import gc

from tests.support.job_harness import JobHarness
from tests.unit.session_strategies import shared_counter
from worker.errors import Outcome
from worker.job.planning import JobPlan

SESSION = "s-memory"


def test_no_plan_with_the_stored_span_is_alive_while_the_summarizer_runs() -> None:
    harness = JobHarness(shared_counter())
    harness.add_session(SESSION, 20)
    plans_with_span: list[int] = []

    def count_plans_with_span() -> None:
        # type(), not isinstance(): that reads __class__, which evaluates lazy proxies
        # (Celery's current_app among them) and changes other tests' state.
        gc.collect()
        plans_with_span.append(sum(1 for o in gc.get_objects()
                                   if type(o) is JobPlan and o.boundary.span))

    harness.summarizer.before = count_plans_with_span

    result = harness.run(SESSION)

    assert result.outcome is Outcome.COMPACTED
    assert plans_with_span == [0]
