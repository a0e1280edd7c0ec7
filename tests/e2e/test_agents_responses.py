"""The OpenAI Agents SDK on its default model (the Responses API) end to end: a real
``Runner`` drives an agent with a tool against the test server's ``/v1/responses``,
which answers with reasoning items (encrypted content), a hosted web search and function
calls, and refuses what the real API refuses. The session is a ``responses`` session in
the store; after a real worker compacts it, the next turn is sent the projection (the
summary block as a Responses message item, then the verbatim tail) and accepted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.airline_agent import INSTRUCTIONS, look_up_reservation
from tests.support.e2e import EVENT_TIMEOUT_S, JobEnv, JobPublisher, token_counter
from tests.support.openai_server import OpenAIServer
from tests.support.responses_api import ANSWER_PREFIX
from worker.platform.agents_session import CompactorSession
from worker.platform.sessions import SessionsAPI

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "agents-sdk-responses"
TURNS = 12


def ask(server: OpenAIServer, session: CompactorSession, questions: list[str]) -> list[str]:
    """Run one agent turn per question on the SDK's default model; return the answers."""

    async def run_all() -> list[str]:
        async with AsyncOpenAI(base_url=server.base_url, api_key="test",
                               max_retries=0) as client:
            agent: Agent[Any] = Agent(name="airline", instructions=INSTRUCTIONS,
                                      tools=[look_up_reservation], model="test-agent")
            config = RunConfig(model_provider=OpenAIProvider(openai_client=client),
                               tracing_disabled=True)
            return [str((await Runner.run(agent, question, session=session,
                                          run_config=config)).final_output)
                    for question in questions]

    return asyncio.run(run_all())


def test_a_responses_session_with_reasoning_is_sent_its_projection_after_a_worker_compacts_it(
    pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    session = CompactorSession(SESSION_ID, SessionsAPI(pg_store, token_counter()))
    answers = ask(server, session, [f"Please check reservation R{i:03d}" for i in range(TURNS)])
    assert answers[-1].startswith(ANSWER_PREFIX) and "R011" in answers[-1], answers[-1]
    stored = [m.body for m in pg_store.messages(SESSION_ID)]
    assert pg_store.get_session(SESSION_ID).session_format == "responses"
    kinds = {item.get("type", "message") for item in stored}
    assert {"reasoning", "web_search_call", "function_call", "function_call_output"} <= kinds
    assert all(item["encrypted_content"] for item in stored if item.get("type") == "reasoning")
    assert pg_store.get_session(SESSION_ID).projection_tokens > job_env.settings.trigger_tokens

    worker = start_worker()
    publisher.publish(SESSION_ID, reason="agents-sdk-responses")
    [event] = worker.wait_for_events("compaction.job", 1, timeout_s=EVENT_TIMEOUT_S)
    assert event["outcome"] == "compacted", event
    [revision] = pg_store.revisions(SESSION_ID)
    projection = pg_store.projection(SESSION_ID)
    assert projection[0] == revision.block
    assert revision.block["type"] == "message" and revision.block["role"] == "user"
    assert revision.block["content"][0]["type"] == "input_text"
    assert projection[1:] == stored[revision.through_seq:]
    server.clear_log()

    [answer] = ask(server, session, ["Please check reservation R999"])

    assert server.rejected("/v1/responses") == []
    sent = server.requests[0].body
    assert sent["instructions"] == INSTRUCTIONS
    assert sent["input"][:-1] == projection
    assert sent["input"][-1]["content"] == "Please check reservation R999"
    assert len(sent["input"]) < len(stored)
    assert "R999" in answer
    assert len(pg_store.messages(SESSION_ID)) > len(stored)
