"""How the test server answers ``POST /v1/messages`` (Anthropic's Messages API) for an
agent, and what it refuses there as the real API does.

A user's text gets an assistant message with a thinking block (signed; every third turn
a redacted one besides), a line of text and a ``tool_use`` of the first tool, its string
parameters filled with the text's last word; a ``tool_result`` gets thinking and an
answer quoting it. Every message the server issues goes into its ledger, so a request
with a ``tool_result`` whose ``tool_use`` is not in the message just before, a
``tool_use`` left unanswered, or a thinking block not as issued is answered 400
(``tests/support/provider_rules.py``).
"""

from __future__ import annotations

import base64
import os
import uuid
from typing import Any

from tests.support.openai_behaviours import Reply, error_reply
from tests.support.provider_rules import anthropic_rejections
from tests.support.responses_api import ANSWER_PREFIX, Ledger


def answer_messages(body: dict[str, Any] | None, ledger: Ledger, model: str) -> Reply:
    """Check the request's messages against the ledger; answer the agent's turn."""
    messages = (body or {}).get("messages")
    if not isinstance(messages, list) or not messages \
            or not all(isinstance(m, dict) for m in messages):
        return error_reply(400, "messages: Field required", "invalid_request_error")
    with ledger.lock:
        errors = anthropic_rejections(messages, ledger.items)
        if errors:
            ledger.rejected.append(errors)
            return error_reply(400, errors[0], "invalid_request_error")
        content = _turn(messages[-1], (body or {}).get("tools") or [], len(ledger.items))
        ledger.items.append({"role": "assistant", "content": content})
    calls = any(block["type"] == "tool_use" for block in content)
    return Reply(200, {
        "id": f"msg_{uuid.uuid4().hex[:16]}", "type": "message", "role": "assistant",
        "model": model, "content": content, "stop_sequence": None,
        "stop_reason": "tool_use" if calls else "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 10},
    })


def _turn(last: dict[str, Any], tools: list[dict[str, Any]], issued: int
          ) -> list[dict[str, Any]]:
    blocks = last.get("content")
    blocks = blocks if isinstance(blocks, list) else [{"type": "text", "text": str(blocks)}]
    results = [block for block in blocks if block.get("type") == "tool_result"]
    if results or not tools:
        said = " ".join(str(block.get("content") or block.get("text") or "")
                        for block in results or blocks)
        return [_thinking("Answer from the tool's result."),
                {"type": "text", "text": ANSWER_PREFIX + said}]
    text = " ".join(str(block.get("text", "")) for block in blocks)
    word = (text.split() or [""])[-1]
    properties = (tools[0].get("input_schema") or {}).get("properties") or {}
    redacted = [{"type": "redacted_thinking", "data": _opaque()}] if issued % 3 == 0 else []
    return [_thinking(f"Look up {word}."), *redacted,
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}",
             "name": tools[0]["name"],
             "input": {name: word for name, spec in properties.items()
                       if spec.get("type") == "string"}}]


def _thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": _opaque()}


def _opaque() -> str:
    return base64.b64encode(os.urandom(96)).decode()
