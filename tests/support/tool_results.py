"""Tool-calling sessions whose results end in every way the outcome classifier reads (test
runs, exit codes, tracebacks, HTTP statuses, JSON records, plain output), drawn from a
seeded grammar, in each wire format. No service: the unit suite may import this."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from tests.support.wire_convert import chat_to_anthropic, chat_to_responses

_TOOLS = ("run_tests", "shell", "http_get", "lookup_order")
_WORDS = ("sync", "ledger", "cache", "import", "parser", "seat", "refund", "queue")


def _test_run(rng: random.Random) -> str:
    failed, passed = rng.choice((0, 0, 1, 3)), rng.randint(1, 40)
    module = rng.choice(_WORDS)
    lines = [f"collected {failed + passed} items"]
    lines += [f"FAILED tests/test_{module}.py::test_{rng.choice(_WORDS)} - "
              f"E{rng.randint(1000, 9999)}-{module.upper()}" for _ in range(failed)]
    tally = f"{failed} failed, {passed} passed" if failed else f"{passed} passed"
    return "\n".join([*lines, f"=== {tally} in {rng.randint(1, 9)}.{rng.randint(0, 9)}s ==="])


def _exit(rng: random.Random) -> str:
    return f"$ make {rng.choice(_WORDS)}\nbuilding\nexit code {rng.choice((0, 0, 1, 2))}"


def _traceback(rng: random.Random) -> str:
    error = rng.choice(("KeyError", "ValueError", "TimeoutError"))
    return (f"Traceback (most recent call last):\n  File \"{rng.choice(_WORDS)}.py\", line "
            f"{rng.randint(2, 400)}\n{error}: '{rng.choice(_WORDS)}'")


def _http(rng: random.Random) -> str:
    return f"HTTP/1.1 {rng.choice((200, 201, 404, 503))} reply\n{{\"id\": {rng.randint(1, 99)}}}"


def _record(rng: random.Random) -> str:
    record: dict[str, Any] = {"id": f"{rng.choice(_WORDS)}-{rng.randint(1, 999)}"}
    field = rng.choice(("status", "error", "returncode", "status_code", None))
    if field == "status":
        record["status"] = rng.choice(("ok", "failed", "cancelled", "timeout", "completed"))
    elif field == "error":
        record["error"] = rng.choice((None, f"E{rng.randint(10, 99)}: no {rng.choice(_WORDS)}"))
    elif field is not None:
        record[field] = rng.choice((0, 1, 404) if field == "status_code" else (0, 1, 2))
    return json.dumps(record)


def _plain(rng: random.Random) -> str:
    return "\n".join(f"{rng.choice(_WORDS)} {rng.randint(1, 99)}"
                     for _ in range(rng.randint(1, 4)))


_RESULTS: tuple[Callable[[random.Random], str], ...] = (
    _test_run, _exit, _traceback, _http, _record, _plain)


def tool_turns(seed: int, turns: int) -> list[dict[str, Any]]:
    """Chat messages: per turn a user ask, one to three parallel calls with their results
    (in shuffled order), and the agent's answer; the same for the same seed."""
    rng, tag = random.Random(seed), f"s{seed}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Run what you change."}]
    for turn in range(turns):
        word = rng.choice(_WORDS)
        calls = [{"id": f"call_{tag}_{turn}_{k}", "type": "function", "function": {
            "name": rng.choice(_TOOLS), "arguments": json.dumps({"target": f"{word}-{k}"})}}
            for k in range(rng.randint(1, 3))]
        results = [{"role": "tool", "tool_call_id": call["id"],
                    "content": rng.choice(_RESULTS)(rng)} for call in calls]
        rng.shuffle(results)
        messages += [
            {"role": "user", "content": f"Please fix the {word} module ({tag}-{turn})."},
            {"role": "assistant", "content": None, "tool_calls": calls}, *results,
            {"role": "assistant", "content": f"I looked at the {word} module; see above."}]
    return messages


def tool_record(session_id: str, session_format: str, seed: int, turns: int
                ) -> dict[str, Any]:
    """A session record of ``tool_turns`` in ``session_format`` (chat, responses or
    anthropic), as import reads it."""
    messages = tool_turns(seed, turns)
    if session_format == "responses":
        return {"session_id": session_id, "format": "responses",
                "items": chat_to_responses(messages, seed=seed)}
    if session_format == "anthropic":
        system, converted = chat_to_anthropic(messages, seed=seed)
        return {"session_id": session_id, "format": "anthropic", "system": system,
                "messages": converted}
    return {"session_id": session_id, "messages": messages}
