"""A night of generated sessions compacted by real jobs (`compactor compact --inline`, the
LLM summarizer against the OpenAI-protocol test server, PostgreSQL): every request after
the first is served its whole static prefix from the prompt cache, and `compactor cost`
reports what the runs recorded."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from db import Store
from scheduler.cli.demo_report import print_cost
from tests.support.cli import Compactor, compactor_for, write_jsonl
from tests.support.databases import open_store, truncate_store_tables
from tests.support.generated import generated_session
from tests.support.openai_server import OpenAIServer
from tests.support.prompt_cache import BLOCK_TOKENS
from worker.compaction import PROMPT_VERSION, ModelPrice, price_calls, static_prompt
from worker.settings.config import Settings
from worker.tokenizer.offline import load_encoding

pytestmark = pytest.mark.integration

MODEL = "test-summarizer"
PRICE = ModelPrice(input=0.5, cached_input=0.125, output=2.0, batch_discount=0.5)
PRICES = json.dumps({MODEL: PRICE.model_dump()})
SESSIONS = 12


@pytest.fixture
def postgres_url(migrated_postgres_url: str) -> str:
    truncate_store_tables(migrated_postgres_url)
    return migrated_postgres_url


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    with open_store(postgres_url) as opened:
        yield opened


def night_sessions(seed: int) -> list[dict[str, Any]]:
    """Sessions of 60 to 140 exchanges: all over the trigger, the longer ones over the
    summarizer's window (chunk and merge)."""
    rng = random.Random(seed)
    return [generated_session(f"night{seed}-{index}", rng.randint(60, 140))
            for index in range(SESSIONS)]


def run_night(compactor: Compactor, tmp_path: Path) -> tuple[list[dict[str, Any]], list[Any]]:
    sessions = write_jsonl(tmp_path / "night.jsonl", night_sessions(36))
    assert compactor("import", str(sessions)).exit_code == 0
    with OpenAIServer(latency_ms=0) as server:
        llm = Compactor({**compactor.env, "COMPACTOR_LLM_BASE_URL": server.base_url,
                         "COMPACTOR_LLM_MODEL": MODEL,
                         "COMPACTOR_LLM_PRICES": PRICES,
                         "COMPACTOR_MODEL_CONTEXT_TOKENS": "8000",
                         "COMPACTOR_TAIL_BUDGET_TOKENS": "500",
                         "COMPACTOR_LLM_CONTEXT_TOKENS": "12000",
                         # One call at a time: "the first request" is one request.
                         "COMPACTOR_LLM_CONCURRENCY": "1", "COMPACTOR_LLM_MAX_CALLS_PER_JOB": "8"})
        done = llm("compact", "--inline", "--all", "--json")
        assert done.exit_code == 0, done.output
        events = [json.loads(line) for line in done.stdout.splitlines()]
        return events, server.requests


def static_prefix_tokens() -> int:
    """The static prefix as the test server encodes a request (role, then text)."""
    return len(load_encoding("o200k_base").encode_ordinary(f"system\n{static_prompt()}\n"))


def test_a_night_is_served_its_static_prefix_from_the_cache_and_costs_what_its_runs_say(
    postgres_url: str, store: Store, tmp_path: Path
) -> None:
    started = datetime.now(UTC)
    compactor = compactor_for(postgres_url, tmp_path / "data")
    events, requests = run_night(compactor, tmp_path)

    assert [event["outcome"] for event in events] == ["compacted"] * SESSIONS
    assert any(event["chunks"] > 1 for event in events)  # chunk and merge among them
    assert {request.body["prompt_cache_key"] for request in requests} == {
        f"compactor:compaction:{PROMPT_VERSION}"}
    static_tokens = static_prefix_tokens()
    assert static_tokens % BLOCK_TOKENS  # not a lucky alignment
    assert requests[0].cached_tokens == 0
    assert min(request.cached_tokens for request in requests[1:]) >= static_tokens
    assert sum(event["cached_tokens"] for event in events) == sum(
        request.cached_tokens for request in requests)

    runs = store.runs(since=started, limit=1_000)
    for event in events:
        expected = price_calls(PRICE, prompt_tokens=event["prompt_tokens"],
                               cached_tokens=event["cached_tokens"],
                               completion_tokens=event["completion_tokens"])
        assert event["cost_usd"] == expected > 0 and event["llm_model"] == MODEL
    assert sorted(run.figures["cost_usd"] for run in runs) == sorted(
        event["cost_usd"] for event in events)

    priced = Compactor({**compactor.env, "COMPACTOR_LLM_PRICES": PRICES})
    report = priced.json("cost", "--since", "1h", "--session-model", MODEL)
    assert report["jobs"] == len(runs) == SESSIONS
    assert report["cost_usd"] == pytest.approx(sum(run.figures["cost_usd"] for run in runs),
                                               abs=1e-9)
    assert report["unpriced_jobs"] == 0
    assert report["cost_at_batch_price_usd"] == pytest.approx(report["cost_usd"] / 2, abs=1e-8)
    assert (report["input_tokens"], report["cached_tokens"], report["output_tokens"]) == (
        sum(e["prompt_tokens"] - e["cached_tokens"] for e in events),
        sum(e["cached_tokens"] for e in events), sum(e["completion_tokens"] for e in events))
    shown = io.StringIO()
    print_cost(Console(file=shown, width=400), Settings(llm_prices=PRICES, llm_model=MODEL),
               runs)
    assert (f"{report['llm_calls']:,} LLM calls sent "
            f"{report['input_tokens'] + report['cached_tokens']:,} prompt tokens "
            f"({report['cached_tokens']:,} served from the provider's cache)") in shown.getvalue()
    assert (f"cost ${report['cost_usd']:.4f} (through the Batch API: "
            f"${report['cost_at_batch_price_usd']:.4f})") in shown.getvalue()
    by_session = {saving["session_id"]: saving for saving in report["sessions"]}
    assert set(by_session) == {event["session_id"] for event in events}
    for event in events:
        saving = by_session[event["session_id"]]
        removed = event["tokens_before"] - event["tokens_after"]
        assert saving["tokens_removed"] == removed > 0
        assert saving["payback_requests"] == pytest.approx(
            event["cost_usd"] / (removed * PRICE.input / 1_000_000))
        # Every assistant message of a first compaction's session is one request made.
        assert saving["requests_since_previous"] == sum(
            1 for message in store.messages(event["session_id"])
            if message.role == "assistant")


def test_cost_before_the_night_counts_nothing_and_an_unpriced_model_is_unknown(
    postgres_url: str, store: Store, tmp_path: Path
) -> None:
    compactor = compactor_for(postgres_url, tmp_path / "data")
    sessions = write_jsonl(tmp_path / "one.jsonl", [generated_session("unpriced", 80)])
    assert compactor("import", str(sessions)).exit_code == 0
    with OpenAIServer(latency_ms=0) as server:
        llm = Compactor({**compactor.env, "COMPACTOR_LLM_BASE_URL": server.base_url,
                         "COMPACTOR_LLM_MODEL": "a-model-without-a-price",
                         "COMPACTOR_MODEL_CONTEXT_TOKENS": "8000",
                         "COMPACTOR_TAIL_BUDGET_TOKENS": "500"})
        event = llm.json("compact", "--inline", "--all")

    assert event["outcome"] == "compacted" and event["llm_calls"] >= 1
    assert event["cost_usd"] is None
    report = compactor.json("cost", "--since", "1h")
    assert (report["jobs"], report["unpriced_jobs"], report["cost_usd"]) == (1, 1, 0.0)
    # The sessions' model (the default summarizer's) has a price; the run's cost has none.
    assert report["sessions"][0]["payback_requests"] is None
    later = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    assert compactor.json("cost", "--since", later)["jobs"] == 0


def test_a_job_refused_before_any_call_costs_nothing_even_on_an_unpriced_model(
    postgres_url: str, tmp_path: Path
) -> None:
    compactor = compactor_for(postgres_url, tmp_path / "data")
    sessions = write_jsonl(tmp_path / "big.jsonl", [generated_session("too-big", 140)])
    assert compactor("import", str(sessions)).exit_code == 0
    with OpenAIServer(latency_ms=0) as server:
        llm = Compactor({**compactor.env, "COMPACTOR_LLM_BASE_URL": server.base_url,
                         "COMPACTOR_LLM_MODEL": "a-model-without-a-price",
                         "COMPACTOR_MODEL_CONTEXT_TOKENS": "8000",
                         "COMPACTOR_TAIL_BUDGET_TOKENS": "500",
                         "COMPACTOR_LLM_CONTEXT_TOKENS": "12000",
                         "COMPACTOR_LLM_MAX_CALLS_PER_JOB": "1"})
        done = llm("compact", "--inline", "--all", "--json")
        assert server.requests == []

    event = json.loads(done.stdout)
    assert (event["outcome"], event["reason"], event["llm_calls"]) == (
        "failed", "too_many_calls", 0)
    assert (event["cost_usd"], event["llm_model"]) == (0.0, None)
    report = compactor.json("cost", "--since", "1h")
    assert (report["jobs"], report["unpriced_jobs"], report["cost_usd"]) == (1, 0, 0.0)
    assert report["jobs_by_outcome"] == {"failed": 1} and report["sessions"] == []
