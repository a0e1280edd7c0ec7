"""The LLM adapter's pure helpers: how endpoint errors are classified, how Retry-After is
read, and how JSON is cut out of a prose reply."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import httpx2
import openai
import pytest

from worker.errors import (
    ContextOverflow,
    Outcome,
    ProviderAuthFailed,
    ProviderError,
    ProviderRateLimited,
    SessionFailure,
)
from worker.summarizers.openai_errors import (
    is_context_overflow,
    is_format_rejection,
    parse_retry_after_s,
    translate_error,
)


def status_error(status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None
                 ) -> openai.APIStatusError:
    body: dict[str, Any] = {"message": message, "type": "x", "param": param, "code": code}
    request = httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions")
    response = httpx2.Response(status, json={"error": body}, headers=headers, request=request)
    kinds = {400: openai.BadRequestError, 429: openai.RateLimitError}
    kind = kinds.get(status, openai.APIStatusError)
    return kind(f"Error code: {status} - {message}", response=response, body=body)


@pytest.mark.parametrize("message, code", [
    ("This model's maximum context length is 8192 tokens.", "context_length_exceeded"),
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 "
     "tokens (4000 in the messages, 1000 in the completion).", None),  # vLLM
    ("the request exceeds the available context size, try increasing it", None),  # llama.cpp
])
def test_context_overflow_is_recognised_in_every_servers_wording(
    message: str, code: str | None
) -> None:
    error = status_error(400, message, code=code)

    assert is_context_overflow(error)
    assert isinstance(translate_error(error), ContextOverflow)
    assert not is_format_rejection(error)


@pytest.mark.parametrize("status, message, param, rejected", [
    (400, "response_format json_schema is not supported", None, True),
    (400, "Unsupported value", "response_format", True),
    (422, "Unprocessable Entity", None, True),
    (400, "Invalid 'messages[0].role'", "messages", False),
    (500, "response_format crashed the server", None, False),
])
def test_only_refusals_of_the_response_format_count_as_format_rejections(
    status: int, message: str, param: str | None, rejected: bool
) -> None:
    assert is_format_rejection(status_error(status, message, param=param)) is rejected


@pytest.mark.parametrize("status, kind, reason", [
    (401, ProviderAuthFailed, "auth_failed"),
    (403, ProviderAuthFailed, "auth_failed"),
    (404, ProviderError, "not_found"),
    (503, ProviderError, "server_error"),
    (400, SessionFailure, "bad_request"),
])
def test_status_errors_map_onto_the_job_error_tree(
    status: int, kind: type[Exception], reason: str
) -> None:
    error = translate_error(status_error(status, "nope"))

    assert type(error) is kind
    assert error.reason == reason


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_fail_at_once_without_touching_either_breaker(status: int) -> None:
    error = translate_error(status_error(status, "Incorrect API key provided."))

    assert (error.outcome, error.retryable, error.counts_on) == (Outcome.FAILED, False, None)


def test_a_rate_limit_carries_the_delay_the_endpoint_asked_for() -> None:
    error = translate_error(status_error(429, "slow down", headers={"Retry-After": "7"}))

    assert isinstance(error, ProviderRateLimited)
    assert error.retry_after_s == 7.0


def test_retry_after_is_read_in_milliseconds_seconds_or_as_an_http_date() -> None:
    in_ten_s = email.utils.formatdate(time.time() + 10, usegmt=True)

    assert parse_retry_after_s({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after_s({"retry-after": "2"}) == 2.0
    assert 8.0 <= (parse_retry_after_s({"retry-after": in_ten_s}) or 0) <= 10.0
    assert parse_retry_after_s({"retry-after": "soon"}) is None
    assert parse_retry_after_s({}) is None


@pytest.mark.parametrize("status", [401, 403, 429, 500, 400])
def test_provider_text_is_scrubbed_of_the_configured_key_and_of_key_shapes(status: int) -> None:
    message = ("Incorrect API key provided: my-own-proxy-key-0042 (also sent as "
               "sk-proj-Ab3dEf6hIj9kLm2nOp5q); header Authorization: Bearer abc.def.ghi-42")
    error = translate_error(status_error(status, message),
                            known_secrets=("my-own-proxy-key-0042",))

    for secret in ("my-own-proxy-key-0042", "sk-proj-Ab3dEf6hIj9kLm2nOp5q", "abc.def.ghi-42"):
        assert secret not in error.message
    assert "Incorrect API key provided: [redacted]" in error.message
