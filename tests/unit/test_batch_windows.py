"""The poller's batches: parked jobs in order, whole, in groups under both the request
count and the request file's size, on generated parks of any size."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest

from db import ParkedJob
from scheduler.batches import PollPolicy, batch_windows, request_file_bytes
from worker.compaction import summary_json_schema
from worker.runtime import llm_config
from worker.settings.config import Settings
from worker.summarizers.openai_batch import BatchRequest, LLMBatches
from worker.summarizers.openai_client import LLMClient

NOW = datetime(2026, 11, 27, tzinfo=UTC)


def parks(seed: int, count: int) -> list[ParkedJob]:
    rng = random.Random(seed)

    def request(index: int) -> dict[str, object]:
        text = "x" * rng.choice([10, 1_000, 50_000, 400_000])
        return {"key": f"r{index}", "max_output_tokens": 1_024,
                "messages": [{"role": "system", "content": "rules"},
                             {"role": "user", "content": text}]}

    return [ParkedJob(f"s{n}", 1, 10, "open", [request(k) for k in range(rng.randint(1, 5))],
                      None, {}, NOW) for n in range(count)]


@pytest.mark.parametrize("seed", range(12))
def test_batches_keep_jobs_whole_in_order_under_both_limits(seed: int) -> None:
    rng = random.Random(seed)
    parked = parks(seed, rng.randint(1, 60))
    policy = PollPolicy(max_requests=rng.randint(5, 40), marker_ttl_s=60,
                        max_file_bytes=rng.randint(1_000_000, 3_000_000))

    windows = list(batch_windows(parked, policy))

    assert [park for window in windows for park in window] == parked
    for window in windows:
        if len(window) == 1:  # a job larger than a batch still goes, alone
            continue
        assert sum(len(park.requests) for park in window) <= policy.max_requests
        assert sum(request_file_bytes(park) for park in window) <= policy.max_file_bytes


def test_a_jobs_file_bytes_bound_the_lines_the_adapter_writes() -> None:
    settings = Settings(llm_base_url="http://127.0.0.1:1/v1", llm_model="gpt-4o-mini",
                        llm_prompt_cache_key="a-fleet-key-of-some-length")
    with LLMClient(llm_config(settings)) as client:
        batches = LLMBatches(client)
        for park in parks(7, 20):
            lines = sum(len(json.dumps(batches._line(BatchRequest(
                f"{park.session_id}:{r['key']}", r["messages"], summary_json_schema(),
                r["max_output_tokens"])))) + 1 for r in park.requests)
            assert lines <= request_file_bytes(park)
