"""The one settings object of the service (env prefix ``COMPACTOR_``).

Read only in entrypoints through :func:`get_settings`; everything below them takes plain
values. Each field's description states its unit; the README's configuration table is
generated from these fields and a test fails when the two drift.
"""

from __future__ import annotations

import functools
from enum import StrEnum
from pathlib import Path
from typing import Self

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.compaction import StrategyName
from worker.scrub import url_secrets
from worker.settings import rules as setting_rules


class SummarizerKind(StrEnum):
    """Which summarizer a job uses."""

    AUTO = "auto"  # llm when an endpoint or key is configured, else extractive
    LLM = "llm"
    EXTRACTIVE = "extractive"


class BreakerOpenPolicy(StrEnum):
    """What a job does while its session's breaker is open."""

    SKIP = "skip"
    FALLBACK = "fallback"


class DbPooler(StrEnum):
    """What stands between the service and PostgreSQL (``db/engine.py``)."""

    NONE = "none"  # the server itself, or a pooler in session mode
    TRANSACTION = "transaction"  # PgBouncer's pool_mode = transaction, or alike


class LogFormat(StrEnum):
    AUTO = "auto"  # JSON when stderr is not a TTY, console when it is
    JSON = "json"
    CONSOLE = "console"


class Settings(BaseSettings):
    """Every knob of the service, with its unit in the description."""

    model_config = SettingsConfigDict(
        env_prefix="COMPACTOR_", env_file=None, extra="ignore", validate_default=True,
        populate_by_name=True,  # Settings(llm_base_url=...) works as well as the env aliases
    )

    # --- storage -------------------------------------------------------------------
    data_dir: Path = Field(
        Path(".compactor"),
        description="Directory for the embedded SQLite database and local state (path).",
    )
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL; PostgreSQL in production "
        "(postgresql+psycopg://user@host/db). Default: SQLite file under data_dir.",
    )
    sqlite_busy_timeout_ms: int = Field(
        10_000, ge=0, description="How long SQLite waits on a locked database (ms)."
    )
    db_connect_timeout_s: int = Field(
        10, gt=0, description="PostgreSQL connect timeout (s; libpq connect_timeout, "
        "unless database_url sets it)."
    )
    db_statement_timeout_s: int = Field(
        300, ge=0, description="Longest PostgreSQL statement of the service; migrations "
        "excepted (s; 0 = none; unless database_url sets options)."
    )
    db_pooler: DbPooler = Field(
        DbPooler.NONE, description="What stands between the service and PostgreSQL: "
        "none (the server, or a pooler in session mode) or transaction (PgBouncer's "
        "transaction pooling: timeouts per transaction, no prepared statements)."
    )
    db_keepalives_idle_s: int = Field(
        30, gt=0, description="Idle time before TCP keepalives probe a PostgreSQL "
        "connection; 3 probes 10 s apart then drop a dead one (s)."
    )
    db_call_timeout_s: float = Field(
        330.0, gt=0, description="Longest a worker's or the scheduler's PostgreSQL call "
        "may take before the client shuts its connection: a frozen server fails the call "
        "as store_unavailable (s; above db_statement_timeout_s)."
    )

    # --- broker --------------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis of the broker and the fleet state: "
        "redis://, rediss:// or unix://, or sentinel://HOST:PORT[/DB] URLs joined by ';' "
        "(URL)."
    )
    redis_sentinel_master: str | None = Field(
        None, description="Name of the master the sentinels of a sentinel:// redis_url "
        "watch; required with one, refused without (name)."
    )
    redis_sentinel_password: SecretStr | None = Field(
        None, description="Password of the sentinels themselves (their requirepass); the "
        "master's is the first sentinel:// URL's (secret; unset = none)."
    )
    redis_key_prefix: str = Field(
        "compactor:", description="Prefix of every Redis key the service writes (string)."
    )
    queue_name: str = Field("compaction", description="Celery queue the jobs go to (name).")
    redis_socket_timeout_s: float = Field(
        30.0, gt=0, description="Connect and read timeout of every Redis connection, the "
        "broker's included; TCP keepalive is on (s)."
    )

    # --- tokens --------------------------------------------------------------------
    tokenizer_encoding: str = Field(
        "o200k_base", description="tiktoken encoding: o200k_base or cl100k_base (name)."
    )
    tiktoken_cache_dir: Path | None = Field(
        None,
        validation_alias=AliasChoices("COMPACTOR_TIKTOKEN_CACHE_DIR", "TIKTOKEN_CACHE_DIR"),
        description="Directory of tiktoken encoding files, tried before the packaged copy "
        "(path; also read from TIKTOKEN_CACHE_DIR).",
    )

    # --- compaction policy -----------------------------------------------------------
    model_context_tokens: int = Field(
        128_000, gt=0, description="Context window of the model the sessions are for (tokens)."
    )
    trigger_ratio: float = Field(
        0.70, gt=0, le=1, description="Compact when the projection exceeds this share of "
        "model_context_tokens (ratio)."
    )
    floor_ratio: float = Field(
        0.50, gt=0, le=1, description="Compact down to at most this share of the trigger "
        "(ratio)."
    )
    tail_budget_tokens: int = Field(
        8_000, ge=0, description="Recent messages kept verbatim after the summary (tokens)."
    )
    min_tail_user_turns: int = Field(
        1, ge=0, description="Recent user turns always kept verbatim (count)."
    )
    summary_budget_tokens: int = Field(
        4_096, gt=0, description="Smallest budget of the rendered summary block: what a "
        "short span gets (tokens)."
    )
    summary_budget_span_ratio: float = Field(
        0.06, ge=0, le=0.5, description="The block's budget grows by this share of every "
        "span it takes in, above summary_budget_tokens (ratio; 0 = a fixed budget)."
    )
    summary_budget_max_tokens: int = Field(
        16_384, gt=0, description="Largest rendered summary block, however much it covers "
        "(tokens; at least summary_budget_tokens)."
    )
    audit_mode: bool = Field(
        False, description="Keep tool outputs whole in what the summarizer reads (flag)."
    )
    span_strategy: StrategyName | None = Field(
        None, description="Deterministic strategy applied to the span before it is "
        "summarized: tool_result_collapse, tool_call_drop, sliding_window or truncation "
        "(name; unset = none). The original messages stay in the history."
    )
    span_strategy_keep_last_tool_groups: int = Field(
        2, ge=0, description="Tool exchanges of the span that span_strategy leaves whole "
        "(count)."
    )

    # --- summarizer ----------------------------------------------------------------
    summarizer: SummarizerKind = Field(
        SummarizerKind.AUTO,
        description="llm, extractive (deterministic, no network) or auto (llm when "
        "llm_base_url or llm_api_key is set).",
    )
    llm_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("COMPACTOR_LLM_BASE_URL", "OPENAI_BASE_URL"),
        description="OpenAI-compatible endpoint (URL; also read from OPENAI_BASE_URL).",
    )
    llm_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("COMPACTOR_LLM_API_KEY", "OPENAI_API_KEY"),
        description="API key of the endpoint (secret; also read from OPENAI_API_KEY).",
    )
    llm_model: str = Field("gpt-4o-mini", description="Summarizer model (name).")
    llm_context_tokens: int = Field(
        128_000, gt=0, description="Context window of the summarizer model (tokens)."
    )
    llm_safety_margin_ratio: float = Field(
        0.10, ge=0, lt=0.5, description="Share of the summarizer window kept free for "
        "tokenizer drift (ratio)."
    )
    llm_max_output_tokens: int | None = Field(
        None, gt=0, description="Pin the summary output budget per call (tokens); default "
        "clamp(span * 0.15, 1024, 4096)."
    )
    llm_connect_timeout_s: float = Field(
        5.0, gt=0, description="Connect timeout per LLM request (s)."
    )
    llm_read_timeout_s: float = Field(
        60.0, gt=0, description="Read timeout per LLM request (s)."
    )
    llm_max_retries: int = Field(
        2, ge=0, description="SDK-level retries per LLM call on transient errors (count)."
    )
    llm_concurrency: int = Field(
        4, ge=1, description="Concurrent map calls of one chunk-and-merge round (count)."
    )
    llm_rate_limit_per_s: float = Field(
        0.0, ge=0, description="Fleet-wide LLM calls per second across all workers "
        "(calls/s; 0 = unlimited)."
    )
    llm_max_calls_per_job: int = Field(
        32, ge=1, description="Most LLM calls one job may plan (count); bounds the "
        "worst-case job time."
    )

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
    _check_database_url = field_validator("database_url")(
        lambda url: url if not url else setting_rules.check_database_url(url))
    _check_redis_url = field_validator("redis_url")(setting_rules.check_redis_url)
    # Set empty, as an environment that must override an inherited name sets it: no master.
    _unset_empty_master = field_validator("redis_sentinel_master")(lambda name: name or None)
    _check_llm_base_url = field_validator("llm_base_url")(
        lambda url: url if not url else setting_rules.check_http_url(url))
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
    def trigger_tokens(self) -> int:
        return int(self.model_context_tokens * self.trigger_ratio)

    @property
    def floor_tokens(self) -> int:
        return int(self.trigger_tokens * self.floor_ratio)


@functools.cache
def get_settings() -> Settings:
    """Read the settings once per process (entrypoints only)."""
    return Settings()
