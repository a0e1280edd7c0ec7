"""The one settings object of the service (env prefix ``COMPACTOR_``).

Read only in entrypoints through :func:`get_settings`; everything below them takes plain
values. Each field's description states its unit; the README's configuration table is
generated from these fields and a test fails when the two drift.
"""

from __future__ import annotations

import functools
from typing import Self

from pydantic import Field, field_validator, model_validator

from worker.compaction import ModelPrice, dump_price_table, parse_price_table
from worker.scrub import url_secrets
from worker.settings import rules as setting_rules
from worker.settings.core import (
    BreakerOpenPolicy,
    CoreSettings,
    DbPooler,
    LogFormat,
    SummarizerKind,
)

# OpenAI's list prices (USD per million tokens) when this table was written.
DEFAULT_PRICES = {
    "gpt-4o-mini": ModelPrice(input=0.15, cached_input=0.075, output=0.60, batch_discount=0.5),
    "gpt-4o": ModelPrice(input=2.50, cached_input=1.25, output=10.00, batch_discount=0.5),
    "gpt-4.1": ModelPrice(input=2.00, cached_input=0.50, output=8.00, batch_discount=0.5),
    "gpt-4.1-mini": ModelPrice(input=0.40, cached_input=0.10, output=1.60, batch_discount=0.5),
    "gpt-4.1-nano": ModelPrice(input=0.10, cached_input=0.025, output=0.40,
                               batch_discount=0.5),
}


class Settings(CoreSettings):
    """Every knob of the service, with its unit in the description: ``CoreSettings``'
    and the breakers, leases, worker, scheduler, lifecycle, logging and metrics."""

    # --- breakers and leases ---------------------------------------------------------
    breaker_threshold: int = Field(
        3, ge=1, description="Consecutive session failures that open its breaker (count)."
    )
    breaker_cooldown_s: int = Field(
        3_600, ge=0, description="Time an open breaker waits before one trial (s)."
    )
    breaker_open_policy: BreakerOpenPolicy = Field(
        BreakerOpenPolicy.SKIP,
        description="While a session's breaker is open: skip, or commit the deterministic "
        "fallback summary.",
    )
    provider_breaker_threshold: int = Field(
        5, ge=1, description="Consecutive provider-wide failures that open the provider "
        "breaker (count)."
    )
    provider_breaker_cooldown_s: int = Field(
        60, ge=0, description="Time the open provider breaker waits before a trial (s)."
    )
    lease_ttl_s: int = Field(
        30, gt=0, description="How long a job's session lease lasts unless renewed: a dead "
        "worker's job is sent again by the reconciler's quick sweep (every lease "
        "heartbeat) within this and one heartbeat (s)."
    )
    lease_heartbeat_s: float | None = Field(
        None, gt=0, description="How often a running job renews its lease; at most a third "
        "of lease_ttl_s (s; unset = a third of lease_ttl_s)."
    )

    # --- worker --------------------------------------------------------------------
    worker_concurrency: int = Field(
        2, ge=1, description="Worker processes per `compactor worker` (count)."
    )
    task_soft_time_limit_s: int = Field(
        1_800, gt=0, description="Soft time limit of one job (s)."
    )
    task_hard_time_limit_s: int = Field(
        1_860, gt=0, description="Hard time limit of one job (s); above the soft limit."
    )
    broker_visibility_timeout_s: int = Field(
        3_600, gt=0, description="Redis visibility timeout: an unacknowledged job is "
        "redelivered after this (s)."
    )
    worker_soft_shutdown_s: int = Field(
        60, ge=0, description="Celery's soft shutdown: on a cold shutdown (SIGQUIT, or a "
        "second SIGTERM) running jobs get this long before they are ended and their "
        "messages requeued (s; 0 = off)."
    )
    max_deliveries: int = Field(
        5, ge=1, description="Deliveries of one job before it is failed and acknowledged "
        "(count)."
    )
    retry_backoff_max_s: int = Field(
        600, gt=0, description="Longest backoff between retries of a transient failure; "
        "also caps the wait for the provider breaker's reopening; a database outage's "
        "retries wait at most reconcile_interval_s (s)."
    )
    max_queue_item_bytes: int = Field(
        1_048_576, ge=4_096, description="Largest queue item a worker accepts; a larger one "
        "is refused and dead-lettered (bytes)."
    )
    dead_letter_max_items: int = Field(
        1_000, ge=1, description="Refused queue items kept on the dead-letter list, newest "
        "first (count)."
    )
    worker_check_llm: bool = Field(
        True, description="A starting worker checks the LLM endpoint's key and model with "
        "one tiny request, as `compactor check` does (flag; off: no request at start)."
    )
    max_transient_retries: int = Field(
        20, ge=0, description="Most retries of a job after transient failures, a "
        "backstop to retry_window_s; its last attempt is at most this + 1 (count)."
    )
    retry_window_s: int = Field(
        3_600, gt=0, description="Transient failures are retried, with jittered "
        "exponential backoff up to retry_backoff_max_s, until this long after the job's "
        "first attempt (s)."
    )

    # --- scheduler -----------------------------------------------------------------
    scan_cron: str = Field(
        "0 2 * * *", description="When the nightly scan runs (cron expression, UTC)."
    )
    scan_batch_size: int = Field(
        10_000, gt=0, description="Sessions read per keyset page of the scan (count)."
    )
    scan_max_jobs: int = Field(
        100_000, gt=0, description="Most jobs one scan enqueues (count)."
    )
    scan_token_budget: int | None = Field(
        None, gt=0, description="Most estimated summarizer tokens one scan may commit to "
        "(tokens; unset = unbounded)."
    )
    quiet_period_s: int = Field(
        1_800, ge=0, description="Skip sessions appended to within this period (s)."
    )
    dirty_ratio: float = Field(
        0.5, gt=0, description="A session compacted before is also due when tokens "
        "appended since its last compaction exceed this share of the trigger (ratio)."
    )
    enqueue_marker_ttl_s: int = Field(
        7_200, gt=0, description="How long a queued-job marker blocks a second enqueue (s)."
    )

    reconcile_interval_s: int = Field(
        300, ge=0, description="How often beat runs the reconciler, which re-sends or "
        "clears the jobs Redis lost and releases dead leases; while it is on, its quick "
        "sweep of dead leases alone runs every lease heartbeat (s; 0 = neither)."
    )
    reconcile_grace_s: int = Field(
        60, gt=0, description="A queued-job marker younger than this is never taken for "
        "a lost job: its message may still be on its way (s)."
    )
    reconcile_max_sessions: int = Field(
        10_000, gt=0, description="Sessions with a marker or lease one reconciler sweep "
        "reads (count); the rest wait for the next sweep."
    )

    # --- data lifecycle ---------------------------------------------------------------
    gc_keep_revisions: int = Field(
        3, ge=0, description="Superseded revisions `compactor gc` always keeps before the "
        "active one, the rollback depth (count)."
    )
    gc_revision_retention_s: int = Field(
        2_592_000, ge=0, description="Superseded revisions younger than this are kept "
        "(s; default 30 days)."
    )
    gc_run_retention_s: int = Field(
        7_776_000, ge=0, description="Run records younger than this are kept (s; default "
        "90 days)."
    )
    gc_session_retention_s: int | None = Field(
        None, gt=0, description="Sessions not appended to for longer than this are erased "
        "by gc, as `compactor delete` would (s; unset = sessions are kept)."
    )
    gc_batch_size: int = Field(
        500, gt=0, description="Sessions (idle ones to erase, or whose revisions to "
        "collect) or runs per gc transaction (count)."
    )
    gc_cron: str | None = Field(
        None, description="When beat runs the garbage collection (cron expression, UTC; "
        "unset = never)."
    )

    # --- logging -------------------------------------------------------------------
    log_format: LogFormat = Field(
        LogFormat.AUTO, description="How every process logs on stderr: json (one object "
        "per line), console (readable lines), or auto (console on a terminal, else json)."
    )
    log_level: str = Field("INFO", description="Log level: DEBUG, INFO, WARNING, ERROR or "
                           "CRITICAL (name).")

    # Values a type cannot check; each rule's ValueError says what is wrong.
    _check_log_level = field_validator("log_level")(setting_rules.check_log_level)
    _check_scan_cron = field_validator("scan_cron")(setting_rules.check_cron)
    _check_gc_cron = field_validator("gc_cron")(
        lambda cron: cron if not cron else setting_rules.check_cron(cron))

    # --- metrics -------------------------------------------------------------------
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Port of the worker's Prometheus endpoint "
        "(`/metrics`), served by its main process for the whole pool (unset = off)."
    )
    metrics_host: str = Field(
        "0.0.0.0", description="Address the metrics endpoint listens on (IP address)."
    )

    # --- prompt cache ----------------------------------------------------------------
    llm_prompt_cache: bool = Field(
        True, description="Send `prompt_cache_key` with every summarizer request, so the "
        "provider serves the static prompt prefix from its cache across sessions; off for "
        "endpoints that reject unknown fields (switch)."
    )
    llm_prompt_cache_key: str | None = Field(
        None, min_length=1, description="The fleet's part of `prompt_cache_key`; the prompt "
        "version is appended (name; unset = redis_key_prefix followed by queue_name)."
    )

    # --- cost ----------------------------------------------------------------------
    llm_prices: str = Field(
        dump_price_table(DEFAULT_PRICES), description="Price table of the summarizer "
        "models: a JSON object mapping each model to `input`, `cached_input` and `output` "
        "(USD per million tokens) and `batch_discount` (share taken off through the Batch "
        "API); a model missing from it is priced as unknown (cost null). The default holds "
        "OpenAI's list prices when written: set your own (JSON)."
    )

    @field_validator("llm_prices")
    @classmethod
    def _check_llm_prices(cls, text: str) -> str:
        parse_price_table(text)  # its ValueError names the first problem
        return text

    @model_validator(mode="after")
    def _refuse_unsafe_limits(self) -> Self:
        if setting_rules.is_sentinel_url(self.redis_url) != bool(self.redis_sentinel_master):
            raise ValueError("COMPACTOR_REDIS_SENTINEL_MASTER names the Sentinel master, and "
                             "is set exactly when COMPACTOR_REDIS_URL is sentinel://")
        if self.redis_sentinel_password and not self.redis_sentinel_master:
            raise ValueError("COMPACTOR_REDIS_SENTINEL_PASSWORD is the sentinels' password: "
                             "set it only with a sentinel:// COMPACTOR_REDIS_URL")
        if self.summary_budget_max_tokens < self.summary_budget_tokens:
            raise ValueError("COMPACTOR_SUMMARY_BUDGET_MAX_TOKENS must be at least "
                             "COMPACTOR_SUMMARY_BUDGET_TOKENS")
        if self.lease_heartbeat_s is not None and self.lease_heartbeat_s * 3 > self.lease_ttl_s:
            raise ValueError(
                "COMPACTOR_LEASE_HEARTBEAT_S must be at most a third of COMPACTOR_LEASE_TTL_S, "
                "or a slow renewal "
                "lets a running job's lease expire"
            )
        if self.db_statement_timeout_s and self.db_call_timeout_s <= self.db_statement_timeout_s:
            raise ValueError(
                "COMPACTOR_DB_CALL_TIMEOUT_S must exceed COMPACTOR_DB_STATEMENT_TIMEOUT_S: a "
                "live server's own timeout answers first, with its own error")
        if self.db_pooler is DbPooler.TRANSACTION and "options=" in (self.database_url or ""):
            raise ValueError("COMPACTOR_DATABASE_URL must not set options when "
                             "COMPACTOR_DB_POOLER=transaction: the pooler refuses them")
        if 2 * (self.db_call_timeout_s + self.db_connect_timeout_s) >= self.task_soft_time_limit_s:
            raise ValueError(
                "twice (COMPACTOR_DB_CALL_TIMEOUT_S + COMPACTOR_DB_CONNECT_TIMEOUT_S) must be "
                "below COMPACTOR_TASK_SOFT_TIME_LIMIT_S: a job's hung call and the record "
                "of its failure both end before the time limit, as store_unavailable")
        if self.task_hard_time_limit_s <= self.task_soft_time_limit_s:
            raise ValueError("COMPACTOR_TASK_HARD_TIME_LIMIT_S must exceed "
                             "COMPACTOR_TASK_SOFT_TIME_LIMIT_S")
        if self.task_hard_time_limit_s >= self.broker_visibility_timeout_s:
            raise ValueError(
                f"COMPACTOR_BROKER_VISIBILITY_TIMEOUT_S={self.broker_visibility_timeout_s} must "
                f"exceed the worst-case job, COMPACTOR_TASK_HARD_TIME_LIMIT_S="
                f"{self.task_hard_time_limit_s} (worst-case LLM time "
                f"{self.worst_case_llm_s:.0f}s is below the soft limit), or Redis redelivers a "
                "job that is still running"
            )
        if self.lease_ttl_s >= self.broker_visibility_timeout_s:
            raise ValueError(
                f"COMPACTOR_LEASE_TTL_S={self.lease_ttl_s} must be below "
                f"COMPACTOR_BROKER_VISIBILITY_TIMEOUT_S={self.broker_visibility_timeout_s}, "
                "so that the reconciler takes back a dead worker's job before Redis does"
            )
        if self.retry_backoff_max_s >= self.broker_visibility_timeout_s:
            raise ValueError(
                "COMPACTOR_RETRY_BACKOFF_MAX_S must be below "
                "COMPACTOR_BROKER_VISIBILITY_TIMEOUT_S, or Redis "
                "delivers a waiting retry twice"
            )
        if self.worst_case_llm_s > self.task_soft_time_limit_s:
            raise ValueError(
                f"worst-case LLM time {self.worst_case_llm_s:.0f}s ((COMPACTOR_LLM_CONNECT_"
                f"TIMEOUT_S + COMPACTOR_LLM_READ_TIMEOUT_S) x (COMPACTOR_LLM_MAX_RETRIES + 1) x "
                f"ceil(COMPACTOR_LLM_MAX_CALLS_PER_JOB / COMPACTOR_LLM_CONCURRENCY)) exceeds "
                f"COMPACTOR_TASK_SOFT_TIME_LIMIT_S={self.task_soft_time_limit_s}"
            )
        return self

    @property
    def effective_lease_heartbeat_s(self) -> float:
        """How often a running job renews its lease (s)."""
        return self.lease_heartbeat_s or self.lease_ttl_s / 3

    @property
    def worst_case_llm_call_s(self) -> float:
        """Longest one LLM call can take, its SDK retries included (s): how long the
        provider breaker's half-open trial holds it."""
        per_request_s = self.llm_connect_timeout_s + self.llm_read_timeout_s
        return per_request_s * (self.llm_max_retries + 1)

    @property
    def worst_case_llm_s(self) -> float:
        """Longest a job can spend waiting on the LLM (s)."""
        sequential_calls = -(-self.llm_max_calls_per_job // self.llm_concurrency)
        return self.worst_case_llm_call_s * sequential_calls

    @property
    def configured_database_url(self) -> str:
        """The configured URL, or the embedded SQLite file under ``data_dir``: the URL an
        operator is shown."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'compactor.db').resolve()}"

    @property
    def effective_database_url(self) -> str:
        """The URL connections are made with: the configured one, with the PostgreSQL
        timeouts added unless it sets them."""
        from db import with_postgres_timeouts  # SQLAlchemy's URL: not for --help

        return with_postgres_timeouts(
            self.configured_database_url, connect_timeout_s=self.db_connect_timeout_s,
            statement_timeout_s=self.db_statement_timeout_s,
            keepalives_idle_s=self.db_keepalives_idle_s, pooler=self.db_pooler.value)

    @property
    def secret_values(self) -> tuple[str, ...]:
        """The configured secrets as text may hold them: the API key, and the passwords
        and secret query values of the database, Redis and LLM URLs."""
        key = self.llm_api_key.get_secret_value() if self.llm_api_key else ""
        urls = (self.database_url, self.redis_url, self.llm_base_url)
        return tuple(value for value in (key, *(s for url in urls for s in url_secrets(url)))
                     if value)

    @property
    def effective_summarizer(self) -> SummarizerKind:
        if self.summarizer is not SummarizerKind.AUTO:
            return self.summarizer
        if self.llm_base_url or self.llm_api_key:
            return SummarizerKind.LLM
        return SummarizerKind.EXTRACTIVE

    @property
    def effective_prompt_cache_key(self) -> str | None:
        """The ``prompt_cache_key`` of this fleet's requests (None: not sent): one per
        prompt version, whose static prefix is what the cache can serve."""
        if not self.llm_prompt_cache:
            return None
        from worker.compaction import PROMPT_VERSION  # the prompts' modules: not for every command

        fleet = self.llm_prompt_cache_key or f"{self.redis_key_prefix}{self.queue_name}"
        return f"{fleet}:{PROMPT_VERSION}"

    @property
    def price_table(self) -> dict[str, ModelPrice]:
        """The summarizer models' prices, by model name."""
        return parse_price_table(self.llm_prices)

    @property
    def trigger_tokens(self) -> int:
        return int(self.model_context_tokens * self.trigger_ratio)

    @property
    def floor_tokens(self) -> int:
        return int(self.trigger_tokens * self.floor_ratio)

    @property
    def effective_summary_budget_max_tokens(self) -> int:
        """The block's ceiling for this model's window: a block past three quarters of the
        floor would leave the compacted projection no room for its instructions and tail,
        so a small window lowers the ceiling (never below summary_budget_tokens)."""
        return max(self.summary_budget_tokens,
                   min(self.summary_budget_max_tokens, self.floor_tokens * 3 // 4))


@functools.cache
def get_settings() -> Settings:
    """Read the settings once per process (entrypoints only)."""
    return Settings()
