"""The test server's Files and Batch APIs, driven by the real OpenAI SDK client: its
objects parse, a batch walks the lifecycle, each line is answered as the synchronous
request would be, and the knobs make batches slow, expire, fail partly or fail whole."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from openai import BadRequestError, NotFoundError, OpenAI
from openai.types import Batch

from tests.support.batch_api import BatchKnobs
from tests.support.generated import generated_turns
from tests.support.openai_server import OpenAIServer

MODEL = "test-summarizer"


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    with OpenAIServer(model=MODEL) as running:
        yield running


@pytest.fixture
def client(server: OpenAIServer) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="test", max_retries=0)


def request_bodies(seed: int, count: int) -> dict[str, dict[str, Any]]:
    """``count`` summarizer-like requests over generated sessions, by custom id."""
    rng = random.Random(seed)
    bodies = {}
    for index in range(count):
        turns = generated_turns(f"B{seed}x{index}", rng.randint(1, 6))
        bodies[f"job-{seed}-{index}"] = {"model": MODEL, "max_tokens": 1024, "messages": [
            {"role": "system", "content": "Summarize the conversation as JSON."},
            {"role": "user", "content": json.dumps(turns)}]}
    return bodies


def submit(client: OpenAI, bodies: dict[str, dict[str, Any]], *, raw: bytes | None = None) -> Batch:
    lines = raw if raw is not None else b"".join(
        json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                    "body": body}).encode() + b"\n" for custom_id, body in bodies.items())
    file = client.files.create(file=("requests.jsonl", lines), purpose="batch")
    assert (file.purpose, file.bytes) == ("batch", len(lines))
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                 completion_window="24h", metadata={"window": "w1"})


def wait_until_done(client: OpenAI, batch_id: str) -> tuple[Batch, list[str]]:
    """The batch once it reached a final status, and every status it was seen in."""
    statuses: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if not statuses or statuses[-1] != batch.status:
            statuses.append(batch.status)
        if batch.status in ("completed", "expired", "cancelled", "failed"):
            return batch, statuses
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {statuses[-1]}")


def entries(client: OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    return {entry["custom_id"]: entry for entry in map(json.loads, text.splitlines())}


def test_a_batch_walks_the_lifecycle_and_answers_each_line_as_the_synchronous_call(
        server: OpenAIServer, client: OpenAI) -> None:
    bodies = request_bodies(seed=11, count=7)
    server.set_batch_knobs(BatchKnobs(validating_s=0.2, in_progress_s=0.2, finalizing_s=0.2))

    batch = submit(client, bodies)
    done, statuses = wait_until_done(client, batch.id)
    outputs = entries(client, done.output_file_id)
    synchronous = {custom_id: client.chat.completions.create(**body).usage
                   for custom_id, body in bodies.items()}

    assert statuses == ["validating", "in_progress", "finalizing", "completed"]
    assert done.request_counts is not None and done.usage is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (7, 7, 0)
    assert done.error_file_id is None and done.metadata == {"window": "w1"}
    assert None not in (done.in_progress_at, done.finalizing_at, done.completed_at)
    assert set(outputs) == set(bodies)
    for custom_id, usage in synchronous.items():
        line_usage = outputs[custom_id]["response"]["body"]["usage"]
        assert usage is not None
        assert (line_usage["prompt_tokens"], line_usage["completion_tokens"]) == (
            usage.prompt_tokens, usage.completion_tokens)
        assert outputs[custom_id]["response"]["status_code"] == 200
    assert done.usage.input_tokens == sum(
        entry["response"]["body"]["usage"]["prompt_tokens"] for entry in outputs.values())


def test_lines_that_fail_go_to_the_error_file_and_the_rest_complete(
        server: OpenAIServer, client: OpenAI) -> None:
    bodies = request_bodies(seed=12, count=9)
    marked = sorted(bodies)[4]
    bodies[marked]["messages"][1]["content"] += " [[behave:500]]"
    server.set_batch_knobs(BatchKnobs(fail_every=3))

    done, _ = wait_until_done(client, submit(client, bodies).id)
    outputs, errors = entries(client, done.output_file_id), entries(client, done.error_file_id)

    failing = {custom_id for index, custom_id in enumerate(bodies) if (index + 1) % 3 == 0}
    assert done.status == "completed"
    assert set(errors) == failing | {marked}
    assert set(outputs) == set(bodies) - set(errors)
    assert {entry["response"]["status_code"] for entry in errors.values()} == {500}
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (
        len(outputs), len(errors))


def test_an_expired_batch_keeps_the_lines_answered_and_expires_the_rest(
        server: OpenAIServer, client: OpenAI) -> None:
    bodies = request_bodies(seed=13, count=5)
    server.set_batch_knobs(BatchKnobs(expire=True, answered_before_expiry=2))

    done, statuses = wait_until_done(client, submit(client, bodies).id)
    outputs, errors = entries(client, done.output_file_id), entries(client, done.error_file_id)

    assert statuses[-1] == "expired" and done.expired_at is not None
    assert set(outputs) == set(list(bodies)[:2])
    assert {entry["error"]["code"] for entry in errors.values()} == {"batch_expired"}
    assert set(errors) == set(list(bodies)[2:])


def test_a_slow_batch_stays_in_progress_until_released_or_cancelled(
        server: OpenAIServer, client: OpenAI) -> None:
    server.set_batch_knobs(BatchKnobs(in_progress_s=3600))
    held = submit(client, request_bodies(seed=14, count=3))
    cancelled = submit(client, request_bodies(seed=15, count=3))

    assert client.batches.retrieve(held.id).status == "in_progress"
    assert client.batches.cancel(cancelled.id).status == "cancelled"
    listed = {batch.id: batch.status for batch in client.batches.list()}
    server.set_batch_knobs(BatchKnobs())
    released, _ = wait_until_done(client, held.id)

    assert listed == {held.id: "in_progress", cancelled.id: "cancelled"}
    assert released.status == "completed" and released.request_counts is not None
    assert released.request_counts.completed == 3
    assert client.batches.retrieve(cancelled.id).output_file_id is None


def test_a_bad_input_file_fails_validation_with_its_line_numbers(
        server: OpenAIServer, client: OpenAI) -> None:
    good = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": request_bodies(seed=16, count=1)["job-16-0"]})
    raw = "\n".join([good, "not json", good.replace('"a"', '"b"').replace(
        "/v1/chat/completions", "/v1/embeddings"), good]).encode()

    done, statuses = wait_until_done(client, submit(client, {}, raw=raw).id)
    server.set_batch_knobs(BatchKnobs(fail_validation=True))
    forced, _ = wait_until_done(client, submit(client, request_bodies(seed=17, count=2)).id)

    assert statuses[-1] == "failed" and done.errors is not None and done.errors.data
    assert [error.line for error in done.errors.data] == [2, 3, 4]
    assert forced.status == "failed" and done.failed_at is not None
    assert done.output_file_id is None and done.error_file_id is None


def test_an_upload_without_the_batch_purpose_or_an_unknown_file_is_refused(
        client: OpenAI) -> None:
    with pytest.raises(BadRequestError):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(NotFoundError):
        client.files.retrieve("file-missing")
    with pytest.raises(NotFoundError):
        client.batches.retrieve("batch-missing")
