"""How the test OpenAI server answers ``POST /v1/responses`` for an agent, and what it
refuses there as the real API does.

A user message gets a reasoning item (a summary and ``encrypted_content``), a hosted
``web_search_call`` and a call of the first function tool, its string parameters filled
with the message's last word; a function output gets a reasoning item and a message
quoting it. Every item the server issues goes into its ledger, so a later request that
holds an output without its call, a call without the reasoning that preceded it, a
reasoning item without its following item, or altered encrypted content is answered 400
(``tests/support/provider_rules.py``), as the real API answers it.
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tests.support.openai_behaviours import Reply, error_reply
from tests.support.provider_rules import responses_rejections

ANSWER_PREFIX = "Here is what the tool said: "
# Stands in the ledger for the input each reply answered.
REQUEST: dict[str, Any] = {"type": "message", "role": "user", "content": "(a request)"}


@dataclass
class Ledger:
    """Every output item (or message) an agent endpoint issued, in order: what the rules
    check a later request against; and the errors of the requests it refused."""

    items: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[list[str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def answer_responses(body: dict[str, Any] | None, ledger: Ledger, model: str) -> Reply:
    """Check the request's input against the ledger; answer the agent's turn."""
    items = _input_items(body)
    if items is None or not items:
        return error_reply(400, "Invalid 'input'.", "invalid_request_error", param="input")
    with ledger.lock:
        errors = responses_rejections(items, ledger.items)
        if errors:
            ledger.rejected.append(errors)
            return error_reply(400, errors[0], "invalid_request_error", param="input")
        output = _turn(items, (body or {}).get("tools") or [])
        # Each reply follows an input: no item of one reply needs another's reasoning.
        ledger.items.extend([REQUEST, *output])
    return Reply(200, {
        "id": f"resp_{uuid.uuid4().hex[:16]}", "object": "response",
        "created_at": int(time.time()), "status": "completed", "model": model,
        "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "error": None, "incomplete_details": None, "instructions": None,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0,
        "usage": {"input_tokens": 10, "output_tokens": 10, "total_tokens": 20,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 5}},
    })


def _input_items(body: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    raw = (body or {}).get("input")
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        return None
    return raw


def _turn(items: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last = items[-1]
    kind = last.get("type", "message")
    function = next((tool for tool in tools if tool.get("type") == "function"), None)
    if kind == "function_call_output" or function is None:
        return [_reasoning("Answer from the tool's output."),
                _message(ANSWER_PREFIX + str(last.get("output") if kind != "message"
                                             else _text(last)))]
    word = (_text(last).split() or [""])[-1]
    properties = (function.get("parameters") or {}).get("properties") or {}
    arguments = {name: word for name, spec in properties.items()
                 if spec.get("type") == "string"}
    call_id = f"call_{uuid.uuid4().hex[:12]}"
    return [
        {"type": "web_search_call", "id": f"ws_{uuid.uuid4().hex[:12]}", "status": "completed",
         "action": {"type": "search", "query": f"{word} flight status"}},
        _reasoning(f"Look up {word}."),
        {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:12]}", "call_id": call_id,
         "name": function["name"], "arguments": json.dumps(arguments), "status": "completed"},
    ]


def _reasoning(summary: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex[:12]}",
            "summary": [{"type": "summary_text", "text": summary}],
            "encrypted_content": base64.b64encode(os.urandom(96)).decode()}


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex[:12]}", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    parts = [part.get("text") for part in content or () if isinstance(part, dict)]
    return "\n".join(part for part in parts if isinstance(part, str))
