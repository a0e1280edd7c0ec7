"""How the test OpenAI server answers an agent's turn (a chat request offering ``tools``):
a user message gets a call of the first tool, its string parameters filled with the
message's last word; a tool result gets a final answer quoting it."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from tests.support.openai_behaviours import ChatRequest, Reply, ServerConfig
from worker.compaction.messages import Role
from worker.compaction.tokens import TokenCounter

ANSWER_PREFIX = "Here is what the tool said: "


def is_agent_turn(request: ChatRequest) -> bool:
    return bool(request.body.get("tools"))


def answer_agent_turn(request: ChatRequest, config: ServerConfig,
                      counter: TokenCounter) -> Reply:
    """Call the first tool after a user message; answer in text after a tool result."""
    last = request.messages[-1]
    if last.role is Role.USER:
        message: dict[str, Any] = {"role": "assistant", "content": None,
                                   "tool_calls": [_first_tool_call(request, last.text)]}
        finish_reason = "tool_calls"
    else:
        message = {"role": "assistant", "content": ANSWER_PREFIX + last.text}
        finish_reason = "stop"
    completion_tokens = counter.count_text(json.dumps(message))
    return Reply(200, {
        "id": f"chatcmpl-agent-{time.monotonic_ns()}", "object": "chat.completion",
        "created": int(time.time()), "model": request.body.get("model") or config.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason,
                     "logprobs": None}],
        "usage": {"prompt_tokens": request.prompt_tokens,
                  "completion_tokens": completion_tokens,
                  "total_tokens": request.prompt_tokens + completion_tokens},
    })


def _first_tool_call(request: ChatRequest, user_text: str) -> dict[str, Any]:
    function = request.body["tools"][0]["function"]
    properties = (function.get("parameters") or {}).get("properties") or {}
    word = user_text.split()[-1] if user_text.split() else ""
    arguments = {name: word for name, spec in properties.items()
                 if spec.get("type") == "string"}
    # Unique across sessions and compactions: intake refuses a tool call id used before.
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments)}}
