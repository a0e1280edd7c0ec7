"""The test OpenAI server's behaviours, and the reply each one gives a chat request.

Replies are shaped like OpenAI's: a ``chat.completion`` object with ``usage``, or an
``{"error": {message, type, param, code}}`` body with the matching status; the garbage
behaviours (``GARBAGE``) answer 200 with a body that is no chat completion, as a proxy,
a captive portal or a broken gateway does.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tests.support import fake_summaries
from worker.compaction.messages import INSTRUCTION_ROLES, ChatMessage
from worker.compaction.tokens import TokenCounter


class Behaviour(StrEnum):
    OK = "ok"
    LATENCY = "latency"
    HANG = "hang"
    ERROR_500 = "error_500"
    RATE_LIMIT_429 = "rate_limit_429"
    UNAUTHORIZED_401 = "unauthorized_401"
    FORBIDDEN_403 = "forbidden_403"
    ECHO_KEY_401 = "echo_key_401"  # a 401 whose message quotes ECHOED_API_KEY, as some do
    MALFORMED_JSON = "malformed_json"
    WRONG_SCHEMA = "wrong_schema"
    EMPTY_SECTIONS = "empty_sections"
    TRUNCATED = "truncated"
    CONTEXT_LENGTH = "context_length"
    JSON_MODE_ONLY = "json_mode_only"
    PLAIN_TEXT_FENCED = "plain_text_fenced"
    HTML_PAGE = "html_page"  # text/html: a login or error page
    RANDOM_BYTES = "random_bytes"  # application/json, bytes that are no UTF-8
    NOT_JSON = "not_json"  # application/json, plain words
    WRONG_CONTENT_TYPE = "wrong_content_type"  # text/plain, a gateway's one-liner
    NOT_A_COMPLETION = "not_a_completion"  # JSON without choices (an error envelope)
    WRONG_TYPES = "wrong_types"  # a completion whose choice's message is a string
    NOT_AN_OBJECT = "not_an_object"  # JSON null
    EMPTY_BODY = "empty_body"  # application/json, zero bytes
    TRUNCATED_BODY = "truncated_body"  # a completion's JSON cut in half, length to match
    CUT_CONNECTION = "cut_connection"  # the body promised, half sent, connection closed
    BAD_ENCODING = "bad_encoding"  # a completion labelled Content-Encoding: gzip, plain
    LYING = "lying"  # flips call outcomes, reopens answered requests, invents identifiers


_ALIASES = {"500": Behaviour.ERROR_500, "429": Behaviour.RATE_LIMIT_429,
            "401": Behaviour.UNAUTHORIZED_401, "403": Behaviour.FORBIDDEN_403}
RETRY_AFTER_S = 1
# The key ECHO_KEY_401 quotes: the handler does not pass request headers to a behaviour, so
# a test configures its client with this key. Shaped like no known provider's key, so only
# removing the configured key verbatim can catch it.
ECHOED_API_KEY = "local-proxy-key-7f3a9c41"


@dataclass(frozen=True)
class BehaviourSpec:
    """A behaviour, and how many requests it applies to before ``ok`` (None: all)."""

    behaviour: Behaviour
    times: int | None = None

    @classmethod
    def parse(cls, text: str | Behaviour) -> BehaviourSpec:
        """Parse ``name`` or ``name:N`` (``500``, ``429``, ``401``, ``403`` are names too)."""
        name, _, count = str(text).partition(":")
        behaviour = _ALIASES.get(name) or Behaviour(name)
        return cls(behaviour, int(count) if count else None)


@dataclass(frozen=True)
class ServerConfig:
    """What the server was started with (``context_window`` in tokens)."""

    context_window: int = 128_000
    latency_ms: int = 500
    model: str = "test-summarizer"
    include_usage: bool = True


@dataclass(frozen=True)
class ChatRequest:
    body: dict[str, Any]
    messages: list[ChatMessage]
    prompt_tokens: int

    @property
    def format_type(self) -> str | None:
        response_format = self.body.get("response_format") or {}
        return response_format.get("type") if isinstance(response_format, dict) else None

    @property
    def max_output_tokens(self) -> int:
        return int(self.body.get("max_completion_tokens") or self.body.get("max_tokens") or 0)


@dataclass(frozen=True)
class Reply:
    """What to send back: ``payload`` None means never answer (the request hangs)."""

    status: int
    payload: dict[str, Any] | None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    body: bytes | None = None  # sent verbatim in place of the payload's JSON
    content_type: str = "application/json"
    cut_after: int | None = None  # close the connection after this many body bytes


def answer_chat(behaviour: Behaviour, request: ChatRequest, config: ServerConfig,
                counter: TokenCounter) -> Reply:
    """Decide the reply to one chat request under ``behaviour``."""
    requested_tokens = request.prompt_tokens + request.max_output_tokens
    if behaviour is Behaviour.HANG:
        return Reply(0, None)
    if behaviour is Behaviour.ERROR_500:
        return error_reply(500, "The server had an error while processing your request.",
                           "server_error")
    if behaviour is Behaviour.RATE_LIMIT_429:
        return error_reply(429, "Rate limit reached for requests.", "requests",
                           code="rate_limit_exceeded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
    if behaviour is Behaviour.UNAUTHORIZED_401:
        return error_reply(401, "Incorrect API key provided.", "invalid_request_error",
                           code="invalid_api_key")
    if behaviour is Behaviour.ECHO_KEY_401:
        return error_reply(401, f"Incorrect API key provided: {ECHOED_API_KEY}. Sent as "
                           f"'Authorization: Bearer {ECHOED_API_KEY}'.", "invalid_request_error",
                           code="invalid_api_key")
    if behaviour is Behaviour.FORBIDDEN_403:
        return error_reply(403, "You are not allowed to use this model.",
                           "invalid_request_error", code="model_not_allowed")
    if behaviour is Behaviour.CONTEXT_LENGTH or requested_tokens > config.context_window:
        return _context_error(request, config.context_window)
    if behaviour is Behaviour.JSON_MODE_ONLY and request.format_type == "json_schema":
        return _format_error("'response_format.type' json_schema is not supported; use "
                             "json_object")
    if behaviour is Behaviour.PLAIN_TEXT_FENCED and request.format_type is not None:
        return _format_error("'response_format' is not supported by this model")
    reply = _completion(behaviour, request, config, counter)
    if behaviour in GARBAGE:
        return garbage_reply(behaviour, reply)
    if behaviour is Behaviour.CUT_CONNECTION:  # half the promised body, then a hang-up
        whole = json.dumps(reply.payload).encode()
        return Reply(200, {}, body=whole, cut_after=len(whole) // 2)
    if behaviour is Behaviour.BAD_ENCODING:
        return Reply(200, reply.payload, headers={"Content-Encoding": "gzip"})
    if behaviour is Behaviour.LATENCY:
        return Reply(reply.status, reply.payload, delay_s=config.latency_ms / 1000)
    return reply


_HTML = (b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><h1>Session "
         b"expired</h1><p>Please sign in to continue.</p></body></html>\n")
# Latin-1 text, a UTF-16 mark and stray continuation bytes: no UTF-8 decoder takes them.
_RANDOM_BYTES = b"\xff\xfe\x00\x81\x9c\xc3\x28caf\xe9 \xa0\xa1" + bytes(range(0x80, 0xc0))
_RAW_BODIES: dict[Behaviour, tuple[bytes, str]] = {
    Behaviour.HTML_PAGE: (_HTML, "text/html; charset=utf-8"),
    Behaviour.RANDOM_BYTES: (_RANDOM_BYTES, "application/json"),
    Behaviour.NOT_JSON: (b"upstream request timeout", "application/json"),
    Behaviour.WRONG_CONTENT_TYPE: (b"OK", "text/plain"),
    Behaviour.NOT_AN_OBJECT: (b"null", "application/json"),
    Behaviour.EMPTY_BODY: (b"", "application/json"),
}
# Whole HTTP replies whose body is no chat completion (CUT_CONNECTION is no whole reply;
# BAD_ENCODING's body the HTTP client cannot even decode).
GARBAGE = frozenset({*_RAW_BODIES, Behaviour.NOT_A_COMPLETION, Behaviour.WRONG_TYPES,
                     Behaviour.TRUNCATED_BODY})


def garbage_reply(behaviour: Behaviour, completion: Reply) -> Reply:
    """A 200 reply that is no chat completion; ``completion`` is the one it spoils."""
    if behaviour in _RAW_BODIES:
        body, content_type = _RAW_BODIES[behaviour]
        return Reply(200, {}, body=body, content_type=content_type)
    if behaviour is Behaviour.NOT_A_COMPLETION:
        return Reply(200, {"error": {"message": "The upstream model is overloaded.",
                                     "type": "server_error", "param": None, "code": None}})
    payload = completion.payload or {}
    if behaviour is Behaviour.WRONG_TYPES:
        spoilt = [{**choice, "message": choice["message"]["content"]}
                  for choice in payload["choices"]]
        return Reply(200, {**payload, "choices": spoilt})
    whole = json.dumps(payload).encode()  # TRUNCATED_BODY: a whole reply of half the JSON
    return Reply(200, {}, body=whole[: len(whole) // 2])


def error_reply(status: int, message: str, error_type: str, *, param: str | None = None,
                code: str | None = None, headers: dict[str, str] | None = None) -> Reply:
    """Build an error reply with OpenAI's error body."""
    error = {"message": message, "type": error_type, "param": param, "code": code}
    return Reply(status, {"error": error}, headers or {})


def _context_error(request: ChatRequest, context_window: int) -> Reply:
    prompt, output = request.prompt_tokens, request.max_output_tokens
    message = (
        f"This model's maximum context length is {context_window} tokens. However, you "
        f"requested {prompt + output} tokens ({prompt} in the messages, {output} in the "
        "completion). Please reduce the length of the messages or completion."
    )
    return error_reply(400, message, "invalid_request_error", param="messages",
                       code="context_length_exceeded")


def _format_error(message: str) -> Reply:
    return error_reply(400, message, "invalid_request_error", param="response_format")


def _completion(behaviour: Behaviour, request: ChatRequest, config: ServerConfig,
                counter: TokenCounter) -> Reply:
    content, finish_reason = compose_content(behaviour, request, counter)
    tokens = counter.encoding.encode_ordinary(content)
    if request.max_output_tokens and len(tokens) > request.max_output_tokens:
        # A real model stops at its output budget, mid-JSON if need be.
        content = counter.encoding.decode(tokens[: request.max_output_tokens])
        finish_reason = "length"
    message = {"role": "assistant", "content": content, "refusal": None}
    payload: dict[str, Any] = {
        "id": f"chatcmpl-test-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.body.get("model") or config.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                     "logprobs": None}],
    }
    if config.include_usage:
        completion_tokens = counter.count_text(content)
        payload["usage"] = {"prompt_tokens": request.prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": request.prompt_tokens + completion_tokens}
    return Reply(200, payload)


def compose_content(behaviour: Behaviour, request: ChatRequest,
                    counter: TokenCounter) -> tuple[str, str]:
    """Return the reply content and finish reason of a request that gets an answer."""
    json_schema = (request.body.get("response_format") or {}).get("json_schema") or {}
    schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
    sections = fake_summaries.sections_of(schema if isinstance(schema, dict) else None)
    prompt_text = "\n".join(m.text for m in request.messages if m.role not in INSTRUCTION_ROLES)
    if behaviour is Behaviour.WRONG_SCHEMA:
        return json.dumps(fake_summaries.build_wrong_schema_summary(prompt_text)), "stop"
    if behaviour is Behaviour.EMPTY_SECTIONS:
        return json.dumps(fake_summaries.build_empty_summary(sections)), "stop"
    build = (fake_summaries.build_lying_summary if behaviour is Behaviour.LYING
             else fake_summaries.build_summary)
    summary = build(prompt_text, sections)
    limit_tokens = _summary_limit_tokens(request)
    if limit_tokens is not None:
        summary = fake_summaries.fit_summary(summary, limit_tokens, counter.count_text)
    text = json.dumps(summary, ensure_ascii=False)
    if behaviour is Behaviour.MALFORMED_JSON:
        return fake_summaries.break_json(text), "stop"
    if behaviour is Behaviour.TRUNCATED:
        return text[: len(text) // 2], "length"
    if behaviour is Behaviour.PLAIN_TEXT_FENCED:
        return fake_summaries.fence_json(text), "stop"
    return text, "stop"


_BUDGET_HINT = re.compile(r"under about (\d+) tokens")
SUMMARY_FILL_RATIO = 0.75  # room left for the renderer's headings and the counting drift


def _summary_limit_tokens(request: ChatRequest) -> int | None:
    """Size the summary as a well-behaved model would: under the output budget and under
    the prompt's own size hint, with a margin."""
    limits = [request.max_output_tokens] if request.max_output_tokens else []
    instructions = "\n".join(m.text for m in request.messages if m.role in INSTRUCTION_ROLES)
    limits.extend(int(hint) for hint in _BUDGET_HINT.findall(instructions))
    return int(min(limits) * SUMMARY_FILL_RATIO) if limits else None
