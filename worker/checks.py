"""Start checks of a configuration: the database (reachable, migrated), Redis, the
tokenizer (offline), and the summarizer (the LLM endpoint's credentials and model with
one tiny request, or the extractive summarizer's needs). ``compactor check`` prints
them; a worker runs them at start and refuses to consume when one fails.

Each check says what is wrong and what to change, scrubbed of credentials (URLs'
passwords and secret query values masked, the configured secrets removed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import redis

from db import (
    PoolerRefusedStartup,
    SchemaMissing,
    StoreError,
    StoreUnavailable,
    current_revision,
    head_revision,
)
from worker.errors import (
    CompactionError,
    ProviderAuthFailed,
    ProviderError,
    SummaryInvalid,
    TokenizerUnavailable,
)
from worker.scrub import mask_url, scrub_text
from worker.settings.config import Settings
from worker.settings.core import SummarizerKind
from worker.settings.errors import unknown_variables
from worker.shared_state.connection import connect_redis
from worker.tokenizer.offline import load_encoding

REDIS_TIMEOUT_S = 5.0
DEFAULT_LLM_BASE_URL = "https://api.openai.com/v1"  # the SDK's, when none is configured
_PROBE_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                 "required": ["ok"], "additionalProperties": False}
_PROBE_MESSAGES = [{"role": "user", "content": 'Answer with the JSON object {"ok": true}.'}]
_PROBE_OUTPUT_TOKENS = 16
EXTRACTIVE_READY = "extractive (deterministic, no network): ready with the tokenizer"


class CheckStatus(StrEnum):
    OK = "ok"
    PROBLEM = "problem"  # the configuration is wrong: a restart reads the same values
    UNREACHABLE = "unreachable"  # a dependency is down or slow: it may come back by itself


@dataclass(frozen=True)
class CheckResult:
    """One check: what was checked, its status, what was found, and the fix (problems)."""

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is CheckStatus.OK

    @property
    def line(self) -> str:
        """The result as one line (how a refusing worker logs it)."""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"{self.name}: {self.detail}{fix}"


class _Problem(Exception):
    """A failed check's finding and fix."""

    status = CheckStatus.PROBLEM

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(detail)
        self.detail, self.fix = detail, fix


class _Unreachable(_Problem):
    """A dependency that did not answer: an outage, not (necessarily) a wrong setting."""

    status = CheckStatus.UNREACHABLE


def run_checks(settings: Settings, *, probe_llm: bool = True) -> list[CheckResult]:
    """Every check, in order; each one runs whatever the others found. Without
    ``probe_llm`` the LLM summarizer's endpoint is not called."""
    summarizer = check_summarizer if probe_llm else check_summarizer_without_request
    checks: list[tuple[str, Callable[[Settings], str]]] = [
        ("settings", check_settings),
        ("database", check_database),
        ("redis", check_redis),
        ("tokenizer", check_tokenizer),
        ("summarizer", summarizer),
    ]
    return [_run(name, check, settings) for name, check in checks]


def _run(name: str, check: Callable[[Settings], str], settings: Settings) -> CheckResult:
    started = time.monotonic()
    try:
        detail = check(settings)
    except _Problem as problem:
        return CheckResult(name, problem.status, scrub_text(problem.detail), problem.fix,
                           time.monotonic() - started)
    return CheckResult(name, CheckStatus.OK, scrub_text(detail), "",
                       time.monotonic() - started)


def check_settings(_: Settings) -> str:
    """Valid by now (invalid ones stop every entrypoint); unknown variables noted."""
    unknown = unknown_variables(os.environ)
    if not unknown:
        return "every COMPACTOR_* value is valid"
    ignored = ", ".join(f"{u.variable} (did you mean {u.closest}?)" if u.closest
                        else u.variable for u in unknown)
    return f"valid; ignored unknown variables: {ignored}"


def check_database(settings: Settings) -> str:
    url = settings.effective_database_url
    shown = mask_url(settings.configured_database_url)
    if not settings.database_url and not (settings.data_dir / "compactor.db").exists():
        raise _Problem(f"the embedded database {shown} does not exist yet",
                       "run `compactor db upgrade` (or any `compactor` command that uses it)")
    try:
        current, head = current_revision(url), head_revision()
    except PoolerRefusedStartup as error:
        raise _Problem(f"{shown}: {error}", "set COMPACTOR_DB_POOLER=transaction") from None
    except StoreUnavailable as error:
        raise _Unreachable(f"cannot reach {shown}: {error}",
                       "start the database or fix COMPACTOR_DATABASE_URL") from None
    except (SchemaMissing, StoreError) as error:
        raise _Problem(f"{shown}: {error}", "fix COMPACTOR_DATABASE_URL") from None
    if current != head:
        raise _Problem(f"{shown} is at schema revision {current or 'none (never migrated)'}, "
                       f"the code needs {head}", "run `compactor db upgrade`")
    return f"{shown} reachable, schema at head ({head})"


def check_redis(settings: Settings) -> str:
    shown = ";".join(mask_url(url) for url in settings.redis_url.split(";"))
    client = connect_redis(settings, timeout_s=REDIS_TIMEOUT_S)
    try:
        client.ping()
    except redis.AuthenticationError as error:
        raise _Problem(f"{shown} refused the credentials: {error}",
                       "fix the user or password in COMPACTOR_REDIS_URL") from None
    except redis.RedisError as error:
        raise _Unreachable(f"cannot reach Redis at {shown}: {str(error).rstrip('.')}",
                       "start Redis or fix COMPACTOR_REDIS_URL") from None
    finally:
        client.close()
    return f"{shown} answers PING"


def check_tokenizer(settings: Settings) -> str:
    started = time.monotonic()
    try:
        load_encoding(settings.tokenizer_encoding, settings.tiktoken_cache_dir)
    except TokenizerUnavailable as error:
        raise _Problem(str(error), "set COMPACTOR_TOKENIZER_ENCODING to o200k_base or "
                       "cl100k_base, or COMPACTOR_TIKTOKEN_CACHE_DIR to a directory holding "
                       "its file") from None
    elapsed_ms = (time.monotonic() - started) * 1000
    return f"{settings.tokenizer_encoding} loaded offline ({elapsed_ms:.0f} ms)"


def check_summarizer(settings: Settings) -> str:
    if settings.effective_summarizer is not SummarizerKind.LLM:
        return EXTRACTIVE_READY
    return check_llm_endpoint(settings)


def check_summarizer_without_request(settings: Settings) -> str:
    if settings.effective_summarizer is not SummarizerKind.LLM:
        return EXTRACTIVE_READY
    shown = mask_url(settings.llm_base_url or DEFAULT_LLM_BASE_URL)
    return f"llm: {shown}, model {settings.llm_model} (settings only: endpoint not called)"


def check_llm_endpoint(settings: Settings) -> str:
    """One tiny request with the configured key and model, no retries."""
    from worker.summarizers.openai_client import (  # the SDK loads only when it is used
        LLMClient,
        LLMConfig,
    )

    base_url = settings.llm_base_url or DEFAULT_LLM_BASE_URL
    shown, model = mask_url(base_url), settings.llm_model
    config = LLMConfig(
        base_url=base_url,
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        model=model, connect_timeout_s=settings.llm_connect_timeout_s,
        read_timeout_s=settings.llm_read_timeout_s, max_retries=0,
    )
    try:
        with LLMClient(config) as client:
            client.complete_json(_PROBE_MESSAGES, schema=_PROBE_SCHEMA,
                                 max_output_tokens=_PROBE_OUTPUT_TOKENS)
    except SummaryInvalid:
        pass  # the model answered, if not as asked: endpoint, key and model work
    except ProviderAuthFailed as error:
        raise _Problem(f"{shown} refused the credentials for model {model}: {error}",
                       "set COMPACTOR_LLM_API_KEY (or OPENAI_API_KEY) to a key this "
                       "endpoint accepts for this model") from None
    except ProviderError as error:
        kind = _Unreachable if error.reason in ("connection", "timeout") else _Problem
        raise kind(_provider_problem(error, shown, model, settings),
                   _provider_fix(error)) from None
    except CompactionError as error:
        raise _Problem(f"{shown} rejected a one-line request to model {model}: {error}",
                       "check COMPACTOR_LLM_MODEL and COMPACTOR_LLM_BASE_URL") from None
    return f"{shown} accepted the key and answered with model {model}"


def _provider_problem(error: ProviderError, shown: str, model: str,
                      settings: Settings) -> str:
    if error.reason == "connection":
        return f"could not reach the LLM endpoint {shown}"
    if error.reason == "timeout":
        return (f"the LLM endpoint {shown} did not answer within "
                f"{settings.llm_read_timeout_s:g} s")
    if error.reason == "not_found":
        return f"{shown} has no model {model} (or no chat completions path): {error}"
    return f"{shown} failed a one-line request to model {model}: {error}"


def _provider_fix(error: ProviderError) -> str:
    if error.reason == "not_found":
        return ("set COMPACTOR_LLM_MODEL to a model the endpoint serves, or fix "
                "COMPACTOR_LLM_BASE_URL (it usually ends in /v1)")
    return "start the endpoint or fix COMPACTOR_LLM_BASE_URL (or OPENAI_BASE_URL)"
