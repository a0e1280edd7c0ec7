"""The LLM client against a real OpenAI-protocol server on loopback, through the SDK's
own HTTP stack: one test per server behaviour, with the typed outcome and the number of
HTTP requests the server received."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.support.fake_summaries import OPEN_SECTIONS
from tests.support.openai_behaviours import Behaviour
from tests.support.openai_server import OpenAIServer
from worker.compaction import PROMPT_VERSION
from worker.compaction.prompts import build_summarize_messages
from worker.compaction.schema import LIST_SECTIONS, summary_json_schema
from worker.compaction.tokens import TokenCounter
from worker.compaction.truth import DONE_SECTIONS
from worker.compaction.validation import parse_summary
from worker.errors import (
    ContextOverflow,
    ProviderAuthFailed,
    ProviderError,
    ProviderRateLimited,
    SessionFailure,
    SummaryInvalid,
)
from worker.summarizers.openai_client import LLMClient, LLMConfig, LLMReply, LLMUsage, OutputMode
from worker.tokenizer.offline import load_encoding

SCHEMA = summary_json_schema()
IDENTIFIERS = ("HAT170", "mia_li_3668", "/etc/app.conf", "E1234", "v1.2.3")
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Summarize the conversation as a JSON object."},
    {"role": "user", "content": "Booking HAT170 for mia_li_3668 failed with E1234.\n"
                                "The agent edited /etc/app.conf and pinned v1.2.3."},
]

MakeClient = Callable[..., LLMClient]


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(latency_ms=300) as running:
        yield running


@pytest.fixture
def make_client(server: OpenAIServer) -> Iterator[MakeClient]:
    clients: list[LLMClient] = []

    def make(*, read_timeout_s: float = 5.0, max_retries: int = 0, api_key: str | None = None,
             base_url: str | None = None) -> LLMClient:
        config = LLMConfig(base_url=base_url or server.base_url, api_key=api_key,
                           model="summarizer-test", connect_timeout_s=2.0,
                           read_timeout_s=read_timeout_s, max_retries=max_retries)
        clients.append(LLMClient(config))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def complete(client: LLMClient, *, max_output_tokens: int = 1024,
             usage: LLMUsage | None = None) -> LLMReply:
    return client.complete_json(MESSAGES, schema=SCHEMA, max_output_tokens=max_output_tokens,
                                usage=usage)


def test_ok_reply_is_schema_valid_json_that_keeps_every_identifier(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    reply = complete(make_client())

    summary = parse_summary(reply.content)
    assert set(IDENTIFIERS) <= set(summary.relevant_artifacts)
    # The careful model fills every section but the open ones, which hold only what is open,
    # and the done ones: these messages are no transcript, so no line is the assistant's.
    assert summary.goal and all(summary.items_of(name) for name in LIST_SECTIONS
                                if name not in (*OPEN_SECTIONS, *DONE_SECTIONS))
    assert not any(summary.items_of(name) for name in DONE_SECTIONS)
    assert (reply.mode, reply.finish_reason, reply.retries) == (OutputMode.JSON_SCHEMA, "stop", 0)
    [request] = server.requests
    assert reply.prompt_tokens == request.prompt_tokens
    assert reply.completion_tokens > 0 and reply.latency_s > 0


def test_ok_request_asks_for_the_strict_schema_with_the_output_budget(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    complete(make_client(), max_output_tokens=777)

    [request] = server.requests
    assert request.body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "summary", "strict": True, "schema": SCHEMA}
    }
    assert request.body["max_completion_tokens"] == 777
    assert request.body["temperature"] == 0.0
    assert request.headers["authorization"] == "Bearer unused"


def test_a_query_string_in_the_base_url_is_sent_with_every_request_not_inside_the_path(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    reply = complete(make_client(base_url=f"{server.base_url}?api-key=query-key-1234"))

    assert reply.finish_reason == "stop"
    [request] = server.requests
    assert request.path == "/v1/chat/completions?api-key=query-key-1234"


def test_latency_is_measured_into_the_reply(server: OpenAIServer, make_client: MakeClient) -> None:
    server.set_behaviour("latency")

    reply = complete(make_client())

    assert reply.latency_s >= 0.3
    assert server.request_count == 1


def test_a_hanging_endpoint_fails_as_a_provider_timeout_after_exactly_one_retry(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("hang")
    usage = LLMUsage()
    started = time.monotonic()

    with pytest.raises(ProviderError) as raised:
        complete(make_client(read_timeout_s=0.5, max_retries=1), usage=usage)

    assert raised.value.reason == "timeout"
    assert server.request_count == 2
    assert time.monotonic() - started < 5.0
    assert usage.as_dict()["failed_calls"] == 1 and usage.as_dict()["retries"] == 1


def test_a_persistent_500_fails_as_a_provider_error_once_the_sdk_retries_are_spent(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("error_500")

    with pytest.raises(ProviderError) as raised:
        complete(make_client(max_retries=1))

    assert not isinstance(raised.value, ProviderRateLimited)
    assert raised.value.reason == "server_error"
    assert server.request_count == 2


def test_two_500s_then_ok_succeed_with_both_retries_counted(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("error_500:2")

    reply = complete(make_client(max_retries=2))

    assert reply.retries == 2
    assert server.request_count == 3
    parse_summary(reply.content)


def test_a_429_is_retried_after_the_delay_its_retry_after_asks_for(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("rate_limit_429:1")
    started = time.monotonic()

    reply = complete(make_client(max_retries=1))

    assert time.monotonic() - started >= 1.0
    assert reply.retries == 1
    assert server.request_count == 2


def test_a_429_past_the_retries_raises_rate_limited_with_the_requested_delay(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("rate_limit_429")

    with pytest.raises(ProviderRateLimited) as raised:
        complete(make_client(max_retries=0))

    assert raised.value.retry_after_s == 1.0
    assert raised.value.reason == "rate_limited"
    assert server.request_count == 1


# What each garbage reply's error names: where its body first fails to be a completion.
GARBAGE_PROBLEMS = {
    Behaviour.HTML_PAGE: "json_invalid at body",
    Behaviour.RANDOM_BYTES: "json_invalid at body",
    Behaviour.NOT_JSON: "json_invalid at body",
    Behaviour.WRONG_CONTENT_TYPE: "json_invalid at body",
    Behaviour.NOT_A_COMPLETION: "missing at choices",
    Behaviour.WRONG_TYPES: "model_type at choices.0.message",
    Behaviour.NOT_AN_OBJECT: "model_type at body",
    Behaviour.EMPTY_BODY: "json_invalid at body",
    Behaviour.TRUNCATED_BODY: "json_invalid at body",
}


@pytest.mark.parametrize("garbage", list(GARBAGE_PROBLEMS), ids=str)
def test_a_200_that_is_no_completion_is_a_provider_invalid_response_naming_no_body_text(
    server: OpenAIServer, make_client: MakeClient, garbage: Behaviour
) -> None:
    server.set_behaviour(garbage)
    usage = LLMUsage()

    with pytest.raises(ProviderError) as raised:
        complete(make_client(max_retries=1), usage=usage)

    assert raised.value.reason == "invalid_response"
    assert str(raised.value).endswith(GARBAGE_PROBLEMS[garbage])
    for quoted in ("Sign in", "upstream", "overloaded", "Booking", "HAT170"):
        assert quoted not in str(raised.value)
    assert raised.value.__cause__ is None  # pydantic's error would quote the body
    # A 200 is no failure to the SDK: it is not retried there, but by the task.
    assert server.request_count == 1
    assert usage.as_dict()["failed_calls"] == 1


@pytest.mark.parametrize("garbage", ["cut_connection", "bad_encoding"])
def test_a_body_the_http_client_cannot_read_is_retried_by_the_sdk_as_a_connection_error(
    server: OpenAIServer, make_client: MakeClient, garbage: str
) -> None:
    server.set_behaviour(garbage)

    with pytest.raises(ProviderError) as raised:
        complete(make_client(max_retries=1))

    assert raised.value.reason == "connection"
    assert server.request_count == 2


def test_malformed_json_comes_back_verbatim_and_fails_parsing_as_malformed(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("malformed_json")

    reply = complete(make_client(max_retries=2))

    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.content)
    with pytest.raises(SummaryInvalid) as raised:
        parse_summary(reply.content)
    assert raised.value.reason == "malformed_json"
    assert (server.request_count, reply.retries) == (1, 0)


def test_a_reply_with_the_wrong_keys_parses_but_fails_the_schema(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("wrong_schema")

    reply = complete(make_client())

    assert "goal" not in json.loads(reply.content)
    with pytest.raises(SummaryInvalid) as raised:
        parse_summary(reply.content)
    assert raised.value.reason == "schema_mismatch"
    assert server.request_count == 1


def test_a_reply_with_empty_sections_is_returned_as_is_for_validation_to_judge(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("empty_sections")

    summary = parse_summary(complete(make_client()).content)

    assert summary.goal == "" and not any(summary.items_of(name) for name in LIST_SECTIONS)
    assert server.request_count == 1


def test_a_truncated_reply_is_returned_marked_truncated_and_not_retried(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("truncated")

    reply = complete(make_client(max_retries=2))

    assert reply.is_truncated and reply.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.content)
    assert server.request_count == 1


def test_a_reply_longer_than_the_output_budget_is_cut_and_marked_truncated(
    make_client: MakeClient,
) -> None:
    reply = complete(make_client(), max_output_tokens=20)

    assert reply.is_truncated
    assert reply.completion_tokens <= 20


def test_a_context_length_error_raises_context_overflow_without_retry_or_mode_fallback(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("context_length")

    with pytest.raises(ContextOverflow) as raised:
        complete(make_client(max_retries=2))

    assert raised.value.reason == "context_length_exceeded"
    assert server.request_count == 1


def test_a_prompt_over_the_server_window_raises_context_overflow(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_context_window(500)

    with pytest.raises(ContextOverflow):
        complete(make_client(), max_output_tokens=1024)

    assert server.requests[0].prompt_tokens + 1024 > 500


def test_a_json_mode_only_endpoint_costs_one_extra_request_once_then_is_remembered(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("json_mode_only")
    client = make_client()

    first = complete(client)
    assert server.request_count == 2
    second = complete(client)

    assert server.request_count == 3
    assert (first.mode, first.retries) == (OutputMode.JSON_OBJECT, 1)
    assert (second.mode, second.retries) == (OutputMode.JSON_OBJECT, 0)
    assert server.requests[-1].body["response_format"] == {"type": "json_object"}
    parse_summary(second.content)


def test_a_plain_text_endpoint_gets_no_response_format_and_its_prose_reply_is_parsed(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    server.set_behaviour("plain_text_fenced")
    client = make_client()

    first = complete(client)
    assert server.request_count == 3
    second = complete(client)

    assert server.request_count == 4
    assert (first.mode, first.retries, second.retries) == (OutputMode.PLAIN_TEXT, 2, 0)
    assert "response_format" not in server.requests[-1].body
    assert set(IDENTIFIERS) <= set(parse_summary(second.content).relevant_artifacts)


def test_a_wrong_api_key_fails_once_as_auth_failed_without_echoing_the_key(
    make_client: MakeClient,
) -> None:
    with OpenAIServer(api_key="the-right-key") as guarded:
        client = make_client(base_url=guarded.base_url, api_key="sk-wrong-secret", max_retries=2)

        with pytest.raises(ProviderAuthFailed) as raised:
            complete(client)

        assert raised.value.reason == "auth_failed"
        assert guarded.request_count == 1
    assert "sk-wrong-secret" not in str(raised.value)
    assert "sk-wrong-secret" not in repr(client._config)


def test_a_request_the_endpoint_rejects_counts_on_the_session(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    bad_messages = [{"role": "narrator", "content": "not a chat role"}]

    with pytest.raises(SessionFailure) as raised:
        make_client(max_retries=2).complete_json(bad_messages, schema=SCHEMA,
                                                 max_output_tokens=64)

    assert raised.value.reason == "bad_request"
    assert not isinstance(raised.value, SummaryInvalid | ContextOverflow)
    assert server.request_count == 1


def test_an_unreachable_endpoint_is_a_provider_connection_error(make_client: MakeClient) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]

    with pytest.raises(ProviderError) as raised:
        complete(make_client(base_url=f"http://127.0.0.1:{closed_port}/v1"))

    assert raised.value.reason == "connection"


def test_token_counts_fall_back_to_local_counts_when_the_server_omits_usage(
    make_client: MakeClient,
) -> None:
    counter = TokenCounter(load_encoding("o200k_base"))
    with OpenAIServer(include_usage=False) as bare:
        reply = complete(make_client(base_url=bare.base_url))

        assert reply.prompt_tokens == bare.requests[0].prompt_tokens
    assert reply.completion_tokens == counter.count_text(reply.content)


def test_usage_totals_add_up_over_concurrent_calls_failures_included(
    server: OpenAIServer, make_client: MakeClient
) -> None:
    client, usage = make_client(), LLMUsage()
    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(lambda _: complete(client, usage=usage), range(4)))
    server.set_behaviour("context_length")
    with pytest.raises(ContextOverflow):
        complete(client, usage=usage)

    totals = usage.as_dict()
    assert (totals["calls"], totals["failed_calls"], totals["retries"]) == (5, 1, 0)
    assert totals["prompt_tokens"] == sum(reply.prompt_tokens for reply in replies)
    assert totals["completion_tokens"] == sum(reply.completion_tokens for reply in replies)
    assert totals["latency_s"] >= max(reply.latency_s for reply in replies)


@pytest.mark.parametrize("cache_enabled", [True, False], ids=["cache-key", "switched-off"])
def test_the_fleet_prompt_cache_key_is_sent_unless_switched_off(
    server: OpenAIServer, cache_enabled: bool
) -> None:
    from worker.runtime import llm_config
    from worker.settings.config import Settings

    settings = Settings(llm_base_url=server.base_url, llm_prompt_cache=cache_enabled,
                        llm_prompt_cache_key="fleet-a", llm_max_retries=0)
    usage = LLMUsage()
    messages = build_summarize_messages("[seq 1] user:\n    | Where is my order?",
                                        prior=None, identifiers=())
    with LLMClient(llm_config(settings)) as client:
        for _ in range(2):
            client.complete_json(messages, schema=SCHEMA, max_output_tokens=256, usage=usage)

    bodies = [request.body for request in server.requests]
    if cache_enabled:
        assert {body["prompt_cache_key"] for body in bodies} == {
            f"fleet-a:{PROMPT_VERSION}"}
    else:
        assert not any("prompt_cache_key" in body for body in bodies)
    # The second request repeats the first: its static prefix comes from the cache.
    cached = [request.cached_tokens for request in server.requests]
    assert cached[0] == 0 and cached[1] >= 1_024
    assert usage.as_dict()["cached_tokens"] == cached[1]
