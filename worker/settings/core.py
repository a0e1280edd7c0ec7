"""The settings a job's dependencies are built from (storage, broker, tokenizer,
compaction policy, summarizer) and the enums they take; ``Settings``
(``worker.settings.config``) adds the rest. Read through ``get_settings`` only."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.compaction import StrategyName
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


class LLMMode(StrEnum):
    """How summarizer requests reach the model."""

    SYNC = "sync"  # one call at a time, within the job
    BATCH = "batch"  # through the Batch API: the job parks until a batch answers


class BatchFallback(StrEnum):
    """What a request a batch failed to answer (expired, cancelled, an error) falls back to."""

    SYNC = "sync"  # a synchronous call, at full price
    DETERMINISTIC = "deterministic"  # the extractive summary (outcome fallback)


class DbPooler(StrEnum):
    """What stands between the service and PostgreSQL (``db/engine.py``)."""

    NONE = "none"  # the server itself, or a pooler in session mode
    TRANSACTION = "transaction"  # PgBouncer's pool_mode = transaction, or alike


class LogFormat(StrEnum):
    AUTO = "auto"  # JSON when stderr is not a TTY, console when it is
    JSON = "json"
    CONSOLE = "console"


class CoreSettings(BaseSettings):
    """The storage, broker, tokenizer, policy and summarizer knobs, with their units."""

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
        32_768, gt=0, description="Largest rendered summary block, however much it covers "
        "(tokens; at least summary_budget_tokens; a job uses at most three quarters of "
        "the floor, model_context_tokens x trigger_ratio x floor_ratio)."
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
    llm_mode: LLMMode = Field(
        LLMMode.SYNC, description="`sync` calls the summarizer within the job; `batch` "
        "sends its requests through the Batch API (half price, answers within 24 h): the "
        "job parks, and `compactor batches poll` (a beat entry) finishes it."
    )
    batch_line_fallback: BatchFallback = Field(
        BatchFallback.SYNC, description="A request a batch did not answer (expired, "
        "cancelled, an error): call it synchronously, or commit the deterministic summary."
    )
    batch_max_requests: int = Field(
        50_000, ge=1, le=50_000, description="Most requests one batch takes (count; the "
        "Batch API's limit is 50,000)."
    )
    batch_max_file_bytes: int = Field(
        190_000_000, ge=1_000_000, le=200_000_000, description="Largest request file one "
        "batch takes (bytes; the Batch API's limit is 200 MB): more parked requests go into "
        "further batches of the same poll."
    )
    batch_sync_max_prompt_tokens: int = Field(
        2_000, ge=0, description="A chunk-and-merge reduce round whose request is this "
        "small is called synchronously instead of waiting for another batch (tokens; 0 = "
        "every round through a batch)."
    )
    batch_poll_interval_s: int = Field(
        300, ge=10, description="How often beat polls open batches: sends the waiting "
        "requests, collects finished batches and sends their jobs again (s)."
    )

    # Values a type cannot check; each rule's ValueError says what is wrong.
    _check_database_url = field_validator("database_url")(
        lambda url: url if not url else setting_rules.check_database_url(url))
    _check_redis_url = field_validator("redis_url")(setting_rules.check_redis_url)
    # Set empty, as an environment that must override an inherited name sets it: no master.
    _unset_empty_master = field_validator("redis_sentinel_master")(lambda name: name or None)
    _check_llm_base_url = field_validator("llm_base_url")(
        lambda url: url if not url else setting_rules.check_http_url(url))
