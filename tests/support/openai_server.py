"""A real loopback HTTP server speaking enough of the OpenAI API to test the LLM client
(and, for a request offering ``tools``, an agent: ``tests/support/agent_replies.py``; on
``/v1/responses`` and ``/v1/messages``, an agent on the Responses API or Anthropic's
Messages API that refuses what the real API refuses: ``tests/support/responses_api.py``,
``tests/support/anthropic_api.py``).

It misbehaves on cue: for the whole run (``behaviour``, changeable between calls), per
request (an ``X-Test-Behaviour`` header) or per prompt (a ``[[behave:SPEC]]`` marker),
where SPEC is a behaviour, optionally ``:N`` to misbehave N times and then answer ok.
Run it alone with ``python -m tests.support.openai_server --port 0``.

It speaks the Files and Batch APIs too (``tests/support/batch_api.py``): each batch line is
answered by the same chat logic, log and usage as the synchronous request.

Usage reports ``prompt_tokens_details.cached_tokens`` from a prompt cache that behaves as
OpenAI's (``tests/support/prompt_cache.py``).

It stands in for a remote model, so its own CPU is a benchmark artifact on the machine it
shares with the worker: a request body it has seen is not parsed, counted or answered
again (:class:`_Memo`); the reply is the one it composed then, under a fresh id.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import re
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

from pydantic import ValidationError

from tests.support.agent_replies import answer_agent_turn, is_agent_turn
from tests.support.anthropic_api import answer_messages
from tests.support.batch_api import BatchApi, BatchKnobs
from tests.support.openai_behaviours import (
    Behaviour,
    BehaviourSpec,
    ChatRequest,
    Reply,
    ServerConfig,
    answer_chat,
    error_reply,
)
from tests.support.prompt_cache import PromptCache, prefix_block_hashes
from tests.support.responses_api import Ledger, answer_responses
from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.tokenizer.offline import load_encoding

HANG_S = 600.0  # past any sane client timeout; cut short when the server stops
BEHAVIOUR_HEADER = "X-Test-Behaviour"
# Request bodies remembered, least recently used dropped: a benchmark's few distinct
# prompts (one per session size), at most a few MB in all.
MEMO_BODIES = 8
_MARKER = re.compile(r"\[\[behave:([A-Za-z0-9_]+(?::\d+)?)\]\]")
AGENT_ENDPOINTS = {"/v1/responses": answer_responses, "/v1/messages": answer_messages}


@dataclass(frozen=True)
class RecordedRequest:
    """One chat request as the server saw it (header names lower-cased), and the behaviour
    it was answered with (None: refused before one applies, for its key or its body)."""

    headers: dict[str, str]
    body: dict[str, Any]
    prompt_tokens: int
    behaviour: Behaviour | None
    path: str = ""  # as requested, its query string included
    cached_tokens: int = 0  # what its usage reports as served from the prompt cache


@dataclass
class _Seen:
    """One request body as parsed and counted, and the replies composed for it."""

    body: dict[str, Any] | None
    request: ChatRequest | None
    replies: dict[tuple[Behaviour, ServerConfig], Reply] = field(default_factory=dict)
    blocks: tuple[bytes, ...] | None = None  # its prompt's cache blocks, once hashed

    def prompt_blocks(self) -> tuple[bytes, ...]:
        """The prompt's cache blocks (``tests/support/prompt_cache.py``), hashed once."""
        if self.blocks is None:
            messages = self.request.messages if self.request is not None else []
            self.blocks = prefix_block_hashes(messages, _counter())
        return self.blocks


class _Memo:
    """What the server made of the request bodies it saw last, by their bytes. A reply is
    a pure function of the body, the behaviour and the configuration, so remembering it
    changes nothing a client sees but the CPU the server spends (counts stay exact)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: OrderedDict[bytes, _Seen] = OrderedDict()

    def seen(self, raw: bytes) -> _Seen:
        """The body ``raw`` parsed and counted, from memory when it was seen before."""
        with self._lock:
            seen = self._seen.get(raw)
            if seen is not None:
                self._seen.move_to_end(raw)
                return seen
        body = _parse_body(raw)
        seen = _Seen(body, _parse_chat_request(body))
        with self._lock:
            self._seen[raw] = seen
            while len(self._seen) > MEMO_BODIES:
                self._seen.popitem(last=False)
        return seen

    def reply(self, seen: _Seen, key: tuple[Behaviour, ServerConfig],
              compose: Callable[[], Reply]) -> Reply:
        """The reply to ``seen`` under ``key``: composed once, then the same one anew."""
        with self._lock:
            reply = seen.replies.get(key)
        if reply is None:
            reply = compose()
            with self._lock:
                seen.replies[key] = reply
            return reply
        return _anew(reply)


def _anew(reply: Reply) -> Reply:
    """A remembered reply with its own id and creation time, as every completion has."""
    payload = reply.payload
    if payload is None or "created" not in payload:
        return reply
    fresh = {**payload, "id": f"chatcmpl-test-{time.monotonic_ns()}",
             "created": int(time.time())}
    return dataclasses.replace(reply, payload=fresh)


@dataclass
class _State:
    """What the handler threads share; every mutable field is guarded by ``lock``."""

    behaviour: BehaviourSpec
    config: ServerConfig
    api_key: str | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    memo: _Memo = field(default_factory=_Memo)
    prompt_cache: PromptCache = field(default_factory=PromptCache)
    stopping: threading.Event = field(default_factory=threading.Event)
    log: list[RecordedRequest] = field(default_factory=list)
    ledgers: dict[str, Ledger] = field(
        default_factory=lambda: {path: Ledger() for path in AGENT_ENDPOINTS})
    served: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    batches: BatchApi = field(init=False)

    def __post_init__(self) -> None:
        self.batches = BatchApi(functools.partial(_answer_line, self))

    def resolve(self, source: str, spec: BehaviourSpec) -> Behaviour:
        """Return this request's behaviour, spending one of ``spec``'s N times."""
        if spec.times is None:
            return spec.behaviour
        # Counted per source and spec: every prompt carrying one marker shares its N.
        key = f"{source}:{spec.behaviour}:{spec.times}"
        with self.lock:
            self.served[key] = self.served.get(key, 0) + 1
            return spec.behaviour if self.served[key] <= spec.times else Behaviour.OK

    @contextlib.contextmanager
    def counting_in_flight(self) -> Iterator[None]:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self.lock:
                self.in_flight -= 1


@functools.cache
def _counter() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"))


class OpenAIServer:
    """The server on a background thread; a context manager (``base_url`` ends in /v1)."""

    def __init__(self, *, behaviour: str | Behaviour = Behaviour.OK, context_window: int = 128_000,
                 latency_ms: int = 500, host: str = "127.0.0.1", port: int = 0,
                 model: str = "test-summarizer", api_key: str | None = None,
                 include_usage: bool = True) -> None:
        config = ServerConfig(context_window, latency_ms, model, include_usage)
        self._state = _State(BehaviourSpec.parse(behaviour), config, api_key)
        self._httpd = _HTTPServer((host, port), self._state)
        # A short poll keeps stop() quick: shutdown() waits for the loop to notice.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> Self:
        _counter()  # load the encoding once, before requests race for it
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; requests that hang or wait are woken and dropped."""
        self._state.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_behaviour(self, behaviour: str | Behaviour) -> None:
        """Answer later requests with ``behaviour`` (``name`` or ``name:N``)."""
        with self._state.lock:
            self._state.behaviour = BehaviourSpec.parse(behaviour)
            self._state.served = {
                key: count for key, count in self._state.served.items()
                if not key.startswith("run:")
            }

    def set_context_window(self, tokens: int) -> None:
        with self._state.lock:
            self._state.config = dataclasses.replace(self._state.config, context_window=tokens)

    @property
    def requests(self) -> list[RecordedRequest]:
        """The chat requests received so far, oldest first."""
        with self._state.lock:
            return list(self._state.log)

    @property
    def request_count(self) -> int:
        with self._state.lock:
            return len(self._state.log)

    @property
    def max_in_flight(self) -> int:
        """The most chat requests handled at the same time."""
        with self._state.lock:
            return self._state.max_in_flight

    def rejected(self, path: str) -> list[list[str]]:
        """The errors of every request to an agent endpoint (``/v1/responses``,
        ``/v1/messages``) refused with a 400, oldest first."""
        ledger = self._state.ledgers[path]
        with ledger.lock:
            return list(ledger.rejected)

    def set_batch_knobs(self, knobs: BatchKnobs) -> None:
        """Make batches slow, expire or fail (``tests/support/batch_api.py``), from now on."""
        self._state.batches.knobs = knobs

    @property
    def batch_ids(self) -> list[str]:
        return self._state.batches.batch_ids()

    def clear_log(self) -> None:
        with self._state.lock:
            self._state.log.clear()
            self._state.max_in_flight = 0


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        super().__init__(address, _Handler)
        self.state = state

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected here, not a server fault.
        return


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the SDK's connection pool expects
    # TCP_NODELAY: a reply leaves as two writes (headers, body); with Nagle the body waits
    # for the ACK of the headers, which the client delays by ~40 ms.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if self._answer_batch_api("GET", b""):
            return
        if urlsplit(self.path).path.rstrip("/") != "/v1/models":
            self._send(error_reply(404, f"Unknown path {self.path}", "invalid_request_error"))
            return
        model = self.server.state.config.model
        entry = {"id": model, "object": "model", "created": 0, "owned_by": "tests"}
        self._send(Reply(200, {"object": "list", "data": [entry]}))

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self._answer_batch_api("POST", raw):
            return
        if urlsplit(self.path).path.rstrip("/") in AGENT_ENDPOINTS:
            self._send(self._answer_agent(_parse_body(raw)))
            return
        if urlsplit(self.path).path.rstrip("/") != "/v1/chat/completions":
            self._send(error_reply(404, f"Unknown path {self.path}", "invalid_request_error"))
            return
        state = self.server.state
        with state.counting_in_flight():
            reply = self._answer_chat(state.memo.seen(raw))
            if reply.payload is None:
                state.stopping.wait(HANG_S)
                self.close_connection = True
                return
            if reply.delay_s:
                state.stopping.wait(reply.delay_s)
            self._send(reply)

    def _answer_chat(self, seen: _Seen) -> Reply:
        headers = {name.lower(): value for name, value in self.headers.items()}
        state = self.server.state
        authorized = not state.api_key or (
            self.headers.get("Authorization") == f"Bearer {state.api_key}")
        return _answer_seen(state, seen, headers, self.path, authorized)

    def _answer_batch_api(self, method: str, raw: bytes) -> bool:
        """Answer a Files or Batch API request; False when the path is neither's."""
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = self.server.state.batches.route(method, urlsplit(self.path).path, headers, raw)
        if reply is not None:
            self._send(reply)
        return reply is not None

    def _answer_agent(self, body: dict[str, Any] | None) -> Reply:
        state, path = self.server.state, urlsplit(self.path).path.rstrip("/")
        headers = {name.lower(): value for name, value in self.headers.items()}
        with state.lock:
            state.log.append(RecordedRequest(headers, body or {}, 0, None, self.path))
            model = state.config.model
        return AGENT_ENDPOINTS[path](body, state.ledgers[path], model)

    def _send(self, reply: Reply) -> None:
        data = reply.body if reply.body is not None else json.dumps(reply.payload).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if reply.cut_after is None:
            self.wfile.write(data)
            return
        self.wfile.write(data[: reply.cut_after])
        self.wfile.flush()
        self.close_connection = True  # the rest of the promised body never comes



def _answer_seen(state: _State, seen: _Seen, headers: dict[str, str], path: str,
                 authorized: bool) -> Reply:
    """Log a chat request (refused ones too) and decide its reply."""
    body, request = seen.body, seen.request
    behaviour = (_resolve_behaviour(state, request, headers.get(BEHAVIOUR_HEADER.lower()))
                 if request and authorized else None)
    cached_tokens = 0
    if behaviour is not None and body is not None:
        key = body.get("prompt_cache_key")
        cached_tokens = state.prompt_cache.serve(
            seen.prompt_blocks(), key if isinstance(key, str) else None)
    with state.lock:
        state.log.append(RecordedRequest(headers, body or {},
                                         request.prompt_tokens if request else 0, behaviour,
                                         path, cached_tokens))
        config = state.config
    if not authorized:
        return error_reply(401, "Incorrect API key provided.", "invalid_request_error",
                           code="invalid_api_key")
    if request is None or behaviour is None:
        return error_reply(400, "Invalid 'messages'.", "invalid_request_error",
                           param="messages")
    if is_agent_turn(request):
        return answer_agent_turn(request, config, _counter())
    reply = state.memo.reply(seen, (behaviour, config),
                             lambda: answer_chat(behaviour, request, config, _counter()))
    return _with_cached_tokens(reply, cached_tokens)


def _answer_line(state: _State, body: dict[str, Any]) -> Reply:
    """A batch line's reply: the same logic, log and usage as the synchronous request."""
    seen = state.memo.seen(json.dumps(body).encode())
    return _answer_seen(state, seen, {}, "/v1/batches", authorized=True)


def _resolve_behaviour(state: _State, request: ChatRequest, header: str | None) -> Behaviour:
    """The request's behaviour: its header's, its prompt's marker's, else the run's."""
    if header:
        return state.resolve("header", BehaviourSpec.parse(header))
    marker = _MARKER.search("\n".join(message.text for message in request.messages))
    if marker:
        return state.resolve("marker", BehaviourSpec.parse(marker.group(1)))
    with state.lock:
        spec = state.behaviour
    return state.resolve("run", spec)


def _with_cached_tokens(reply: Reply, cached_tokens: int) -> Reply:
    """``reply`` with its usage's ``prompt_tokens_details``, as OpenAI reports it."""
    usage = (reply.payload or {}).get("usage")
    if not isinstance(usage, dict):
        return reply
    details = {"cached_tokens": min(cached_tokens, usage["prompt_tokens"]), "audio_tokens": 0}
    payload = {**(reply.payload or {}), "usage": {**usage, "prompt_tokens_details": details}}
    return dataclasses.replace(reply, payload=payload)


def _parse_body(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw or b"null")
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _parse_chat_request(body: dict[str, Any] | None) -> ChatRequest | None:
    """Return the request with its counted messages, or None when they do not parse."""
    if body is None or not isinstance(body.get("messages"), list):
        return None
    try:
        messages = [parse_message(item) for item in body["messages"]]
    except (ValidationError, TypeError):
        return None
    return ChatRequest(body, messages, _counter().count_messages(messages))


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM; print the base URL once the port is bound."""
    parser = argparse.ArgumentParser(description="OpenAI-protocol test server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099, help="0 picks a free port")
    parser.add_argument("--behaviour", default=Behaviour.OK.value,
                        help=f"name or name:N; one of {', '.join(b.value for b in Behaviour)}")
    parser.add_argument("--context-window", type=int, default=128_000, help="tokens")
    parser.add_argument("--latency-ms", type=int, default=500, help="delay of 'latency' (ms)")
    parser.add_argument("--model", default="test-summarizer")
    parser.add_argument("--api-key", default=None, help="require this bearer key")
    args = parser.parse_args(argv)
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    server = OpenAIServer(behaviour=args.behaviour, context_window=args.context_window,
                          latency_ms=args.latency_ms, host=args.host, port=args.port,
                          model=args.model, api_key=args.api_key)
    with server:
        print(f"openai test server listening on {server.base_url}", flush=True)
        done.wait()


if __name__ == "__main__":
    main()
