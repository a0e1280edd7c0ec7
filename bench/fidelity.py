"""What a summary keeps. Sessions with planted facts (bench/fidelity_sessions.py) are
imported into a real store, compacted by the real job (``worker.job.pipeline.run`` with the
dependencies a worker builds), then grown by 20% of their size and re-compacted, round
after round; with the extractive summarizer, and with the LLM summarizer through the
OpenAI-protocol test server, whose summaries are built from the prompt it is given (so the
figures measure the prompt, the validation and the re-attachment, not a model).

Every job is forced (a small growth is compacted too). The tail is min(8,000, a tenth of
the session) tokens; the summary budget (unless ``--summary-budget`` fixes it) and
everything else are the production defaults.

Truth: after each job the active summary is read against the original messages it covers
and the verbatim tail (``bench.fidelity_truth.count_untruths``): its lines that state a
call outcome (ok / failed) the classification of the call's original result refutes, its
items listed both as open and as done, the goal listed as answered or done while the tail
goes on with it, and the bare 9-12 digit numbers it lists without their label.
The same is measured over the shared corpus's sessions (``--corpus``, one forced job
each), where present.

``--format responses|anthropic`` runs the same sessions rewritten in that format, round
by round (``tests/support/wire_convert.py``: reasoning or thinking added); the corpus's
truth is measured on chat sessions only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.fidelity_figures import (
    Observation,
    SessionRun,
    lag_rows,
    listed_open,
    projection_text,
    recall_figures,
    retention_rows,
    round_rows,
    session_rows,
    target_class,
    target_rows,
    visible_values,
)
from bench.fidelity_sessions import SHAPES, PlantedSession, generate_session
from bench.fidelity_truth import Untruths, count_untruths
from bench.report import bench_parser, describe_machine, print_header, print_load, print_table
from db import NewMessage, RevisionRecord, Store, upgrade_database
from tests.support.corpus import corpus_path, load_corpus
from tests.support.openai_server import OpenAIServer
from tests.support.wire_convert import chat_to_anthropic, chat_to_responses
from worker.compaction import (
    IntakePolicy,
    SessionFormat,
    SummaryBudget,
    TokenCounter,
    content_text,
    parse_message,
)
from worker.job import pipeline
from worker.job.values import JobRequest
from worker.platform.formats import check_items, count_system_prompt, item_rows
from worker.platform.ingest import count_messages
from worker.runtime import Runtime, build_runtime
from worker.settings.config import Settings
from worker.tokenizer.offline import load_encoding

DEFAULT_SIZES = (10_000, 50_000, 200_000)
FULL_SIZES = (*DEFAULT_SIZES, 1_000_000)
QUICK_SIZES = (8_000,)
TARGET_MAX_TOKENS = 200_000  # issue 12 sets its targets for sessions up to this size
SUMMARIZERS = ("extractive", "llm")
# Imported sessions were last appended to long ago: no quiet-period effects.
IMPORTED_AGO = timedelta(days=1)


def main() -> None:
    args = _parse_args()
    print_header(f"fidelity: {args.rounds} rounds of +{args.growth:.0%} growth, "
                 f"{args.format} sessions")
    counter = TokenCounter(load_encoding())
    sessions = [generate_session(shape, size, rounds=args.rounds, growth_ratio=args.growth,
                                 seed=args.seed, counter=counter)
                for shape in args.shapes for size in args.sizes]
    _progress(f"{len(sessions)} sessions, {sum(len(s.facts) for s in sessions):,} facts")
    report: dict[str, Any] = {
        "machine": describe_machine(), "summary_budget_tokens": args.summary_budget,
        "command": ["python", "-m", "bench.fidelity", *sys.argv[1:]],
        "rounds": args.rounds, "growth_ratio": args.growth, "summarizers": {}}
    with ExitStack() as stack:
        url = stack.enter_context(_database(args.database_url))
        base_url = None
        if "llm" in args.summarizers:
            base_url = stack.enter_context(OpenAIServer(latency_ms=0)).base_url
        for kind in args.summarizers:
            runs = [_compact_rounds(session, kind, url, base_url, counter,
                                    SessionFormat(args.format), args.summary_budget)
                    for session in sessions]
            report["summarizers"][kind] = _figures(runs)
            report["summarizers"][kind]["corpus_truth"] = [
                _corpus_truth(name, kind, url, base_url, counter) for name in args.corpus
                if corpus_path(name).is_file() and args.format == SessionFormat.CHAT]
    print_load()
    for kind, figures in report["summarizers"].items():
        _print_figures(kind, figures)
        print(f"\ntruth over the corpus ({kind}: one forced job per session):")
        _print_rows(figures["corpus_truth"])
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _parse_args() -> argparse.Namespace:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--full", action="store_true", help="add 1,000,000-token sessions")
    parser.add_argument("--sizes", type=_ints, default=None, help="session tokens, a,b,c")
    parser.add_argument("--shapes", type=lambda text: text.split(","), default=list(SHAPES))
    parser.add_argument("--summarizers", type=lambda text: text.split(","),
                        default=list(SUMMARIZERS), help="extractive,llm")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--growth", type=float, default=0.20, help="share of the session")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--format", choices=[f.value for f in SessionFormat],
                        default=SessionFormat.CHAT.value, help="the sessions' format")
    parser.add_argument("--corpus", type=lambda text: [n for n in text.split(",") if n],
                        default=None, help="corpus files to measure truth on "
                        "(default dev,dev_long; none with --quick)")
    parser.add_argument("--summary-budget", type=int, default=None,
                        help="a fixed summary budget in tokens (default: the growing one)")
    parser.add_argument("--database-url", default=None,
                        help="a throwaway database (default: a temporary SQLite file)")
    parser.add_argument("--json", default=None, help="also write the report here (path)")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else FULL_SIZES if args.full else DEFAULT_SIZES
    if args.corpus is None:
        args.corpus = [] if args.quick else ["dev", "dev_long"]
    if args.quick:
        args.rounds = min(args.rounds, 2)
    return args


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextmanager
def _database(url: str | None) -> Iterator[str]:
    """The given database, migrated, or a temporary SQLite file removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="fidelity-") as folder:
        url = url or f"sqlite:///{folder}/fidelity.db"
        upgrade_database(url)
        yield url


def _runtime(database_url: str, summarizer: str, base_url: str | None, tokens: int,
             summary_budget_tokens: int | None = None) -> Runtime:
    values: dict[str, object] = {"database_url": database_url, "summarizer": summarizer,
                                 "tail_budget_tokens": min(8_000, tokens // 10)}
    if summary_budget_tokens:  # a fixed budget: no growth with the span
        values.update(summary_budget_tokens=summary_budget_tokens,
                      summary_budget_span_ratio=0.0,
                      summary_budget_max_tokens=summary_budget_tokens)
    if base_url:
        values["llm_base_url"] = base_url
    return build_runtime(Settings.model_validate(values), use_redis=False)


def _rows(messages: Sequence[dict[str, Any]], session_format: SessionFormat, round_index: int,
          counter: TokenCounter) -> tuple[list[NewMessage], dict[str, Any], list[int]]:
    """One round's messages as store rows in ``session_format``, with the metadata an
    imported session of it holds (an Anthropic session's system prompt), and the index of
    the round's chat message each row came from (the planted facts' seqs are chat seqs)."""
    if session_format is SessionFormat.CHAT:
        rows = count_messages([parse_message(m) for m in messages], counter)
        return rows, {}, list(range(len(rows)))
    metadata: dict[str, Any] = {}
    origins: list[int] = []
    if session_format is SessionFormat.RESPONSES:
        items = chat_to_responses(list(messages), seed=round_index + 1, origins=origins)
    else:
        system, items = chat_to_anthropic(list(messages), seed=round_index + 1,
                                          origins=origins)
        metadata = {"system": system} if system else {}
    checked = check_items(session_format, items, IntakePolicy.strict(),
                          is_append=round_index > 0)
    if checked.rejected:
        raise ValueError(f"round {round_index} refused: {checked.problems[:3]}")
    return item_rows(session_format, checked, counter), metadata, origins


def _compact_rounds(session: PlantedSession, summarizer: str, database_url: str,
                    base_url: str | None, counter: TokenCounter,
                    session_format: SessionFormat = SessionFormat.CHAT,
                    summary_budget_tokens: int | None = None) -> SessionRun:
    """Import the session, compact it, then grow and re-compact it round by round."""
    session_id = f"fidelity-{uuid.uuid4().hex[:8]}-{summarizer}-{session.name}"
    runtime = _runtime(database_url, summarizer, base_url, session.round_tokens[0],
                       summary_budget_tokens)
    store, now = runtime.store, datetime.now(UTC) - IMPORTED_AGO
    observations: list[Observation] = []
    history_tokens = 0
    chat_seqs = [0]  # by stored seq: the seq of the chat message it came from (0: none)
    try:
        for index, messages in enumerate(session.rounds):
            rows, metadata, origins = _rows(messages, session_format, index, counter)
            chat_offset = sum(len(earlier) for earlier in session.rounds[:index])
            chat_seqs += [chat_offset + origin + 1 for origin in origins]
            history_tokens += sum(row.tokens for row in rows)
            if index == 0:
                store.import_session(session_id, {"bench": "fidelity", **metadata}, rows, now,
                                     session_format=session_format.value,
                                     system_tokens=count_system_prompt(session_format,
                                                                       metadata, counter))
            else:
                store.append_messages(session_id, rows, now=now)
            began = time.monotonic()
            result = pipeline.run(JobRequest(session_id, "bench", force=True), runtime.deps,
                                  runtime.policy)
            observations.append(_observe(store, session_id, session, index,
                                         result.outcome.value, history_tokens, counter,
                                         runtime.policy.summary_budget, session_format,
                                         chat_seqs))
            _progress(f"{summarizer} {session.name} round {index}/{len(session.rounds) - 1}: "
                      f"{result.outcome.value} ({result.reason}), "
                      f"{time.monotonic() - began:.1f} s")
    finally:
        runtime.close()
    return SessionRun(session, summarizer, tuple(observations))


def _corpus_truth(name: str, summarizer: str, database_url: str, base_url: str | None,
                  counter: TokenCounter) -> dict[str, Any]:
    """One forced job per corpus session; its summary's untruths against the originals."""
    reasons: dict[str, int] = {}
    totals = dict.fromkeys(Untruths.__dataclass_fields__, 0)
    records = load_corpus(name)
    for record in records:
        rows = count_messages([parse_message(m) for m in record["messages"]], counter)
        session_id = f"truth-{uuid.uuid4().hex[:8]}-{summarizer}"
        runtime = _runtime(database_url, summarizer, base_url, sum(r.tokens for r in rows))
        try:
            runtime.store.import_session(session_id, {"bench": "fidelity"}, rows,
                                         datetime.now(UTC) - IMPORTED_AGO)
            result = pipeline.run(JobRequest(session_id, "bench", force=True), runtime.deps,
                                  runtime.policy)
            reasons[result.reason] = reasons.get(result.reason, 0) + 1
            revisions = runtime.store.revisions(session_id)
            if revisions:
                found = _untruths(runtime.store, session_id, revisions[0])
                totals = {name: count + getattr(found, name) for name, count in totals.items()}
        finally:
            runtime.close()
    _progress(f"{summarizer} corpus {name}: {len(records)} sessions, {reasons}")
    return {"corpus": name, "sessions": len(records),
            "reasons": ",".join(f"{k}={v}" for k, v in sorted(reasons.items())),
            "false_outcome_lines": totals["false_outcomes"],
            "open_and_done": totals["open_and_done"],
            "goals_answered_while_continued": totals["goal_answered_while_continued"],
            "bare_numbers": totals["bare_numbers"],
            "unlabelled_numbers": totals["unlabelled_numbers"]}


def _untruths(store: Store, session_id: str, revision: RevisionRecord,
              session_format: SessionFormat = SessionFormat.CHAT) -> Untruths:
    """The active revision's summary against the items it covers and the tail."""
    messages = store.messages(session_id)
    return count_untruths(revision.summary,
                          [m.body for m in messages if m.seq <= revision.through_seq],
                          [m.body for m in messages if m.seq > revision.through_seq],
                          session_format)


def _observe(store: Store, session_id: str, session: PlantedSession, round_index: int,
             outcome: str, history_tokens: int, counter: TokenCounter,
             budget: SummaryBudget, session_format: SessionFormat,
             chat_seqs: Sequence[int]) -> Observation:
    """Read the projection and the active summary after one round's job (its boundary as
    the seq of the last chat message it covers, which the planted facts are placed by)."""
    text = projection_text(store.projection(session_id), session_format)
    revisions = store.revisions(session_id)  # newest first: the active one, its parent
    revision = revisions[0] if revisions else None
    prior_tokens = revisions[1].summary_tokens if len(revisions) > 1 else 0
    values = [fact.value for fact in session.facts if fact.round <= round_index]
    visible = visible_values(values, text)
    recalled = None
    if round_index == 0:
        recalled = frozenset(value for value in values if value not in visible
                             and is_recalled(store, session_id, value))
    keys = [request.key for request in session.requests if request.round <= round_index]
    return Observation(
        round=round_index, outcome=outcome,
        through_seq=chat_seqs[revision.through_seq] if revision else 0,
        summary_tokens=counter.count_text(content_text(revision.block["content"]))
        if revision else 0,
        budget_tokens=budget.for_span(revision.span_tokens if revision else 0, prior_tokens),
        history_tokens=history_tokens,
        goal=str(revision.summary.get("goal") or "") if revision else "", visible=visible,
        listed_open=listed_open(keys, revision.summary if revision else None),
        recalled=recalled,
        untruths=_untruths(store, session_id, revision, session_format) if revision
        else Untruths())


def is_recalled(store: Store, session_id: str, value: str) -> bool:
    """Whether ``compactor recall`` finds the value: a hit whose excerpt quotes it."""
    return any(value in hit.excerpt for hit in store.recall(session_id, value))


def _figures(runs: Sequence[SessionRun]) -> dict[str, Any]:
    in_range = [run for run in runs if run.session.round_tokens[0] <= TARGET_MAX_TOKENS * 1.05]
    return {
        "sessions": session_rows(runs),
        "by_kind": retention_rows(runs, lambda fact: fact.kind),
        "by_source": retention_rows(runs, lambda fact: fact.source),
        "by_target_class": retention_rows(runs, target_class),
        "by_round_first_seen": lag_rows(runs),
        "per_round": round_rows(runs),
        "targets": target_rows(in_range) if in_range else [],
        "recall": recall_figures(runs),
    }


def _print_figures(kind: str, figures: dict[str, Any]) -> None:
    print(f"\n== {kind} summarizer")
    print("\nsessions (first compaction of the initial session):")
    _print_rows(figures["sessions"])
    for title, name in (("kind", "by_kind"), ("source", "by_source"),
                        ("target class", "by_target_class")):
        print(f"\nvisible retention per {title} (initial session, first compaction):")
        _print_rows(figures[name])
    print("\nretention of each round's facts, N compactions after the round's own:")
    _print_rows(figures["by_round_first_seen"])
    print("\nper round (all sessions):")
    _print_rows(figures["per_round"])
    print(f"\ntargets (sessions up to {TARGET_MAX_TOKENS:,} tokens):")
    _print_rows(figures["targets"])
    print("\nrecall retention (initial facts the first compaction hid):")
    _print_rows([figures["recall"]])


def _print_rows(rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        print("(none)")
        return
    headers = [key.replace("_pct", " %").replace("_", " ") for key in rows[0]]
    print_table(headers, ([_cell(value) for value in row.values()] for row in rows))


def _cell(value: object) -> object:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else value


if __name__ == "__main__":
    main()
