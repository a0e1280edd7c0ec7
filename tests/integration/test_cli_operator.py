"""The operator's command line on both databases: version and -h, filtered runs,
schema checks and downgrades, rollback and roll-forward with errors that say what was
wrong, and sessions filtered by breaker."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console
from sqlalchemy import Engine, update

from db import SESSION_TABLES, BreakerUpdate, Store, current_revision, head_revision
from db.models import Base, SessionRow
from scheduler.cli.demo_report import print_results
from tests.integration.test_store import conversation, job_run, swap
from tests.support.cli import Compactor, compactor_for, write_jsonl
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from worker.settings.config import Settings

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)


@pytest.fixture
def compactor(database_url: str, tmp_path: Path) -> Compactor:
    return compactor_for(database_url, tmp_path / "data")


def chain(store: Store, session_id: str, count: int) -> list[int]:
    """A session with ``count`` revisions in one chain, oldest first."""
    store.import_session(session_id, {}, conversation(2 * count + 2), NOW)
    return [swap(store, session_id, 2 * (index + 1), now=NOW) for index in range(count)]


def test_version_and_short_help_in_a_real_process(compactor: Compactor) -> None:
    shown = compactor.subprocess("--version")
    helped = compactor.subprocess("-h")
    sub_help = compactor.subprocess("runs", "-h")

    assert (shown.returncode, shown.stdout) == (0, f"compactor {version('session-compactor')}\n")
    assert helped.returncode == 0 and "Usage: compactor" in helped.stdout
    assert sub_help.returncode == 0 and "--since" in sub_help.stdout


def test_runs_filter_by_time_window_and_validated_outcome(
    compactor: Compactor, store: Store
) -> None:
    store.import_session("s", {}, conversation(4), NOW)
    for hours_ago, outcome in ((50, "failed"), (30, "compacted"), (2, "failed")):
        store.record_run(job_run("s", outcome, at=NOW - timedelta(hours=hours_ago)))

    def started(*args: str) -> list[str]:
        result = compactor("runs", "--json", *args)
        assert result.exit_code == 0, result.output
        return [json.loads(line)["outcome"] for line in result.stdout.splitlines()]

    assert started("--since", "24h") == ["failed"]
    assert started("--since", "3d", "--until", "1d") == ["compacted", "failed"]
    until = (NOW - timedelta(hours=40)).isoformat()
    assert started("--until", until, "--outcome", "failed") == ["failed"]
    naive_utc = (NOW - timedelta(hours=40)).replace(tzinfo=None).isoformat()
    assert started("--since", naive_utc) == ["failed", "compacted"]

    typo = compactor("runs", "--outcome", "failure")
    bad_time = compactor("runs", "--since", "yesterday")
    assert typo.exit_code == 2 and "'failure' is not one of" in typo.output
    assert "'failed'" in typo.output and "'compacted'" in typo.output
    assert bad_time.exit_code == 2 and "span ago (30m, 24h, 7d)" in bad_time.output


def test_db_current_exits_3_behind_head_and_downgrade_asks_for_yes(
    empty_database_url: str, tmp_path: Path
) -> None:
    compactor = compactor_for(empty_database_url, tmp_path / "data")
    assert compactor("db", "current").exit_code == 3  # never migrated
    assert compactor("db", "upgrade").exit_code == 0
    assert compactor("db", "current").exit_code == 0
    head = head_revision()
    previous = f"{int(head) - 1:04d}"

    unconfirmed = compactor("db", "downgrade")
    assert unconfirmed.exit_code == 4
    assert "would downgrade" in unconfirmed.stderr and "pass --yes" in unconfirmed.stderr
    assert current_revision(empty_database_url) == head

    assert compactor("db", "downgrade", "--yes").exit_code == 0
    assert current_revision(empty_database_url) == previous
    behind = compactor("db", "current")
    assert behind.exit_code == 3 and "behind: run `compactor db upgrade`" in behind.stdout
    assert json.loads(compactor("db", "current", "--json").stdout)["up_to_date"] is False

    unknown = compactor("db", "downgrade", "0099", "--yes")
    upward = compactor("db", "downgrade", head, "--yes")
    assert unknown.exit_code == 1 and "no revision '0099'; the revisions are base" in (
        unknown.stderr)
    assert upward.exit_code == 1 and f"is not before the current revision {previous}" in (
        upward.stderr)
    assert compactor("db", "downgrade", "base", "--yes").exit_code == 0
    assert current_revision(empty_database_url) is None
    assert compactor("db", "upgrade").exit_code == 0


def test_rollback_errors_name_the_session_s_revisions_and_roll_forward_undoes_it(
    compactor: Compactor, store: Store
) -> None:
    first, second, third = chain(store, "s", 3)
    chain(store, "other", 1)

    missing = compactor("rollback", "s", "--to", "999")
    not_earlier = compactor("rollback", "s", "--to", str(third))
    assert missing.exit_code == 1 and "database error" not in missing.stderr
    assert f"session s has no revision 999; it has {first}, {second}, {third}" in (
        missing.stderr.replace(f"{first}..{third}", f"{first}, {second}, {third}"))
    assert f"revision {third} of session s is not earlier than the active one; " \
           f"earlier ones: {first}, {second}" in not_earlier.stderr

    assert compactor.json("rollback", "s", "--to", str(first))["active_revision_id"] == first
    assert store.get_session("s").active_revision_id == first
    back = compactor.json("roll-forward", "s", "--to", str(second))
    assert back["active_revision_id"] == second
    assert back["projection_tokens"] == store.get_session("s").projection_tokens
    assert compactor.json("roll-forward", "s")["active_revision_id"] == third

    nothing_later = compactor("roll-forward", "s")
    assert nothing_later.exit_code == 1
    assert f"no revision later than the active one ({third})" in nothing_later.stderr
    compactor("rollback", "s", "--to", str(first))
    not_later = compactor("roll-forward", "s", "--to", str(first))
    assert f"is not later than the active one; later ones: {second}, {third}" in (
        not_later.stderr)


def test_sessions_filter_by_breaker_state(
    compactor: Compactor, store: Store, engine: Engine
) -> None:
    for session_id in ("a-closed", "b-open", "c-half"):
        store.import_session(session_id, {}, conversation(2), NOW)
    store.set_breaker("b-open", BreakerUpdate(state="open", failures=3, opened_at=NOW))
    with engine.begin() as conn:
        conn.execute(update(SessionRow).where(SessionRow.session_id == "c-half")
                     .values(breaker_state="half_open", breaker_opened_at=NOW))

    def listed(state: str) -> list[str]:
        return [s["session_id"] for s in compactor.json("sessions", "--breaker", state)]

    assert listed("open") == ["b-open"]
    assert listed("half-open") == ["c-half"]
    assert listed("closed") == ["a-closed"]
    wrong = compactor("sessions", "--breaker", "opened")
    assert wrong.exit_code == 2 and "'half-open'" in wrong.output


def every_row(engine: Engine) -> dict[str, list[tuple[object, ...]]]:
    with engine.connect() as conn:
        return {table.name: sorted(map(tuple, conn.execute(Base.metadata.tables[table.name]
                                                          .select())),
                                   key=repr) for table in SESSION_TABLES}


def test_compact_dry_run_prints_the_plan_the_job_then_follows_and_writes_nothing(
    compactor: Compactor, engine: Engine, tmp_path: Path
) -> None:
    sessions = write_jsonl(tmp_path / "in.jsonl", [generated_session("big", 150),
                                                    generated_session("small", 2)])
    assert compactor("import", str(sessions)).exit_code == 0
    with OpenAIServer(latency_ms=0) as server:
        # trigger 5,600 tokens; an LLM window of 13,000 splits the 18k-token span.
        llm = Compactor({**compactor.env, "COMPACTOR_LLM_BASE_URL": server.base_url,
                         "COMPACTOR_MODEL_CONTEXT_TOKENS": "8000",
                         "COMPACTOR_TAIL_BUDGET_TOKENS": "500",
                         "COMPACTOR_LLM_CONTEXT_TOKENS": "13000"})
        before = every_row(engine)

        planned = [json.loads(line) for line in
                   llm("compact", "--dry-run", "--json", "big", "small").stdout.splitlines()]
        table = llm("compact", "--dry-run", "big", "small")

        assert every_row(engine) == before and server.requests == []
        big, small = planned
        assert (big["decision"], big["summarizer"], big["failure"]) == (
            "over_trigger", "llm", None)
        assert big["span_first_seq"] == 2 and big["span_last_seq"] < 601
        assert big["chunks"] > 1 and big["llm_calls"] == big["chunks"] + 2
        assert big["est_input_tokens"] > big["span_tokens"] > big["tail_tokens"] > 0
        assert (small["skip_reason"], small["llm_calls"]) == ("under_trigger", 0)
        assert table.exit_code == 0, table.output
        assert f"1 of 2 sessions would be compacted; {big['llm_calls']} LLM calls" in (
            table.stdout)

        done = llm("compact", "--inline", "--json", "big")

    ran = json.loads(done.stdout)
    assert (ran["outcome"], ran["llm_calls"], ran["chunks"], ran["merge_rounds"]) == (
        "compacted", big["llm_calls"], big["chunks"], big["merge_rounds"])
    assert ran["span_tokens"] == big["span_tokens"]
    assert abs(ran["prompt_tokens"] - big["est_input_tokens"]) < 0.1 * ran["prompt_tokens"]


LONG_ID = "a-session-id-as-long-as-some-platforms-make-them-0123456789abcdef"


def test_key_tables_stay_readable_at_80_columns(
    compactor: Compactor, store: Store, engine: Engine
) -> None:
    first, second = chain(store, LONG_ID, 2)
    store.import_session("small", {}, conversation(2), NOW)
    store.record_run(replace(
        job_run(LONG_ID, "failed", at=NOW), failure_class="SummaryInvalid",
        failure_message="the summary dropped identifiers " + "X" * 200))
    with engine.begin() as conn:  # quiet since a day; "small" over the trigger for the scan
        conn.execute(update(SessionRow).values(last_appended_at=NOW - timedelta(days=1)))
        conn.execute(update(SessionRow).where(SessionRow.session_id == "small")
                     .values(projection_tokens=1_000_000))
    narrow = Compactor({**compactor.env, "COLUMNS": "80"})
    rendered = {
        "sessions": narrow("sessions"), "runs": narrow("runs"),
        "show": narrow("show", LONG_ID), "scan": narrow("scan", "--dry-run"),
        "plan": narrow("compact", "--dry-run", "--all"),
    }
    expected_headers = {
        "sessions": ["session", "msgs", "tokens", "projection", "revs", "last compacted",
                     "breaker"],
        "runs": ["id", "session", "started", "outcome", "reason", "before", "after",
                 "failure"],
        "show": ["rev", "parent", "through", "summary", "projection", "created", "made by"],
        "scan": ["session", "why", "projection", "since compaction", "est. tokens"],
        "plan": ["session", "decision", "span seqs", "span tok", "tail tok", "calls",
                 "est. in", "max out"],
    }
    for name, result in rendered.items():
        assert result.exit_code == 0, (name, result.output)
        lines = result.stdout.splitlines()
        assert max(map(len, lines)) <= 80, (name, result.stdout)
        assert any(all(column in line for column in expected_headers[name])
                   for line in lines), (name, result.stdout)
    # Numbers and timestamps stay whole; a long id folds onto the next lines, never cut:
    # the first word of each line, joined, gives it back.
    assert f"{NOW:%Y-%m-%d %H:%M}" in rendered["runs"].stdout
    for name, next_header in (("sessions", "msgs"), ("runs", "started")):
        assert "…" not in rendered[name].stdout, rendered[name].stdout
        assert LONG_ID in column_text(rendered[name].stdout, "session", next_header)
    assert f"{second}*" in rendered["show"].stdout and f" {first} " in rendered["show"].stdout
    assert "over_trigger" in rendered["scan"].stdout


def column_text(table: str, header: str, next_header: str) -> str:
    """The cells under ``header`` of a printed table, every line's piece joined."""
    lines = table.splitlines()
    [head] = [line for line in lines if header in line.split() and next_header in line]
    start, end = head.index(header), head.index(next_header)
    return "".join(line[start:end].strip() for line in lines[lines.index(head) + 2:])


def test_the_demo_outcome_table_stays_readable_at_80_columns(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    chain(store, LONG_ID, 1)
    store.import_session("small", {}, conversation(2), NOW)
    rendered = io.StringIO()
    console = Console(file=rendered, width=80)
    settings = Settings(database_url=database_url, data_dir=tmp_path)
    runs = {run.session_id: run for run in store.runs()}

    print_results(console, store, settings, [LONG_ID, "small"], runs)

    # The table, above the prose that follows it (soft-wrapped: the terminal folds it).
    lines = rendered.getvalue().split("Saved ")[0].splitlines()
    assert max(map(len, lines)) <= 80
    columns = ("session", "msgs", "outcome", "reason", "before", "after", "saved")
    assert any(all(column in line for column in columns) for line in lines)
    assert any(line.lstrip().startswith("a-session-id") and "compacted" in line
               for line in lines)


def test_runs_say_which_revisions_a_rollback_took_out_of_force(
    compactor: Compactor, store: Store
) -> None:
    first, second, third = chain(store, "s", 3)
    store.record_run(job_run("s", "skipped", at=NOW))
    compactor("rollback", "s", "--to", str(second))

    shown = [json.loads(line) for line in
             compactor("runs", "--session", "s", "--json").stdout.splitlines()]

    assert {run["revision_id"]: run["rolled_back"] for run in shown} == {
        None: None, first: False, second: False, third: True}
