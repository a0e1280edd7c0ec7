"""An agent on Anthropic's Messages API end to end: its platform loop keeps the session
in the store (an ``anthropic`` session: thinking with signatures, redacted thinking,
``tool_use`` and ``tool_result`` blocks, as given) and sends the projection to the test
server's ``/v1/messages``, which refuses what the real API refuses. After a real worker
compacts the session, the next turn is sent the summary block (a user message) and the
verbatim tail, and accepted."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.e2e import EVENT_TIMEOUT_S, JobEnv, JobPublisher, token_counter
from tests.support.openai_server import OpenAIServer
from tests.support.responses_api import ANSWER_PREFIX
from worker.platform.sessions import SessionFormat, SessionsAPI

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "anthropic-airline"
SYSTEM = "You are an airline agent. Look reservations up before you answer."
TOOLS = [{"name": "look_up_reservation", "description": "Return the reservation's details.",
          "input_schema": {"type": "object", "properties": {
              "reservation_id": {"type": "string"}}}}]
TURNS = 14
NOTES = " ".join(f"Fare rule {i}: changes before departure cost 50 USD." for i in range(12))


def look_up(arguments: dict[str, Any]) -> str:
    reservation_id = str(arguments.get("reservation_id"))
    return json.dumps({"reservation_id": reservation_id, "flight": f"HAT{len(reservation_id)}",
                       "status": "confirmed", "notes": NOTES})


def send(server: OpenAIServer, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Messages API call; the reply's content blocks (a refusal fails the test)."""
    body = json.dumps({"model": "test-agent", "max_tokens": 1024, "system": SYSTEM,
                       "tools": TOOLS, "thinking": {"type": "enabled", "budget_tokens": 1024},
                       "messages": messages}).encode()
    request = urllib.request.Request(f"{server.base_url}/messages", data=body, headers={
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            content: list[dict[str, Any]] = json.loads(reply.read())["content"]
    except urllib.error.HTTPError as error:
        pytest.fail(f"{error.code}: {error.read().decode()}")
    return content


def agent_turn(server: OpenAIServer, sessions: SessionsAPI, question: str) -> str:
    """The platform's loop for one question: store the turn, send the projection."""
    sessions.append(SESSION_ID, [{"role": "user", "content": question}], create=True,
                    session_format=SessionFormat.ANTHROPIC)
    while True:
        content = send(server, sessions.projection(SESSION_ID))
        sessions.append(SESSION_ID, [{"role": "assistant", "content": content}])
        calls = [block for block in content if block["type"] == "tool_use"]
        if not calls:
            return " ".join(block["text"] for block in content if block["type"] == "text")
        sessions.append(SESSION_ID, [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call["id"], "content": look_up(
                call["input"])} for call in calls]}])


def test_an_anthropic_session_with_thinking_is_sent_its_projection_after_a_worker_compacts_it(
    pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    sessions = SessionsAPI(pg_store, token_counter())
    answers = [agent_turn(server, sessions, f"Please check reservation R{i:03d}")
               for i in range(TURNS)]
    assert answers[-1].startswith(ANSWER_PREFIX) and "R013" in answers[-1]
    stored = [m.body for m in pg_store.messages(SESSION_ID)]
    blocks = {block["type"] for m in stored if isinstance(m["content"], list)
              for block in m["content"]}
    assert {"thinking", "redacted_thinking", "tool_use", "tool_result"} <= blocks
    assert pg_store.get_session(SESSION_ID).projection_tokens > job_env.settings.trigger_tokens

    worker = start_worker()
    publisher.publish(SESSION_ID, reason="anthropic")
    [event] = worker.wait_for_events("compaction.job", 1, timeout_s=EVENT_TIMEOUT_S)
    assert event["outcome"] == "compacted", event
    [revision] = pg_store.revisions(SESSION_ID)
    projection = pg_store.projection(SESSION_ID)
    assert projection[0] == revision.block == {"role": "user", "content": [
        {"type": "text", "text": revision.block["content"][0]["text"]}]}
    assert projection[1:] == stored[revision.through_seq:]
    server.clear_log()

    answer = agent_turn(server, sessions, "Please check reservation R999")

    assert server.rejected("/v1/messages") == []
    sent = server.requests[0].body["messages"]
    assert sent == [*projection, {"role": "user", "content": "Please check reservation R999"}]
    assert len(sent) < len(stored)
    assert "R999" in answer
