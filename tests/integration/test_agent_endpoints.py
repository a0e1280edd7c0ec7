"""The test server's agent endpoints refuse what the real APIs refuse, and accept what
they issued, whole: ``/v1/responses`` an input that parts a call from its reasoning or
its output, leaves reasoning without its following item, or alters encrypted content;
``/v1/messages`` a ``tool_result`` without its ``tool_use`` just before, a ``tool_use``
left unanswered, or an edited thinking block."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.integration

TOOLS: list[Any] = [{"type": "function", "name": "look_up", "strict": False, "parameters": {
    "type": "object", "properties": {"reservation_id": {"type": "string"}}}}]
# Plain dicts stand for the SDK's typed input items (its TypedDicts), hence the ignores.
Items = list[dict[str, Any]]


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(latency_ms=0) as running:
        yield running


def first_turn(client: OpenAI) -> tuple[Items, Items]:
    """The user's ask and the server's output items (web search, reasoning, call)."""
    ask: Items = [{"role": "user", "content": "Please check reservation R042"}]
    response = client.responses.create(model="test-agent", input=ask,  # type: ignore[arg-type]  # dict items
                                       tools=TOOLS)
    return ask, [item.model_dump(exclude_none=True) for item in response.output]


def of(items: Items, kind: str) -> int:
    return next(i for i, item in enumerate(items) if item.get("type") == kind)


def drop_reasoning(items: Items) -> None:
    del items[of(items, "reasoning")]


def drop_call(items: Items) -> None:
    del items[of(items, "function_call")]


def alter_reasoning(items: Items) -> None:
    items[of(items, "reasoning")]["encrypted_content"] = "AAAA"


@pytest.mark.parametrize(("change", "error"), [
    (None, None),
    (drop_reasoning, "without its required 'reasoning' item"),
    (drop_call, "No tool call found for function_call_output"),
    (alter_reasoning, "encrypted content could not be verified"),
])
def test_the_responses_endpoint_enforces_the_pairing_rules(
    server: OpenAIServer, change: Callable[[Items], None] | None, error: str | None,
) -> None:
    client = OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    ask, output = first_turn(client)
    call = output[of(output, "function_call")]
    items = [*ask, *output, {"type": "function_call_output", "call_id": call["call_id"],
                             "output": '{"status": "confirmed"}'}]
    if change is not None:
        change(items)

    if error is None:
        response = client.responses.create(model="test-agent", input=items,  # type: ignore[arg-type]  # dict items
                                           tools=TOOLS)
        assert "confirmed" in response.output_text
        assert server.rejected("/v1/responses") == []
        return
    with pytest.raises(openai.BadRequestError, match=error):
        client.responses.create(model="test-agent", input=items,  # type: ignore[arg-type]  # dict items
                                tools=TOOLS)
    assert len(server.rejected("/v1/responses")) == 1


def test_reasoning_kept_without_the_item_it_preceded_is_refused(server: OpenAIServer) -> None:
    client = OpenAI(base_url=server.base_url, api_key="test", max_retries=0)
    ask, output = first_turn(client)

    with pytest.raises(openai.BadRequestError, match="without its required following item"):
        client.responses.create(model="test-agent", tools=TOOLS,
                                input=[*ask, output[of(output, "reasoning")]])  # type: ignore[list-item]  # dict items


def post_messages(server: OpenAIServer, messages: Items) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"model": "test-agent", "max_tokens": 256, "messages": messages,
                       "tools": [{"name": "look_up", "input_schema": TOOLS[0]["parameters"]}]})
    request = urllib.request.Request(f"{server.base_url}/messages", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def alter_thinking(messages: Items) -> None:
    messages[1]["content"][0]["thinking"] += " (edited)"


def drop_tool_use(messages: Items) -> None:
    messages[1]["content"] = [b for b in messages[1]["content"] if b["type"] != "tool_use"]


@pytest.mark.parametrize(("change", "error"), [
    (None, None),
    (alter_thinking, "Invalid signature in thinking block"),
    (drop_tool_use, "unexpected tool_use_id found in tool_result blocks"),
    (lambda m: m.pop(2), "tool_use ids were found without tool_result blocks"),
])
def test_the_messages_endpoint_enforces_the_pairing_rules(
    server: OpenAIServer, change: Callable[[Items], object] | None, error: str | None,
) -> None:
    ask: Items = [{"role": "user", "content": "Please check reservation R042"}]
    status, reply = post_messages(server, ask)
    assert status == 200 and reply["stop_reason"] == "tool_use"
    [call] = [block for block in reply["content"] if block["type"] == "tool_use"]
    messages = [*ask, {"role": "assistant", "content": reply["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                              "content": "confirmed"}]}]
    if change is not None:
        change(messages)

    status, reply = post_messages(server, messages)

    if error is None:
        assert status == 200 and "confirmed" in reply["content"][-1]["text"]
        assert server.rejected("/v1/messages") == []
    else:
        assert status == 400 and error in reply["error"]["message"]
        assert len(server.rejected("/v1/messages")) == 1
