"""How `compactor compact --dry-run` prints the plans of the jobs it would run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.cli.common import (
    print_json,
    readable_table,
    shown,
    stdout_console,
)

if TYPE_CHECKING:
    from worker.job.preview import CompactionPreview


def print_compaction_plans(previews: list[CompactionPreview], as_json: bool) -> None:
    """One JSON object per session, or a table with a line of totals."""
    if as_json:
        for preview in previews:
            print_json(preview)
        return
    table = readable_table("session", "decision", "span seqs", "span tok", "tail tok",
                           "calls", "est. in", "max out",
                           title="compaction plan (nothing run or written)",
                           shrink=("session", "decision"))
    for preview in previews:
        span = (f"{preview.span_first_seq}-{preview.span_last_seq}"
                if preview.span_first_seq is not None else "-")
        # A skip's reason (under_trigger, nothing_to_summarize, ...) says it all.
        decision = (preview.skip_reason or (preview.failure and f"fails: {preview.failure}")
                    or preview.decision or "-")
        table.add_row(shown(preview.session_id), shown(decision), span, f"{preview.span_tokens:,}",
                      f"{preview.tail_tokens:,}", str(preview.llm_calls),
                      f"{preview.est_input_tokens:,}", f"{preview.max_output_tokens:,}")
    console = stdout_console()
    console.print(table)
    compacted = sum(p.skip_reason is None and p.failure is None for p in previews)
    console.print(
        f"{compacted} of {len(previews)} sessions would be compacted; "
        f"{sum(p.llm_calls for p in previews)} LLM calls, about "
        f"{sum(p.est_input_tokens for p in previews):,} tokens in and at most "
        f"{sum(p.max_output_tokens for p in previews):,} out", highlight=False)
