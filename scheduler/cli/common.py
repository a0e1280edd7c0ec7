"""What every `compactor` command shares: consoles, JSON output, one-line errors for
expected failures, and opening the store and the tokenizer from the settings."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

import pydantic
import typer
from rich.console import Console
from rich.markup import escape

from db import (
    SchemaMissing,
    SessionNotFound,
    Store,
    StoreError,
    StoreUnavailable,
    upgrade_database,
)
from worker.compaction import TokenCounter, load_encoding
from worker.errors import TokenizerUnavailable
from worker.scrub import mask_url, mask_urls
from worker.settings import Settings

P = ParamSpec("P")
R = TypeVar("R")


PIPED_WIDTH = 160  # columns of tables written to a pipe or file (a terminal sets its own)


def stdout_console() -> Console:
    # Built per call, so output follows sys.stdout even when a test runner swaps it.
    console = Console(file=sys.stdout)
    if not console.is_terminal:
        console.width = PIPED_WIDTH
    return console


def stderr_console() -> Console:
    return Console(file=sys.stderr, soft_wrap=True)


def fail(message: str, *, exit_code: int = 1) -> NoReturn:
    """Print a one-line error on stderr and exit with ``exit_code``.

    URLs in it have their passwords hidden: a driver's error may quote the URL it got.
    """
    stderr_console().print(f"[bold red]error:[/] {escape(mask_urls(message))}",
                           highlight=False)
    raise typer.Exit(exit_code)


def to_jsonable(value: Any) -> Any:
    """Turn dataclasses, enums and datetimes into plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def dumps_json(value: Any) -> str:
    """One line of JSON, non-ASCII kept as is (the corpus files' own style)."""
    return json.dumps(to_jsonable(value), ensure_ascii=False)


def print_json(value: Any) -> None:
    sys.stdout.write(dumps_json(value) + "\n")


# The databases the store supports, with an optional driver (postgresql+psycopg://).
_SUPPORTED_URL = re.compile(r"^(sqlite|postgresql|postgres)(\+\w+)?://")


class InvalidDatabaseUrl(ValueError):
    """Raised when the configured database URL is not one the store supports."""


def database_url(settings: Settings) -> str:
    """The configured database URL, checked to be SQLite or PostgreSQL."""
    url = settings.effective_database_url
    if not _SUPPORTED_URL.match(url):
        raise InvalidDatabaseUrl(
            f"COMPACTOR_DATABASE_URL {display_url(url)!r} is not a sqlite:/// or "
            "postgresql:// URL"
        )
    authority_and_path = url.partition("://")[2].partition("?")[0]
    if "@" in authority_and_path.rpartition("@")[0]:
        # The driver would read the host from inside the password and fail obscurely.
        raise InvalidDatabaseUrl(
            f"COMPACTOR_DATABASE_URL {display_url(url)!r}: an @ in the user name or "
            "password must be percent-encoded (%40)"
        )
    return url


def display_url(url: str) -> str:
    """The URL with its password hidden, however the password is written."""
    return mask_url(url)


def expected_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors an operator can fix into one-line messages instead of tracebacks."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except pydantic.ValidationError as error:
            fail(f"invalid settings (COMPACTOR_* environment): {_first_error(error)}")
        except InvalidDatabaseUrl as error:
            fail(str(error))
        except SessionNotFound as error:
            fail(f"unknown session: {error}")
        except SchemaMissing as error:
            fail(f"{error}; run `compactor db upgrade` first")
        except StoreUnavailable as error:
            fail(f"database unreachable: {error}")
        except StoreError as error:
            fail(f"database error: {error}")
        except TokenizerUnavailable as error:
            fail(f"tokenizer unavailable: {error}")

    return run


def _first_error(error: pydantic.ValidationError) -> str:
    first = error.errors(include_url=False, include_input=False)[0]
    return f"{'.'.join(str(loc) for loc in first['loc']) or 'settings'}: {first['msg']}"


def is_embedded(settings: Settings) -> bool:
    """True for the default SQLite file under data_dir (no database_url configured)."""
    return not settings.database_url


@contextmanager
def open_store(settings: Settings) -> Iterator[Store]:
    """Yield the store of the configured database, its schema checked.

    The embedded SQLite default is created and upgraded on first use, so a first
    `compactor import` just works; any configured database must be upgraded with
    `compactor db upgrade` first (schema changes there are the operator's call).
    """
    url = database_url(settings)
    if is_embedded(settings):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        upgrade_database(url)
    store = Store.from_url(url, sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    try:
        store.check_schema()
        yield store
    finally:
        store.close()


def load_counter(settings: Settings) -> TokenCounter:
    """The token counter of the configured encoding, loaded offline."""
    return _load_counter(settings.tokenizer_encoding, settings.tiktoken_cache_dir)


@functools.cache
def _load_counter(encoding: str, cache_dir: Path | None) -> TokenCounter:
    # An encoding is immutable and takes a while to build: once per process is enough.
    return TokenCounter(load_encoding(encoding, cache_dir))
