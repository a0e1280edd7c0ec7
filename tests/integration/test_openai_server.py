"""The OpenAI-protocol test server's own contract: cues, request log, merge replies, and
running standalone (what the LLM client and end-to-end tests rely on)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.openai_behaviours import Behaviour
from tests.support.openai_server import OpenAIServer
from tests.support.prompt_cache import BLOCK_TOKENS
from worker.tokenizer.offline import load_encoding

REPO_ROOT = Path(__file__).resolve().parents[2]


def call(url: str, body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def chat(server: OpenAIServer, text: str, **headers: str) -> tuple[int, dict[str, Any]]:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return call(f"{server.base_url}/chat/completions", body, headers)


def test_a_prompt_marker_makes_only_its_own_request_misbehave() -> None:
    with OpenAIServer() as server:
        marked, _ = chat(server, "Summarize this. [[behave:500]]")
        plain, _ = chat(server, "Summarize this.")

        assert (marked, plain) == (500, 200)
        assert [r.behaviour for r in server.requests] == [Behaviour.ERROR_500, Behaviour.OK]


def test_a_counted_marker_misbehaves_n_times_then_answers_ok() -> None:
    with OpenAIServer() as server:
        statuses = [chat(server, "[[behave:rate_limit_429:2]] go")[0] for _ in range(3)]

    assert statuses == [429, 429, 200]


def test_the_behaviour_header_overrides_the_run_behaviour() -> None:
    with OpenAIServer(behaviour="error_500") as server:
        status, body = chat(server, "Summarize.", **{"X-Test-Behaviour": "truncated"})
        run_status, _ = chat(server, "Summarize.")

    assert (status, run_status) == (200, 500)
    assert body["choices"][0]["finish_reason"] == "length"


def test_the_run_behaviour_changes_between_calls() -> None:
    with OpenAIServer(behaviour="context_length") as server:
        before, error = chat(server, "Summarize.")
        server.set_behaviour(Behaviour.OK)
        after, _ = chat(server, "Summarize.")

    assert (before, after) == (400, 200)
    assert error["error"]["code"] == "context_length_exceeded"


def test_a_merge_request_unions_the_artifacts_of_its_partial_summaries() -> None:
    first = {"goal": "Rebook", "completed_actions": ["searched"], "pending": [],
             "relevant_artifacts": ["booking HAT170", "ticket E1234"]}
    second = {"goal": "Rebook", "completed_actions": ["paid"], "pending": ["refund"],
              "relevant_artifacts": ["card on file", "ticket E1234"]}
    text = f"Merge these partial summaries:\n{json.dumps(first)}\n{json.dumps(second)}"

    with OpenAIServer() as server:
        _, body = chat(server, text)

    summary = json.loads(body["choices"][0]["message"]["content"])
    assert {"booking HAT170", "ticket E1234", "card on file"} <= set(summary["relevant_artifacts"])
    assert {"searched", "paid"} <= set(summary["completed_actions"])


def test_an_ok_summary_keeps_the_leading_artifacts_that_fit_its_output_budget() -> None:
    codes = [f"CODE_{number}" for number in range(400)]
    body = {"model": "m", "max_completion_tokens": 600,
            "messages": [{"role": "user", "content": "Codes: " + " ".join(codes)}]}

    with OpenAIServer() as server:
        _, reply = call(f"{server.base_url}/chat/completions", body)

    kept = json.loads(reply["choices"][0]["message"]["content"])["relevant_artifacts"]
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] <= 600
    assert 0 < len(kept) < len(codes) and kept == codes[: len(kept)]


def test_usage_counts_the_prompt_that_the_log_records() -> None:
    with OpenAIServer() as server:
        _, body = chat(server, "Count me: HAT170.")

        [request] = server.requests
    usage = body["usage"]
    assert usage["prompt_tokens"] == request.prompt_tokens > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_repeated_request_is_answered_and_counted_alike_under_a_fresh_id() -> None:
    with OpenAIServer() as server:
        _, first = chat(server, "Summarize booking HAT170 and error E1234.")
        _, again = chat(server, "Summarize booking HAT170 and error E1234.")
        server.set_context_window(5)
        refused, _ = chat(server, "Summarize booking HAT170 and error E1234.")

        tokens = [request.prompt_tokens for request in server.requests]
    assert (first["choices"], first["usage"]) == (again["choices"], again["usage"])
    assert first["id"] != again["id"]
    assert tokens == [first["usage"]["prompt_tokens"]] * 3
    assert refused == 400  # the window is part of what a remembered reply depends on


def test_concurrent_requests_are_served_in_parallel_and_counted() -> None:
    with OpenAIServer(behaviour="latency", latency_ms=300) as server, \
            ThreadPoolExecutor(max_workers=3) as pool:
        statuses = list(pool.map(lambda _: chat(server, "Summarize.")[0], range(3)))

        assert statuses == [200, 200, 200]
        assert server.max_in_flight >= 2
        assert server.request_count == 3


def test_the_models_endpoint_lists_the_served_model() -> None:
    with OpenAIServer(model="tiny-summarizer") as server:
        status, body = call(f"{server.base_url}/models")

    assert status == 200
    assert [model["id"] for model in body["data"]] == ["tiny-summarizer"]


def test_the_server_runs_standalone_and_prints_its_url() -> None:
    command = [sys.executable, "-m", "tests.support.openai_server", "--port", "0"]
    with subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            base_url = process.stdout.readline().rsplit(" ", 1)[-1].strip()
            status, _ = call(f"{base_url}/models")
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0

    assert base_url.startswith("http://127.0.0.1:") and status == 200


def cache_probe(server: OpenAIServer, words: list[str], key: str | None) -> int:
    """Send a request whose user text is ``words``; return its usage's cached tokens."""
    body: dict[str, Any] = {"model": "m", "messages": [
        {"role": "system", "content": "Summarize."},
        {"role": "user", "content": " ".join(words)}]}
    if key is not None:
        body["prompt_cache_key"] = key
    status, reply = call(f"{server.base_url}/chat/completions", body)
    assert status == 200
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        server.requests[-1].cached_tokens)
    return int(reply["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_cached_tokens_are_the_shared_prefix_in_whole_blocks_from_1024_per_cache_key() -> None:
    rng = random.Random(36)
    vocabulary = [f"w{index}" for index in range(500)]
    shared = rng.choices(vocabulary, k=3_000)
    tail = rng.choices(vocabulary, k=400)
    encode = load_encoding("o200k_base").encode_ordinary
    # The server's tokens: each message's role and text, in order.
    prefix_tokens = len(encode("system\nSummarize.\n")) + len(encode("user\n" + " ".join(shared)))
    with OpenAIServer(latency_ms=0) as server:
        first = cache_probe(server, [*shared, "alpha", *tail], "fleet:v1")
        again = cache_probe(server, [*shared, "omega", *tail], "fleet:v1")
        other_key = cache_probe(server, [*shared, "gamma", *tail], "other:v1")
        keyless = cache_probe(server, [*shared, "delta", *tail], None)
        short = cache_probe(server, shared[:300], "short:v1")
        short_again = cache_probe(server, shared[:300], "short:v1")

    assert first == 0 and other_key == 0
    # The words before the first difference, less at most a block and the merged token.
    assert prefix_tokens - BLOCK_TOKENS - 2 <= again <= prefix_tokens
    assert again % BLOCK_TOKENS == 0 and keyless == again  # keyless: any earlier request
    assert short == short_again == 0  # under 1,024 tokens nothing is cached
