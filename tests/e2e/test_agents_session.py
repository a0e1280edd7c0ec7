"""The OpenAI Agents SDK end to end: a real ``Runner`` drives an agent with a tool against
the OpenAI-protocol test server, its session kept in the store (``CompactorSession``);
after a real worker compacts the session, the next model call is sent the projection:
the summary block and the verbatim tail, every tool call with its result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner
from openai import AsyncOpenAI

from db import Store
from tests.e2e.conftest import StartWorker
from tests.support.airline_agent import INSTRUCTIONS, look_up_reservation
from tests.support.chat_rules import find_chat_violations
from tests.support.e2e import EVENT_TIMEOUT_S, JobEnv, JobPublisher, token_counter
from tests.support.openai_server import OpenAIServer
from worker.compaction.messages import parse_message
from worker.compaction.schema import SUMMARY_BLOCK_ROLE
from worker.platform.agents_session import CompactorSession, SessionFormat
from worker.platform.sessions import SessionsAPI

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SESSION_ID = "agents-sdk-airline"
TURNS = 14  # each about 330 tokens: over the job env's 4,200-token trigger


def ask(server: OpenAIServer, session: CompactorSession, questions: list[str]) -> list[str]:
    """Run one agent turn per question in the session; return the final answers."""

    async def run_all() -> list[str]:
        # The client's connections belong to this event loop: one client per loop.
        async with AsyncOpenAI(base_url=server.base_url, api_key="test",
                               max_retries=0) as client:
            model = OpenAIChatCompletionsModel(model="test-agent", openai_client=client)
            agent: Agent[Any] = Agent(name="airline", instructions=INSTRUCTIONS,
                                      tools=[look_up_reservation], model=model)
            config = RunConfig(tracing_disabled=True)  # nothing leaves the machine
            return [str((await Runner.run(agent, question, session=session,
                                          run_config=config)).final_output)
                    for question in questions]

    return asyncio.run(run_all())


def test_an_agents_sdk_session_is_sent_the_projection_after_a_worker_compacts_it(
    pg_store: Store, job_env: JobEnv, publisher: JobPublisher, start_worker: StartWorker,
    server: OpenAIServer,
) -> None:
    session = CompactorSession(SESSION_ID, SessionsAPI(pg_store, token_counter()),
                               session_format=SessionFormat.CHAT)
    answers = ask(server, session, [f"Please check reservation R{i:03d}" for i in range(TURNS)])
    assert all("R013" in answer for answer in answers[-1:]), answers[-1]
    assert len(pg_store.messages(SESSION_ID)) == 4 * TURNS
    assert pg_store.get_session(SESSION_ID).projection_tokens > job_env.settings.trigger_tokens

    worker = start_worker()
    publisher.publish(SESSION_ID, reason="agents-sdk")
    [event] = worker.wait_for_events("compaction.job", 1, timeout_s=EVENT_TIMEOUT_S)
    assert event["outcome"] == "compacted", event
    [revision] = pg_store.revisions(SESSION_ID)
    projection = pg_store.projection(SESSION_ID)
    server.clear_log()

    [answer] = ask(server, session, ["Please check reservation R999"])

    sent = server.requests[0].body["messages"]  # the new turn's first model call
    assert sent[0] == {"role": "system", "content": INSTRUCTIONS}
    assert sent[1:-1] == projection
    assert sent[-1] == {"role": "user", "content": "Please check reservation R999"}
    block, tail = projection[0], projection[1:]
    assert block == revision.block and block["role"] == SUMMARY_BLOCK_ROLE
    assert tail == [m.body for m in pg_store.messages(SESSION_ID)
                    if revision.through_seq < m.seq <= 4 * TURNS]
    assert len(sent) < 4 * TURNS
    assert find_chat_violations(parse_message(m) for m in sent) == []
    assert "R999" in answer
    assert len(pg_store.messages(SESSION_ID)) == 4 * TURNS + 4
