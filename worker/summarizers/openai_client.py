"""The LLM adapter: one JSON completion through the OpenAI SDK, its output mode, its errors.

Structured output is asked for as a strict ``json_schema``; an endpoint that rejects it
gets ``json_object``, then plain text. The mode that
worked is remembered per endpoint (base URL + model) for the life of the client.

Retries have one owner, the SDK (``max_retries``): it already retries timeouts,
connection errors, 408/409/429 and 5xx with jittered exponential backoff, honouring
``Retry-After`` up to two minutes. Owning them here too would multiply attempts; this
module only counts them (``retries_taken`` on a success, the ``x-stainless-retry-count``
header the SDK stamps on each attempt on a failure). SDK errors are translated once, by
``worker.summarizers.openai_errors``, into ``worker.errors``; nothing above this
module sees ``openai.*``.

A reply that is no chat completion at all (HTML, undecodable or cut JSON, no choices)
is the endpoint's fault: ``worker.summarizers.openai_reply`` reads the body and raises
``ProviderError`` (``invalid_response``). The model's JSON is not parsed here:
``LLMReply.content`` is its reply verbatim, and
``worker.compaction.validation.parse_summary`` reads it (a JSON object in prose
included) and names what is wrong (``malformed_json``, schema).

Each call is one client span when the worker traces (``worker.tracing``), with the
GenAI semantic conventions' attributes: model, token usage, finish reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ssl
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Self, cast
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import openai
from openai.types.chat import ChatCompletionMessageParam
from openai.types.chat.completion_create_params import ResponseFormat

from worker.compaction import TokenCounter, parse_message
from worker.errors import CompactionError, SummaryInvalid
from worker.logging import get_logger
from worker.summarizers.openai_errors import (
    count_retries_taken,
    is_format_rejection,
    translate_error,
)
from worker.summarizers.openai_reply import CompletionReply, read_completion
from worker.tokenizer.offline import load_encoding
from worker.tracing.spans import AttributeValue, open_span

GEN_AI_OPERATION = "chat"
GEN_AI_PROVIDER = "openai"
DEFAULT_PORTS = {"http": 80, "https": 443}
KEYLESS_PLACEHOLDER = "unused"  # local servers want no key, the SDK insists on one
SCHEMA_NAME = "summary"

log = get_logger()


class OutputMode(StrEnum):
    """How the endpoint is asked for JSON, strictest first."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    PLAIN_TEXT = "plain_text"


_FALLBACK = {OutputMode.JSON_SCHEMA: OutputMode.JSON_OBJECT,
             OutputMode.JSON_OBJECT: OutputMode.PLAIN_TEXT}


@dataclass(frozen=True)
class LLMConfig:
    """Where and how to call the summarizer; built by the caller from the settings."""

    base_url: str | None  # None: OpenAI's own endpoint
    api_key: str | None = field(repr=False)
    model: str
    connect_timeout_s: float
    read_timeout_s: float
    max_retries: int
    temperature: float | None = 0.0  # None: leave it out (models that reject it)
    prompt_cache_key: str | None = None  # None: not sent (endpoints that reject it)


@dataclass(frozen=True)
class LLMReply:
    """One completed call: the reply text and what it cost."""

    content: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    retries: int  # HTTP requests beyond the first: SDK retries and rejected output modes
    mode: OutputMode
    response_model: str | None = None
    response_id: str | None = None
    cached_tokens: int = 0  # of prompt_tokens, served from the provider's prompt cache
    batched: bool = False  # answered through the Batch API (billed at its discount)

    @property
    def is_truncated(self) -> bool:
        """True when the model stopped at its output budget (the JSON is cut off)."""
        return self.finish_reason == "length"


class LLMUsage:
    """Thread-safe totals of a job's LLM calls, for its outcome event."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = {"calls": 0, "failed_calls": 0, "prompt_tokens": 0,
                        "cached_tokens": 0, "completion_tokens": 0, "retries": 0,
                        "batched_prompt_tokens": 0, "batched_cached_tokens": 0,
                        "batched_completion_tokens": 0}
        self._latency_s = 0.0

    def add(self, reply: LLMReply) -> None:
        """Count one completed call (a batched one's tokens also apart, for its price)."""
        with self._lock:
            self._totals["calls"] += 1
            self._totals["retries"] += reply.retries
            self._latency_s += reply.latency_s
            for prefix in ("", "batched_") if reply.batched else ("",):
                self._totals[f"{prefix}prompt_tokens"] += reply.prompt_tokens
                self._totals[f"{prefix}cached_tokens"] += reply.cached_tokens
                self._totals[f"{prefix}completion_tokens"] += reply.completion_tokens

    def add_failure(self, *, retries: int, latency_s: float) -> None:
        """Count one call that ended in an error."""
        with self._lock:
            self._totals["calls"] += 1
            self._totals["failed_calls"] += 1
            self._totals["retries"] += retries
            self._latency_s += latency_s

    def as_dict(self) -> dict[str, int | float]:
        """The totals; ``latency_s`` sums call latencies (concurrent calls overlap)."""
        with self._lock:
            return {**self._totals, "latency_s": round(self._latency_s, 3)}


@dataclass
class _Tally:
    retries: int = 0


class _ModeMemory:
    """The output mode that last worked per endpoint (base URL, model)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._modes: dict[tuple[str, str], OutputMode] = {}

    def get(self, key: tuple[str, str]) -> OutputMode:
        with self._lock:
            return self._modes.get(key, OutputMode.JSON_SCHEMA)

    def remember(self, key: tuple[str, str], mode: OutputMode) -> None:
        with self._lock:
            self._modes[key] = mode


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    """The one TLS context of this process's LLM clients (the system's trusted CAs, or
    those ``SSL_CERT_FILE``/``SSL_CERT_DIR`` name, as the SDK's default context on Linux).
    Each context the SDK made itself cost ~4 MiB of OpenSSL memory; a worker makes this
    one before the pool forks (``share_before_fork`` builds a client), so that every
    child shares it instead of loading the certificates again."""
    return ssl.create_default_context()


class _HttpClient(openai.DefaultHttpxClient):
    """The SDK's default HTTP client, closed when collected as the SDK closes its own."""

    def __del__(self) -> None:
        # At interpreter exit its modules may be gone: nothing to report then.
        with contextlib.suppress(Exception):
            if not self.is_closed:
                self.close()


def split_query(base_url: str | None) -> tuple[str | None, dict[str, str]]:
    """The base URL without its query string, and that query's parameters.

    The SDK appends each path to the base URL as text, so a query there (a key passed as
    ``?api-key=``) would end up inside the path; as the SDK's default query, every
    request carries it.
    """
    if not base_url:
        return base_url, {}
    parts = urlsplit(base_url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit(parts._replace(query="")), query


class LLMClient:
    """Calls one OpenAI-compatible endpoint for JSON; safe to share between threads."""

    def __init__(self, config: LLMConfig, counter: TokenCounter | None = None) -> None:
        self._config = config
        self._counter = counter  # loaded on first need: only servers that omit usage need it
        self._modes = _ModeMemory()
        timeout = openai.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        base_url, query = split_query(config.base_url)
        self._sdk = openai.OpenAI(
            base_url=base_url,
            default_query=query or None,
            api_key=config.api_key or KEYLESS_PLACEHOLDER,
            timeout=timeout,
            max_retries=config.max_retries,
            http_client=_HttpClient(verify=shared_tls_context()),
        )
        # The SDK imports its chat resources (~1.4 MiB of modules) on first access: taken
        # here, a worker's preload (``share_before_fork``) loads them for every pool child.
        self._completions = self._sdk.chat.completions

    @property
    def model(self) -> str:
        return self._config.model

    @property
    def endpoint_key(self) -> tuple[str, str]:
        return (str(self._sdk.base_url), self._config.model)

    def close(self) -> None:
        self._sdk.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete_json(self, messages: list[dict[str, Any]], *, schema: dict[str, Any],
                      max_output_tokens: int, usage: LLMUsage | None = None) -> LLMReply:
        """Ask for a JSON object matching ``schema``; count the call into ``usage``.

        Raises:
            ProviderError, ProviderRateLimited: the endpoint failed (after SDK retries), or
                answered with something that is no chat completion (``invalid_response``).
            ProviderAuthFailed: the endpoint refused the key or its permissions (401/403).
            ContextOverflow: the prompt does not fit the model's context window.
            SessionFailure: the endpoint refused this request (4xx not about the endpoint).
            SummaryInvalid: the model refused to answer (``reason="refused"``).
        A reply cut at ``max_output_tokens`` is returned, with ``is_truncated`` set.
        """
        started = time.monotonic()
        tally = _Tally()
        with open_span(f"{GEN_AI_OPERATION} {self._config.model}",
                       self._request_attributes(max_output_tokens), client=True) as span:
            try:
                reply = self._call(messages, schema, max_output_tokens, tally, started)
            except CompactionError:
                if usage is not None:
                    usage.add_failure(retries=tally.retries,
                                      latency_s=time.monotonic() - started)
                raise
            if span.is_recording():
                span.note(reply_attributes(reply))
        if usage is not None:
            usage.add(reply)
        return reply

    def _request_attributes(self, max_output_tokens: int) -> dict[str, AttributeValue]:
        """The LLM call span's request attributes (GenAI semantic conventions)."""
        url = self._sdk.base_url
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": GEN_AI_OPERATION, "gen_ai.provider.name": GEN_AI_PROVIDER,
            "gen_ai.system": GEN_AI_PROVIDER, "gen_ai.request.model": self._config.model,
            "gen_ai.request.max_tokens": max_output_tokens,
            "server.address": url.host, "server.port": url.port or DEFAULT_PORTS[url.scheme]}
        if self._config.temperature is not None:
            attributes["gen_ai.request.temperature"] = self._config.temperature
        return attributes

    def _call(self, messages: list[dict[str, Any]], schema: dict[str, Any],
              max_output_tokens: int, tally: _Tally, started: float) -> LLMReply:
        try:
            completion, mode = self._create_in_working_mode(
                messages, schema, max_output_tokens, tally
            )
        except openai.OpenAIError as exc:
            tally.retries += count_retries_taken(exc)
            raise self.translate(exc) from exc
        return self._read_reply(completion, mode, messages, tally.retries,
                                time.monotonic() - started)

    def _create_in_working_mode(
        self, messages: list[dict[str, Any]], schema: dict[str, Any], max_output_tokens: int,
        tally: _Tally,
    ) -> tuple[CompletionReply, OutputMode]:
        key = self.endpoint_key
        mode = self._modes.get(key)
        while True:
            try:
                raw = self._completions.with_raw_response.create(
                    **self.request_body(messages, schema, max_output_tokens, mode))
            except openai.APIStatusError as exc:
                fallback = _FALLBACK.get(mode)
                if fallback is None or not is_format_rejection(exc):
                    raise
                log.warning("llm.output_mode_rejected", model=self._config.model,
                            rejected_mode=mode.value, next_mode=fallback.value,
                            status=exc.status_code)
                tally.retries += 1 + count_retries_taken(exc)
                mode = fallback
                continue
            tally.retries += raw.retries_taken
            self._modes.remember(key, mode)
            return read_completion(raw.content, raw.headers.get("content-type", "")), mode

    def request_body(self, messages: list[dict[str, Any]], schema: dict[str, Any],
                     max_output_tokens: int, mode: OutputMode | None = None) -> dict[str, Any]:
        """One summarizer request as the SDK sends it, and as a Batch API line carries it
        (``mode`` None: the one that last worked on this endpoint)."""
        mode = self._modes.get(self.endpoint_key) if mode is None else mode
        body: dict[str, Any] = {
            "model": self._config.model,
            "messages": cast(list[ChatCompletionMessageParam], messages),
            "max_completion_tokens": max_output_tokens}
        if self._config.temperature is not None:
            body["temperature"] = self._config.temperature
        if mode is not OutputMode.PLAIN_TEXT:
            body["response_format"] = build_response_format(mode, schema)
        if self._config.prompt_cache_key:
            body["prompt_cache_key"] = self._config.prompt_cache_key
        return body

    def translate(self, exc: openai.OpenAIError) -> CompactionError:
        """``exc`` as a job error, the configured key removed from its text."""
        return translate_error(exc, known_secrets=(self._config.api_key,))

    @property
    def sdk(self) -> openai.OpenAI:
        """The SDK client, for the Batch API adapter (``openai_batch.py``)."""
        return self._sdk

    def read_batch_reply(self, body: bytes, messages: list[dict[str, Any]]) -> LLMReply:
        """Read one answered Batch API line's completion as a call's reply."""
        mode = self._modes.get(self.endpoint_key)
        reply = self._read_reply(read_completion(body, "application/json"), mode, messages,
                                 retries=0, latency_s=0.0)
        return dataclasses.replace(reply, batched=True)

    def _local_counter(self) -> TokenCounter:
        if self._counter is None:
            self._counter = TokenCounter(load_encoding())
        return self._counter

    def _read_reply(self, completion: CompletionReply, mode: OutputMode,
                    messages: list[dict[str, Any]], retries: int, latency_s: float) -> LLMReply:
        choice = completion.choices[0]
        if choice.message.content is None and choice.message.refusal:
            raise SummaryInvalid("the model refused to summarize", reason="refused")
        text = choice.message.content or ""
        cached_tokens = 0
        if completion.usage is not None:
            prompt_tokens = completion.usage.prompt_tokens
            completion_tokens = completion.usage.completion_tokens
            cached_tokens = completion.usage.cached_tokens
        else:  # some local servers omit usage: count it ourselves
            counter = self._local_counter()
            prompt_tokens = counter.count_messages(parse_message(m) for m in messages)
            completion_tokens = counter.count_text(text)
        return LLMReply(text, choice.finish_reason, prompt_tokens, completion_tokens,
                        latency_s, retries, mode, completion.model, completion.id,
                        cached_tokens)


def reply_attributes(reply: LLMReply) -> dict[str, AttributeValue]:
    """The LLM call span's reply attributes (GenAI semantic conventions, then ours)."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.input_tokens": reply.prompt_tokens,
        "gen_ai.usage.output_tokens": reply.completion_tokens,
        "compaction.llm.cached_tokens": reply.cached_tokens,
        "gen_ai.response.finish_reasons": [reply.finish_reason or "unknown"],
        "compaction.llm.output_mode": reply.mode.value,
        "compaction.llm.retries": reply.retries}
    if reply.response_model:
        attributes["gen_ai.response.model"] = reply.response_model
    if reply.response_id:
        attributes["gen_ai.response.id"] = reply.response_id
    return attributes


def build_response_format(mode: OutputMode, schema: dict[str, Any]) -> ResponseFormat | openai.Omit:
    """Return the ``response_format`` argument for ``mode`` (``openai.omit`` for plain text)."""
    if mode is OutputMode.JSON_SCHEMA:
        return {"type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": schema}}
    if mode is OutputMode.JSON_OBJECT:
        return {"type": "json_object"}
    return openai.omit
