"""Responses and Anthropic sessions generated from a seed: the same airline exchanges as
``generated.py``, with reasoning (summaries and encrypted content) or thinking (with
signatures, sometimes redacted), parallel function calls and hosted tool calls.
No service: the unit suite imports this."""

from __future__ import annotations

import base64
import random
from collections.abc import Callable
from typing import Any

TOOLS = ("get_reservation_details", "search_flights", "update_seat", "get_user_details")


def _opaque(rng: random.Random, size: int) -> str:
    """Stands for encrypted content or a signature: bytes only the provider can read."""
    return base64.b64encode(rng.randbytes(size)).decode()


def _calls(rng: random.Random, tag: str, turn: int) -> list[tuple[str, str, str, str]]:
    """One to three parallel calls: (call id, tool, arguments JSON, result JSON)."""
    calls = []
    for k in range(rng.randint(1, 3)):
        reservation = f"{tag}R{turn}x{k}"
        flight = f"HAT{rng.randint(100, 999)}"
        calls.append((f"call_{tag}_{turn}_{k}", rng.choice(TOOLS),
                      f'{{"reservation_id": "{reservation}"}}',
                      f'{{"reservation_id": "{reservation}", "flight": "{flight}", '
                      f'"seats_left": {rng.randint(0, 9)}, "status": "confirmed"}}'))
    return calls


def _call_pair(rng: random.Random, call_id: str, tool: str, arguments: str,
               output: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One call and its output item: a function call mostly, now and then one of the
    other kinds the Responses API pairs by call id, each in its own shape."""
    kind = rng.choice(["function_call"] * 6 + list(_OTHER_CALLS))
    if kind == "function_call":
        return ({"type": kind, "id": f"fc_{call_id}", "call_id": call_id, "name": tool,
                 "arguments": arguments, "status": "completed"},
                {"type": "function_call_output", "call_id": call_id, "output": output})
    call, result = _OTHER_CALLS[kind](call_id, arguments, output)
    return ({"type": kind, "id": f"it_{call_id}", **call},
            {"type": f"{kind}_output", **result})


# The other paired kinds: (call fields, output fields) from (call id, arguments, result).
_OTHER_CALLS: dict[str, Callable[[str, str, str], tuple[dict[str, Any], dict[str, Any]]]] = {
    "custom_tool_call": lambda cid, args, out: (
        {"call_id": cid, "name": "lookup", "input": args}, {"call_id": cid, "output": out}),
    "shell_call": lambda cid, args, out: (
        {"call_id": cid, "status": "completed", "action": {"commands": [f"lookup '{args}'"]}},
        {"call_id": cid, "output": [{"stdout": out, "stderr": "",
                                     "outcome": {"type": "exit", "exit_code": 0}}]}),
    "apply_patch_call": lambda cid, args, out: (
        {"call_id": cid, "status": "completed", "operation": {
            "type": "update_file", "path": "notes.md", "diff": f"+{args}"}},
        {"call_id": cid, "status": "completed", "output": out}),
    "local_shell_call": lambda cid, args, out: (
        {"call_id": cid, "status": "completed", "action": {
            "type": "exec", "command": ["lookup", args], "env": {}}},
        {"id": cid, "output": out}),
}


def _ask(tag: str, turn: int) -> str:
    return (f"Please check reservation {tag}R{turn}x0 and tell me whether flight "
            f"HAT{100 + turn} on 2024-05-{10 + turn % 20} still has seats.")


def responses_items(seed: int, turns: int, *, tag: str = "rs") -> list[dict[str, Any]]:
    """Responses input items: a developer prompt, then per turn a user message and the
    model's output items (reasoning before its calls, parallel calls, a hosted call now
    and then), the call outputs and a closing message."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = [{"type": "message", "role": "developer", "content":
                                    "You are an airline agent. Follow the policy."}]
    for turn in range(turns):
        items.append({"type": "message", "role": "user",
                      "content": [{"type": "input_text", "text": _ask(tag, turn)}]})
        if rng.random() < 0.3:
            items.append({"type": "web_search_call", "id": f"ws_{tag}_{turn}",
                          "status": "completed", "action": {
                              "type": "search", "query": f"HAT{100 + turn} delays"}})
        calls = _calls(rng, tag, turn)
        if rng.random() < 0.8:
            items.append({"type": "reasoning", "id": f"rs_{tag}_{turn}", "summary": [
                {"type": "summary_text", "text": f"Look up {len(calls)} reservation(s)."}],
                "encrypted_content": _opaque(rng, rng.randint(48, 160))})
        pairs = [_call_pair(rng, *call) for call in calls]
        items += [call for call, _ in pairs]
        items += [output for _, output in pairs]
        if rng.random() < 0.5:
            items.append({"type": "reasoning", "id": f"rs_{tag}_{turn}_answer", "summary": [],
                          "encrypted_content": _opaque(rng, 64)})
        items.append({"type": "message", "role": "assistant", "id": f"msg_{tag}_{turn}",
                      "status": "completed", "content": [{
                          "type": "output_text", "annotations": [], "text":
                          f"Reservation {tag}R{turn}x0 is confirmed on HAT{100 + turn}."}]})
    return items


def responses_record(session_id: str, seed: int, turns: int) -> dict[str, Any]:
    return {"session_id": session_id, "format": "responses", "agent": "airline",
            "items": responses_items(seed, turns, tag=session_id)}


def anthropic_messages(seed: int, turns: int, *, tag: str = "an") -> list[dict[str, Any]]:
    """Anthropic messages: per turn a user ask, an assistant message with thinking (or
    redacted thinking), text and parallel tool_use blocks, the user's tool_result blocks
    (sometimes with more text), and the assistant's answer."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": _ask(tag, turn)})
        calls = _calls(rng, tag, turn)
        blocks: list[dict[str, Any]] = []
        if rng.random() < 0.2:
            blocks.append({"type": "redacted_thinking", "data": _opaque(rng, 96)})
        else:
            blocks.append({"type": "thinking", "thinking": f"I need {len(calls)} look-ups.",
                           "signature": _opaque(rng, rng.randint(48, 128))})
        blocks.append({"type": "text", "text": "Let me check."})
        blocks += [{"type": "tool_use", "id": call_id, "name": tool,
                    "input": {"reservation_id": f"{tag}R{turn}x{k}"}}
                   for k, (call_id, tool, _, _) in enumerate(calls)]
        messages.append({"role": "assistant", "content": blocks})
        results: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": call_id, "content": output}
            for call_id, _, _, output in calls]
        if rng.random() < 0.3:
            results.append({"type": "text", "text": f"Also note HAT{100 + turn} is my return."})
        messages.append({"role": "user", "content": results})
        messages.append({"role": "assistant", "content": [{"type": "text", "text":
                         f"Reservation {tag}R{turn}x0 is confirmed on HAT{100 + turn}."}]})
    return messages


def anthropic_record(session_id: str, seed: int, turns: int) -> dict[str, Any]:
    return {"session_id": session_id, "format": "anthropic", "agent": "airline",
            "system": "You are an airline agent. Follow the policy.",
            "messages": anthropic_messages(seed, turns, tag=session_id)}


# A system prompt's grammar: RULE := SUBJECT VERB OBJECT CONDITION.
_SUBJECTS = ("The agent", "You", "Every reply", "A booking change")
_VERBS = ("must verify", "never discloses", "always confirms", "may refund")
_OBJECTS = ("the user id", "the reservation code", "the fare class", "the payment method")
_CONDITIONS = ("before any change.", "unless the user is a gold member.",
               "within 24 hours of booking.", "when the flight is cancelled.")


def system_prompt(seed: int, rules: int) -> str:
    """A policy of ``rules`` sentences drawn from a small grammar."""
    rng = random.Random(seed)
    return " ".join(" ".join(rng.choice(part) for part in
                             (_SUBJECTS, _VERBS, _OBJECTS, _CONDITIONS))
                    for _ in range(rules))


def text_twins(session_id: str, seed: int, turns: int, system: str
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """An Anthropic record with ``system`` and plain text turns, and its chat twin: the
    same turns after a system message of the same text (``session_id`` + ``-chat``)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": _ask(session_id, turn)})
        messages.append({"role": "assistant", "content": " ".join(
            f"Reservation {session_id}R{turn}x{k} is on HAT{rng.randint(100, 999)}."
            for k in range(rng.randint(1, 4)))})
    anthropic = {"session_id": session_id, "format": "anthropic", "system": system,
                 "messages": messages}
    chat = {"session_id": f"{session_id}-chat",
            "messages": [{"role": "system", "content": system}, *messages]}
    return anthropic, chat
