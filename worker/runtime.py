"""Builds a process's job dependencies from settings: engine, store, token counter,
summarizer, Redis-backed fleet state. Created lazily per process (after fork), never at
import time; the only place below the entrypoints that reads a ``Settings``."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import redis

from db import Store
from worker.compaction import StrategyConfig, TokenCounter, TriggerPolicy
from worker.job.ports import Batching, JobLedgerPort
from worker.job.values import JobDeps, JobPolicy
from worker.settings.config import Settings
from worker.settings.core import BreakerOpenPolicy, LLMMode, SummarizerKind
from worker.shared_state.attempt_journal import AttemptJournal
from worker.shared_state.connection import connect_redis
from worker.shared_state.deliveries import DeliveryCounter
from worker.shared_state.keys import RedisKeys
from worker.shared_state.provider_breaker import (
    InMemoryBreakerState,
    ProviderBreaker,
    ProviderBreakerStore,
)
from worker.shared_state.rate_limit import FleetRateLimiter
from worker.summarizers import ExtractiveSummarizer, Summarizer
from worker.tokenizer.offline import load_encoding

if TYPE_CHECKING:
    from worker.summarizers.openai_client import LLMConfig


def utc_now() -> datetime:
    return datetime.now(UTC)


def job_policy(settings: Settings) -> JobPolicy:
    """The plain values of settings that a job needs."""
    return JobPolicy(
        trigger=TriggerPolicy(
            trigger_tokens=settings.trigger_tokens,
            floor_tokens=settings.floor_tokens,
            tail_budget_tokens=settings.tail_budget_tokens,
            min_tail_user_turns=settings.min_tail_user_turns,
        ),
        summary_budget_tokens=settings.summary_budget_tokens,
        audit_mode=settings.audit_mode,
        span_strategy=StrategyConfig(
            settings.span_strategy,
            keep_last_tool_groups=settings.span_strategy_keep_last_tool_groups,
        ) if settings.span_strategy else None,
        lease_ttl_s=settings.lease_ttl_s,
        lease_heartbeat_s=settings.effective_lease_heartbeat_s,
        breaker_threshold=settings.breaker_threshold,
        breaker_cooldown_s=settings.breaker_cooldown_s,
        fallback_when_open=settings.breaker_open_policy is BreakerOpenPolicy.FALLBACK,
        summary_budget_span_ratio=settings.summary_budget_span_ratio,
        summary_budget_max_tokens=settings.effective_summary_budget_max_tokens,
    )


@dataclass(frozen=True)
class Runtime:
    """One process's long-lived collaborators."""

    settings: Settings
    store: Store
    deps: JobDeps
    policy: JobPolicy
    redis: redis.Redis | None
    delivery_counter: DeliveryCounter | None
    journal: AttemptJournal | None = None

    def close(self) -> None:
        """Release the database connections and the Redis client."""
        self.store.close()
        if self.redis is not None:
            self.redis.close()


def build_runtime(settings: Settings, *, use_redis: bool = True) -> Runtime:
    """Create engine, store, counter and summarizer; Redis only when ``use_redis``."""
    store = Store.from_url(settings.effective_database_url,
                           sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
                           call_timeout_s=settings.db_call_timeout_s)
    counter = TokenCounter(load_encoding(settings.tokenizer_encoding, settings.tiktoken_cache_dir))
    client = connect_redis(settings, keepalive=True) if use_redis else None
    keys = RedisKeys(settings.redis_key_prefix)
    state = ProviderBreakerStore(client, keys) if client else InMemoryBreakerState()
    provider_breaker = ProviderBreaker(state, threshold=settings.provider_breaker_threshold,
                                       cooldown_s=settings.provider_breaker_cooldown_s,
                                       trial_s=settings.worst_case_llm_call_s,
                                       clock=utc_now)
    job_ledger: JobLedgerPort = store  # mypy proves the store implements the job's port
    summarizer = build_summarizer(settings, counter, client, keys)
    deps = JobDeps(
        store=job_ledger,
        summarizer=summarizer,
        fallback=ExtractiveSummarizer(counter, kind="fallback"),
        counter=counter,
        provider_breaker=provider_breaker,
        clock=utc_now,
        batching=build_batching(settings, summarizer, counter, store),
    )
    delivery_counter = (
        DeliveryCounter(client, keys, ttl_s=settings.broker_visibility_timeout_s * 4)
        if client else None
    )
    journal = AttemptJournal(client, keys) if client else None
    return Runtime(settings, store, deps, job_policy(settings), client, delivery_counter,
                   journal)


def share_before_fork(settings: Settings) -> None:
    """Load, in a worker's main process, what every pool child only reads: the tokenizer,
    the database driver's modules, the ORM's configured mappers and, with the LLM
    summarizer, the SDK's modules and HTTP stack. The
    children inherit them copy-on-write instead of each building its own
    (``load_encoding`` is once per process; imports are once per process)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import configure_mappers

    load_encoding(settings.tokenizer_encoding, settings.tiktoken_cache_dir)
    # The dialect and its driver (psycopg) load when a child creates its engine.
    make_url(settings.effective_database_url).get_dialect().import_dbapi()
    configure_mappers()  # else each child configures the ORM's mappers in its first job
    if settings.effective_summarizer is SummarizerKind.LLM:
        importlib.import_module("worker.summarizers.llm")
        from worker.summarizers.openai_client import LLMClient

        # The SDK imports its HTTP stack (httpcore, anyio, truststore) and chat
        # resources only when a client is created: create one here so that the
        # children share those modules.
        LLMClient(llm_config(settings)).close()


def build_summarizer(
    settings: Settings, counter: TokenCounter, client: redis.Redis | None, keys: RedisKeys
) -> Summarizer:
    """The configured summarizer: the LLM through the OpenAI SDK, or extractive."""
    if settings.effective_summarizer is not SummarizerKind.LLM:
        return ExtractiveSummarizer(counter)
    from worker.summarizers.llm import LLMSummarizer  # the SDK loads only when it is used
    from worker.summarizers.openai_client import LLMClient

    limiter = (FleetRateLimiter(client, keys, settings.llm_rate_limit_per_s)
               if client and settings.llm_rate_limit_per_s > 0 else None)
    return LLMSummarizer(
        LLMClient(llm_config(settings), counter),  # a server that omits usage is counted with it
        counter,
        window_tokens=settings.llm_context_tokens,
        margin_ratio=settings.llm_safety_margin_ratio,
        pinned_output_tokens=settings.llm_max_output_tokens,
        concurrency=settings.llm_concurrency,
        max_calls=settings.llm_max_calls_per_job,
        rate_limiter=limiter,
        price=settings.price_table.get(settings.llm_model),
    )


def build_batching(settings: Settings, summarizer: Summarizer, counter: TokenCounter,
                   store: Store) -> Batching | None:
    """Batch mode's parts when ``llm_mode`` is batch and the summarizer is the LLM."""
    if settings.llm_mode is not LLMMode.BATCH or not summarizer.uses_provider:
        return None
    from worker.summarizers.batch_replay import (  # the SDK loads only when it is used
        BatchMode,
        LineFallback,
        ReplayPolicy,
    )
    from worker.summarizers.llm import LLMSummarizer
    from worker.summarizers.openai_client import LLMClient

    assert isinstance(summarizer, LLMSummarizer)  # uses_provider: build_summarizer's LLM
    policy = ReplayPolicy(LineFallback(settings.batch_line_fallback.value),
                          settings.batch_sync_max_prompt_tokens)
    mode = BatchMode(summarizer, LLMClient(llm_config(settings), counter), policy, counter)
    return Batching(mode=mode, store=store)


def llm_config(settings: Settings) -> LLMConfig:
    """The LLM client's plain values from settings."""
    from worker.summarizers.openai_client import LLMConfig  # the SDK loads only when it is used

    return LLMConfig(
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        model=settings.llm_model,
        connect_timeout_s=settings.llm_connect_timeout_s,
        read_timeout_s=settings.llm_read_timeout_s,
        max_retries=settings.llm_max_retries,
        prompt_cache_key=settings.effective_prompt_cache_key,
    )


_process_runtime: tuple[int, Runtime] | None = None


def current_runtime() -> Runtime | None:
    """This process's runtime if a job built it; None otherwise (nothing is built)."""
    if _process_runtime is None or _process_runtime[0] != os.getpid():
        return None
    return _process_runtime[1]


def get_runtime(settings: Settings) -> Runtime:
    """This process's runtime, rebuilt after a fork (engines must not cross processes)."""
    global _process_runtime
    if _process_runtime is None or _process_runtime[0] != os.getpid():
        _process_runtime = (os.getpid(), build_runtime(settings))
    return _process_runtime[1]
