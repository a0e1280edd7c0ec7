"""Translation of OpenAI SDK errors into the job error tree, once, for the SDK client
(``worker.summarizers.openai_client``).

Provider-wide trouble (timeouts, connection, 5xx, 429, a missing model) becomes
``ProviderError``; refused credentials or permissions ``ProviderAuthFailed``; a prompt
over the context window ``ContextOverflow``; any other refusal of the request counts on
the session (``SessionFailure``).
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Iterable, Mapping

import openai

from worker.errors import (
    CompactionError,
    ContextOverflow,
    ProviderAuthFailed,
    ProviderError,
    ProviderRateLimited,
    SessionFailure,
)
from worker.scrub import scrub_secrets

_DETAIL_CHARS = 300

_CONTEXT_OVERFLOW = re.compile(
    r"context[ _-](length|window|size)|maximum context|too many tokens|prompt is too long",
    re.IGNORECASE,
)
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "structured output")


def is_context_overflow(exc: openai.APIStatusError) -> bool:
    """True for OpenAI's ``context_length_exceeded`` and its vLLM/llama.cpp wordings."""
    if exc.status_code not in (400, 413):
        return False
    return exc.code == "context_length_exceeded" or bool(_CONTEXT_OVERFLOW.search(exc.message))


def is_format_rejection(exc: openai.APIStatusError) -> bool:
    """True when the endpoint refused the ``response_format`` rather than the request."""
    if exc.status_code == 422:
        return True
    if exc.status_code != 400 or is_context_overflow(exc):
        return False
    text = f"{exc.param or ''} {exc.message}".lower()
    return any(word in text for word in _FORMAT_WORDS)


def count_retries_taken(exc: openai.OpenAIError) -> int:
    """Return the retries the SDK made before ``exc`` (0 when it cannot tell)."""
    if not isinstance(exc, openai.APIError):
        return 0
    value = exc.request.headers.get("x-stainless-retry-count", "0")
    return int(value) if value.isdigit() else 0


def parse_retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Return the delay a response asks for (``retry-after-ms``, seconds, or an HTTP date)."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(float(value) / divisor, 0.0)
        except ValueError:
            return _seconds_until(value) if name == "retry-after" else None
    return None


def _seconds_until(http_date: str) -> float | None:
    try:
        moment = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError):
        return None
    return max(moment.timestamp() - time.time(), 0.0)


def translate_error(
    exc: openai.OpenAIError, *, known_secrets: Iterable[str | None] = ()
) -> CompactionError:
    """Map an SDK error onto the job error tree (see ``worker/errors.py``).

    The provider's own text is scrubbed of credentials here, the one place it enters a
    message, so events, runs rows and logs never carry a key an endpoint echoed;
    ``known_secrets`` (the configured API key) are removed verbatim.
    """
    secrets = tuple(known_secrets)
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("the LLM request timed out", reason="timeout")
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError("could not reach the LLM endpoint", reason="connection")
    if isinstance(exc, openai.RateLimitError):
        return ProviderRateLimited(f"the LLM endpoint is rate limiting: "
                                   f"{_detail(exc, secrets)}",
                                   retry_after_s=parse_retry_after_s(exc.response.headers))
    if isinstance(exc, openai.APIStatusError):
        return _translate_status(exc, _detail(exc, secrets))
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError("the LLM endpoint answered an unreadable body",
                             reason="invalid_response")
    return ProviderError(f"the OpenAI SDK failed: {type(exc).__name__}", reason="client_error")


def _translate_status(exc: openai.APIStatusError, detail: str) -> CompactionError:
    status = exc.status_code
    if is_context_overflow(exc):
        return ContextOverflow(f"the prompt exceeds the model's context: {detail}",
                               reason="context_length_exceeded")
    if status >= 500 or status in (408, 409):
        return ProviderError(f"the LLM endpoint failed ({status}): {detail}",
                             reason="server_error")
    if status in (401, 403):
        # A wrong key is no outage and no session's fault: retrying cannot fix it.
        return ProviderAuthFailed(f"the LLM endpoint refused the credentials ({status}): "
                                  f"{detail}")
    if status == 404:
        # A missing model is the deployment's fault, not the session's.
        return ProviderError(f"the LLM endpoint has no such model or path (404): {detail}",
                             reason="not_found")
    return SessionFailure(f"the LLM endpoint rejected the request ({status}): {detail}",
                          reason="bad_request")


def _detail(exc: openai.APIStatusError, secrets: tuple[str | None, ...]) -> str:
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    # Scrubbed whole, then cut: a cut first could leave half a key no pattern knows.
    return scrub_secrets(str(message or exc.message), known=secrets)[:_DETAIL_CHARS]
