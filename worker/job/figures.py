"""The job's figures: one frozen dataclass that feeds the runs row, the ``compaction.job``
event and the README's field table (generated from it). A new figure is one field here
with its ``doc``, set by the step that measures it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _figure(doc: str) -> Any:
    return field(default=None, metadata={"doc": doc})


@dataclass(frozen=True)
class JobFigures:
    """What a job measured; ``None`` where it never got that far."""

    decision: str | None = _figure("the plan's decision (`over_trigger`, `forced`, "
                                   "`under_trigger`, `anti_thrash`, `thrash_lifted`)")
    tokens_before: int | None = _figure("tokens of the projection before the job")
    tokens_after: int | None = _figure("tokens of the projection after the swap")
    span_tokens: int | None = _figure("tokens of the messages summarized this time "
                                      "(the new span)")
    span_messages: int | None = _figure("messages summarized this time")
    summary_tokens: int | None = _figure("tokens of the rendered summary block")
    artifacts: int | None = _figure("identifiers indexed from the span (paths, error codes, "
                                    "ids, versions, URLs)")
    identifiers_reattached: int | None = _figure(
        "the span's identifiers the summary left out (a bare number: or held without its "
        "label) that the update put back verbatim, most salient first, as far as the budget "
        "allows")
    identifiers_recall_only: int | None = _figure(
        "the span's identifiers (tool names aside) the block does not carry: each one "
        "recall away (`compactor recall`), never lost")
    llm_calls: int | None = _figure("LLM requests made, by a failed job too (its cost: "
                                    "the token figures as well); 0 for the extractive summarizer")
    prompt_tokens: int | None = _figure("prompt tokens the endpoint reported, summed over "
                                        "the calls")
    cached_tokens: int | None = _figure("of the prompt tokens, those the endpoint served "
                                        "from its prompt cache (`prompt_tokens_details."
                                        "cached_tokens`), summed over the calls")
    completion_tokens: int | None = _figure("completion tokens the endpoint reported, "
                                            "summed over the calls")
    llm_retries: int | None = _figure("SDK-level retries of transient LLM errors")
    llm_latency_s: float | None = _figure("LLM call latency summed over the calls (s; "
                                          "concurrent calls overlap)")
    chunks: int | None = _figure("map chunks of chunk-and-merge: 1 when the span fit one "
                                 "call, 0 for the extractive summarizer (no calls)")
    merge_rounds: int | None = _figure("reduce rounds of chunk-and-merge (0 for one chunk)")
    llm_model: str | None = _figure("the model the LLM calls went to (null: no call)")
    cost_usd: float | None = _figure(
        "what the LLM calls cost (USD), priced by `llm_prices` for `llm_model`: uncached "
        "prompt, cached prompt and completion tokens each at their price; 0 when the job "
        "made no call, null when it never summarized or the model has no price")

    def as_dict(self) -> dict[str, Any]:
        """Every figure by name (``None`` included): the event's and the runs row's keys."""
        return dataclasses.asdict(self)


def figure_docs() -> dict[str, str]:
    """Each figure's name and meaning, in declaration order (the README's rows)."""
    return {f.name: str(f.metadata["doc"]) for f in dataclasses.fields(JobFigures)}
