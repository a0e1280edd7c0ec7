"""The LLM summarizer: executes the core's chunk-and-merge plan through the LLM adapter.

It summarizes the span alone; the prior summary goes to the model as read-only context
(the pipeline updates the prior afterwards). Map calls of a round run concurrently (bounded); merge
rounds follow until one summary remains. The first call that fails for good stops the
job: a partial result is never returned. A context-length error re-plans once with
smaller chunks. Through a batch (``batch_replay.py``), a round's calls that wait for
their answers all put their request in the batch before the run stops.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy as _copy
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from worker.compaction import (
    PROMPT_VERSION,
    ChunkPlan,
    ModelPrice,
    Summary,
    TokenCounter,
    build_merge_messages,
    build_summarize_messages,
    output_budget_tokens,
    parse_summary,
    plan_summary_calls,
    price_calls,
    summary_json_schema,
)
from worker.errors import CompactionError, ContextOverflow, SessionFailure, SummaryInvalid
from worker.shared_state.rate_limit import FleetRateLimiter
from worker.summarizers.base import BatchPending, SummaryDraft, SummaryUsage, SummaryWork
from worker.summarizers.openai_client import LLMReply, LLMUsage

T = TypeVar("T")

# Identifiers listed in each prompt; the full index is kept in the revision.
PROMPT_IDENTIFIERS = 40
# On a context-length error the chunk budget shrinks to this share, once.
REPLAN_RATIO = 0.6


class CompletionClient(Protocol):
    """What the summarizer calls: the SDK client, or a job's batch replay of it."""

    @property
    def model(self) -> str: ...

    def complete_json(self, messages: list[dict[str, Any]], *, schema: dict[str, Any],
                      max_output_tokens: int, usage: LLMUsage | None = None) -> LLMReply: ...


class LLMSummarizer:
    """Summarizes a span through any OpenAI-compatible endpoint."""

    kind = "llm"
    uses_provider = True

    def __init__(self, client: CompletionClient, counter: TokenCounter, *, window_tokens: int,
                 margin_ratio: float, pinned_output_tokens: int | None, concurrency: int,
                 max_calls: int, rate_limiter: FleetRateLimiter | None = None,
                 price: ModelPrice | None = None) -> None:
        self._client = client
        self._counter = counter
        self._window_tokens = window_tokens
        self._margin_ratio = margin_ratio
        self._pinned_output_tokens = pinned_output_tokens
        self._concurrency = concurrency
        self._max_calls = max_calls
        self._rate_limiter = rate_limiter
        self._price = price  # None: the model's cost is unknown
        self._schema = summary_json_schema()

    def summarize(self, work: SummaryWork) -> SummaryDraft:
        usage = LLMUsage()
        try:
            try:
                summary, chunks, merge_rounds = self._run(work, usage, self._window_tokens)
            except ContextOverflow:
                # Our token counts undershot the endpoint's; retry once with more room.
                summary, chunks, merge_rounds = self._run(
                    work, usage, int(self._window_tokens * REPLAN_RATIO))
        except CompactionError as exc:
            exc.figures.update(self._usage_figures(usage))  # a failed job's cost too
            raise
        return SummaryDraft(summary=summary, kind=self.kind, model=self._client.model,
                            prompt_version=PROMPT_VERSION, usage=SummaryUsage(
                                **self._usage_figures(usage), chunks=chunks,
                                merge_rounds=merge_rounds))

    def with_client(self, client: CompletionClient) -> LLMSummarizer:
        """This summarizer calling through ``client`` (a job's batch replay) instead."""
        copy = _copy.copy(self)
        copy._client = client
        return copy

    def _usage_figures(self, usage: LLMUsage) -> dict[str, Any]:
        """The job figures of what the calls so far cost, priced when the model is: the
        calls a batch answered at the Batch API's discount, the others in full; a job
        that called nothing costs nothing."""
        totals = usage.as_dict()
        figures = _usage_figures(totals)
        if not figures["llm_calls"]:
            return {**figures, "llm_model": None, "cost_usd": 0.0}
        cost_usd = None
        if self._price is not None:
            batched = {kind: int(totals[f"batched_{kind}_tokens"])
                       for kind in ("prompt", "cached", "completion")}
            cost_usd = price_calls(
                self._price, prompt_tokens=figures["prompt_tokens"] - batched["prompt"],
                cached_tokens=figures["cached_tokens"] - batched["cached"],
                completion_tokens=figures["completion_tokens"] - batched["completion"],
            ) + price_calls(self._price, prompt_tokens=batched["prompt"],
                            cached_tokens=batched["cached"],
                            completion_tokens=batched["completion"], batch=True)
        return {**figures, "llm_model": self._client.model, "cost_usd": cost_usd}

    def plan_calls(self, work: SummaryWork) -> tuple[ChunkPlan, int]:
        """The calls ``summarize`` would make (before any replan) and each one's output
        budget, without making them: what ``compactor compact --dry-run`` shows."""
        identifiers, output_tokens = self._prompt_inputs(work)
        # Exact counts: the dry run shows the input tokens the calls would send.
        plan = self._plan(work, identifiers, output_tokens, self._window_tokens, exact=True)
        return plan, output_tokens

    def _prompt_inputs(self, work: SummaryWork) -> tuple[list[str], int]:
        identifiers = work.identifiers[:PROMPT_IDENTIFIERS]
        return identifiers, output_budget_tokens(work.span_tokens, self._pinned_output_tokens)

    def _run(self, work: SummaryWork, usage: LLMUsage, window_tokens: int
             ) -> tuple[Summary, int, int]:
        """The summary, and the numbers of map calls and merge rounds it took."""
        identifiers, output_tokens = self._prompt_inputs(work)
        plan = self._plan(work, identifiers, output_tokens, window_tokens, exact=False)
        # The rendered span leaves the plan for lists that each map call empties once its
        # prompt holds the text (a 1M-token span renders to ~1.6 MiB).
        chunk_texts = [[item.text for item in chunk.items] for chunk in plan.chunks]
        merge_rounds = plan.merge_rounds
        del plan
        single = len(chunk_texts) == 1
        with _alongside(work.prepare_update):
            partials = self._map(chunk_texts, work.prior if single else None, identifiers,
                                 output_tokens, usage)
            for batches in merge_rounds:
                final_round = len(batches) == 1
                partials = self._merge_round(partials, batches,
                                             work.prior if final_round else None,
                                             identifiers, output_tokens, usage)
        return partials[0], len(chunk_texts), len(merge_rounds)

    def _plan(self, work: SummaryWork, identifiers: Sequence[str], output_tokens: int,
              window_tokens: int, *, exact: bool) -> ChunkPlan:
        plan = plan_summary_calls(work.span, prior=work.prior, identifiers=identifiers,
                                  window_tokens=window_tokens, margin_ratio=self._margin_ratio,
                                  output_tokens=output_tokens,
                                  # Not the job's counter: it would keep every rendered
                                  # group (~1.6 MiB at 1M tokens) for the rest of the job,
                                  # and nothing after the calls counts them again.
                                  counter=self._counter, exact=exact)
        if plan.calls > self._max_calls:
            raise SessionFailure(
                f"the span needs {plan.calls} LLM calls, over llm_max_calls_per_job="
                f"{self._max_calls}", reason="too_many_calls")
        return plan

    def _map(self, chunk_texts: list[list[str]], prior: Summary | None,
             identifiers: Sequence[str], output_tokens: int, usage: LLMUsage
             ) -> list[Summary]:
        def summarize_chunk(texts: list[str]) -> Callable[[], Summary]:
            # Built in its call, not before the first: only the prompts of the calls in
            # flight exist, and the rendered span only until its prompt is built.
            def call() -> Summary:
                messages = build_summarize_messages(
                    _take_joined(texts), prior=prior, identifiers=identifiers,
                    budget_tokens=output_tokens)
                return self._call(messages, output_tokens, usage)

            return call

        return self._run_all([summarize_chunk(texts) for texts in chunk_texts])

    def _merge_round(self, partials: list[Summary], batches: Sequence[Sequence[int]],
                     prior: Summary | None, identifiers: Sequence[str], output_tokens: int,
                     usage: LLMUsage) -> list[Summary]:
        def merge_batch(batch: Sequence[int]) -> Callable[[], Summary]:
            if len(batch) == 1:
                return lambda: partials[batch[0]]
            messages = build_merge_messages([partials[i] for i in batch], prior=prior,
                                            identifiers=identifiers, budget_tokens=output_tokens)
            return lambda: self._call(messages, output_tokens, usage)

        return self._run_all([merge_batch(batch) for batch in batches])

    def _call(self, messages: list[dict[str, Any]], output_tokens: int,
              usage: LLMUsage) -> Summary:
        reply = self._complete(messages, output_tokens, usage)
        if reply.is_truncated:
            # One more try with twice the room, then the summary counts as truncated.
            reply = self._complete(messages, output_tokens * 2, usage)
            if reply.is_truncated:
                raise SummaryInvalid("the summary was cut off at the output limit twice",
                                     reason="truncated")
        return parse_summary(reply.content)

    def _complete(self, messages: list[dict[str, Any]], output_tokens: int,
                  usage: LLMUsage) -> Any:
        if self._rate_limiter is not None:
            self._rate_limiter.acquire()
        return self._client.complete_json(messages, schema=self._schema,
                                          max_output_tokens=output_tokens, usage=usage)

    def _run_all(self, calls: Sequence[Callable[[], T]]) -> list[T]:
        """Run calls with bounded concurrency; the first failure cancels the rest."""
        if len(calls) == 1:
            return [calls[0]()]
        with ThreadPoolExecutor(max_workers=self._concurrency) as pool:
            # Each call runs in a copy of this thread's context: its LLM span's parent
            # is the job's step, its log lines carry the task's ids.
            futures: list[Future[T]] = [pool.submit(contextvars.copy_context().run, call)
                                        for call in calls]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            if any(isinstance(future.exception(), BatchPending) for future in done):
                # Every call of the round puts its request in the batch, none cancelled.
                done, pending = wait(futures)
            for future in pending:
                future.cancel()
            for future in futures:
                if future in done and future.exception() is not None:
                    raise future.exception()  # type: ignore[misc]  # checked not None
            return [future.result() for future in futures]


@contextmanager
def _alongside(task: Callable[[], None]) -> Iterator[None]:
    """Run ``task`` on its own thread while the block waits on the model (the job's local
    work after the call then shrinks by what ``task`` did); leaving waits for it."""
    def run() -> None:
        # Only work done ahead: whatever fails here, the step that needs it does again
        # and fails there, as the job's error.
        with contextlib.suppress(Exception):
            task()

    thread = threading.Thread(target=run, name="summary-prepare", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _take_joined(texts: list[str]) -> str:
    """A chunk's text, its items emptied out: the prompt built from it holds them next."""
    joined = "\n\n".join(texts)
    texts.clear()
    return joined


def _usage_figures(totals: dict[str, int | float]) -> dict[str, Any]:
    """The job figures of what the calls so far cost."""
    return {"llm_calls": int(totals["calls"]), "prompt_tokens": int(totals["prompt_tokens"]),
            "cached_tokens": int(totals["cached_tokens"]),
            "completion_tokens": int(totals["completion_tokens"]),
            "llm_retries": int(totals["retries"]),
            "llm_latency_s": round(totals["latency_s"], 3)}
