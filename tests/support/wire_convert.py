"""Chat sessions rewritten as their Responses and Anthropic equivalents, for tests and
benchmarks that compare the formats on the same conversations: the same texts, calls
and results, plus what each format adds (reasoning items with encrypted content before
calls; thinking blocks with signatures), from a seed."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

Items = list[dict[str, Any]]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content or ""


def _opaque(rng: random.Random) -> str:
    return base64.b64encode(rng.randbytes(rng.randint(48, 160))).decode()


def chat_to_responses(messages: Items, *, seed: int = 1,
                      origins: list[int] | None = None) -> Items:
    """Responses input items: a reasoning item before each reply that calls tools, the
    reply's text as a message item, one ``function_call`` per call, one output each.
    ``origins`` gets the index of the chat message each item came from."""
    rng = random.Random(seed)
    items: Items = []
    for index, message in enumerate(messages):
        made = _responses_of(message, f"{seed}_{index}", rng)
        items += made
        if origins is not None:
            origins += [index] * len(made)
    return items


def _responses_of(message: dict[str, Any], tag: str, rng: random.Random) -> Items:
    role, text = message["role"], _text(message)
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"],
                 "output": text}]
    if role != "assistant":
        return [{"type": "message", "role": role,
                 "content": [{"type": "input_text", "text": text}]}]
    items: Items = []
    calls = message.get("tool_calls") or []
    if calls:
        items.append({"type": "reasoning", "id": f"rs_{tag}", "summary": [
            {"type": "summary_text", "text": f"Call {calls[0]['function']['name']}."}],
            "encrypted_content": _opaque(rng)})
    if text:
        items.append({"type": "message", "role": "assistant", "id": f"msg_{tag}",
                      "status": "completed", "content": [
                          {"type": "output_text", "text": text, "annotations": []}]})
    return items + [{"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"],
                     "name": call["function"]["name"],
                     "arguments": call["function"]["arguments"], "status": "completed"}
                    for call in calls]


def chat_to_anthropic(messages: Items, *, seed: int = 1,
                      origins: list[int] | None = None) -> tuple[str, Items]:
    """The system prompt and Anthropic messages: each assistant reply opens with a signed
    thinking block, its calls as ``tool_use``; results gather in the next user message,
    with any user text that follows them. ``origins`` gets the index of the last chat
    message each Anthropic message holds."""
    rng = random.Random(seed)
    system: list[str] = []
    out: Items = []
    last: list[int] = []
    for index, message in enumerate(messages):
        role, text = message["role"], _text(message)
        if role in ("system", "developer") and not out:
            system.append(text)
            continue
        _add_anthropic(out, message, role, text, rng)
        if len(last) < len(out):
            last.append(index)
        last[-1] = index
    if origins is not None:
        origins += last
    return "\n\n".join(system), out


def _add_anthropic(out: Items, message: dict[str, Any], role: str, text: str,
                   rng: random.Random) -> None:
    if role == "assistant":
        blocks: Items = [{"type": "thinking", "thinking": f"Next: {text[:60]}",
                          "signature": _opaque(rng)}]
        if text:
            blocks.append({"type": "text", "text": text})
        blocks += [{"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                    "input": _input(call["function"]["arguments"])}
                   for call in message.get("tool_calls") or ()]
        out.append({"role": "assistant", "content": blocks})
        return
    block = ({"type": "tool_result", "tool_use_id": message["tool_call_id"],
              "content": text} if role == "tool" else {"type": "text", "text": text})
    if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list) \
            and (role != "tool" or out[-1]["content"][-1]["type"] == "tool_result"):
        out[-1]["content"].append(block)
    else:
        out.append({"role": "user", "content": [block]})


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}
