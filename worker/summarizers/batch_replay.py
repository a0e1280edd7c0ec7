"""A job's summarizer calls answered from a batch: the LLM summarizer runs as it does
synchronously, its client replaced by a :class:`BatchReplay` holding the answers batches
gave so far. A call answered is read as the synchronous reply; a call not yet answered
puts its request in the batch to come (every call of its round does, the summarizer waits
for them all) and the run stops with ``BatchPending``. Run again over the same snapshot
with the answers in, the summarizer builds the same requests (prompts are a function of
the span, the prior summary and the plan), gets past that round, and stops at the next:
chunk-and-merge's reduce rounds go into the next batch, one round per batch, or are
called synchronously when small. Nothing but the answers is kept between runs.

A request is known by the digest of its body (``request_key``), so an answer can never
reach a request it was not given for.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from worker.compaction import TokenCounter, parse_message
from worker.errors import CompactionError
from worker.logging import get_logger
from worker.summarizers.base import BatchLineFailed, BatchPending
from worker.summarizers.llm import LLMSummarizer
from worker.summarizers.openai_batch import BatchRequest, LLMBatches
from worker.summarizers.openai_client import LLMClient, LLMReply, LLMUsage

log = get_logger()


class LineFallback(StrEnum):
    """What a request a batch failed to answer (expired, cancelled, an error) falls back to."""

    SYNC = "sync"  # called synchronously, at full price
    DETERMINISTIC = "deterministic"  # the job commits the deterministic summary


def request_key(messages: list[dict[str, Any]], max_output_tokens: int) -> str:
    """The digest a request is known by across runs of a job (its custom id's last part)."""
    text = json.dumps([messages, max_output_tokens], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ReplayPolicy:
    line_fallback: LineFallback
    # A request of a later round (the batch answered an earlier one) this small is called
    # synchronously rather than waiting for another batch (0: never).
    sync_max_prompt_tokens: int


class BatchReplay:
    """The summarizer's client for one run of a batched job; ``answers`` are the lines
    batches gave, by request key. Thread-safe (map calls of a round run concurrently)."""

    def __init__(self, client: LLMClient, answers: Mapping[str, Mapping[str, Any]],
                 policy: ReplayPolicy, counter: TokenCounter) -> None:
        self._client = client
        self._batches = LLMBatches(client)
        self._answers = answers
        self._policy = policy
        self._counter = counter
        self._lock = threading.Lock()
        self._pending: dict[str, BatchRequest] = {}

    @property
    def model(self) -> str:
        return self._client.model

    @property
    def pending(self) -> list[BatchRequest]:
        """The requests this run put in the next batch, in the order they were made."""
        with self._lock:
            return list(self._pending.values())

    def pending_records(self) -> list[dict[str, Any]]:
        """``pending`` as the parked job stores them (the schema is the prompt version's)."""
        return [{"key": request.custom_id, "messages": request.messages,
                 "max_output_tokens": request.max_output_tokens} for request in self.pending]

    def complete_json(self, messages: list[dict[str, Any]], *, schema: dict[str, Any],
                      max_output_tokens: int, usage: LLMUsage | None = None) -> LLMReply:
        key = request_key(messages, max_output_tokens)
        line = self._answers.get(key)
        answer = self._batches.read_line(line, messages) if line is not None else None
        if isinstance(answer, LLMReply):
            if usage is not None:
                usage.add(answer)
            return answer
        if answer is not None:
            return self._after_failed_line(key, answer, messages, schema, max_output_tokens,
                                           usage)
        if self._is_small_later_round(messages):
            return self._client.complete_json(messages, schema=schema,
                                              max_output_tokens=max_output_tokens, usage=usage)
        with self._lock:
            self._pending[key] = BatchRequest(key, messages, schema, max_output_tokens)
        raise BatchPending(key)

    def _after_failed_line(self, key: str, error: CompactionError,
                           messages: list[dict[str, Any]], schema: dict[str, Any],
                           max_output_tokens: int, usage: LLMUsage | None) -> LLMReply:
        log.warning("batch.line_failed", request=key[:16], error_class=type(error).__name__,
                    reason=error.reason, fallback=self._policy.line_fallback.value)
        if self._policy.line_fallback is LineFallback.DETERMINISTIC:
            raise BatchLineFailed(error, "batch_line_failed")
        return self._client.complete_json(messages, schema=schema,
                                          max_output_tokens=max_output_tokens, usage=usage)

    def _is_small_later_round(self, messages: list[dict[str, Any]]) -> bool:
        limit = self._policy.sync_max_prompt_tokens
        if not self._answers or limit <= 0:
            return False
        tokens = self._counter.count_messages(parse_message(message) for message in messages)
        return tokens <= limit


@dataclass(frozen=True)
class ReplayRun:
    """One run of a batched job's summarizer: the summarizer, and its requests left
    waiting when it stops with ``BatchPending``."""

    summarizer: LLMSummarizer
    replay: BatchReplay

    def pending_records(self) -> list[dict[str, Any]]:
        return self.replay.pending_records()


@dataclass(frozen=True)
class BatchMode:
    """Batch mode's summarizer (``COMPACTOR_LLM_MODE=batch``): the configured LLM
    summarizer, replayed per job over the answers its batches gave."""

    summarizer: LLMSummarizer
    client: LLMClient
    policy: ReplayPolicy
    counter: TokenCounter

    def replay(self, answers: Mapping[str, Mapping[str, Any]]) -> ReplayRun:
        replay = BatchReplay(self.client, answers, self.policy, self.counter)
        return ReplayRun(self.summarizer.with_client(replay), replay)
