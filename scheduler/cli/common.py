"""What every `compactor` command shares: consoles, the one way a stored or external
value is shown (``shown``), JSON output, one-line errors for expected failures, and
opening the store and the tokenizer from the settings.

The command modules import the database, the broker and the tokenizer inside the
commands that use them (``TYPE_CHECKING`` imports for annotations), so `compactor
--help` loads none of them; ``tests/unit/test_cli_imports.py`` keeps it so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from worker.compaction import escape_controls, escape_controls_in_json
from worker.scrub import mask_url, scrub_text

if TYPE_CHECKING:
    import pydantic

    from db import Store
    from worker.compaction import TokenCounter
    from worker.settings.config import Settings

P = ParamSpec("P")
R = TypeVar("R")


PIPED_WIDTH = 160  # columns of tables written to a pipe or file (a terminal sets its own)


def stdout_console() -> Console:
    # Built per call, so output follows sys.stdout even when a test runner swaps it.
    console = Console(file=sys.stdout)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH  # COLUMNS, when set, is the width the reader has
    return console


def minute(moment: datetime) -> str:
    """A timestamp to the minute (UTC, as stored): short enough for a table cell."""
    return moment.strftime("%Y-%m-%d %H:%M")


# A column that gives way keeps this many characters a line: it folds, never vanishes.
SHRINK_MIN_WIDTH = 8


def readable_table(*headers: str, title: str | None = None,
                   shrink: Collection[str] = ()) -> Table:
    """A table that stays readable at 80 columns: no vertical rules; numbers, states and
    timestamps keep their width, and the ``shrink`` columns (ids, free text) give way to
    a narrow terminal first. Nothing is ever cut: a value wider than its cell folds onto
    the next line, so an id or a time can still be copied whole."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header in headers:
        table.add_column(header, no_wrap=header not in shrink, overflow="fold",
                         min_width=SHRINK_MIN_WIDTH if header in shrink else None)
    return table


def shown(value: object) -> str:
    """``value`` as every table cell and printed line shows it: control characters
    escaped (ESC as ``\\x1b``: stored text never drives the terminal), rich markup
    escaped (a ``[`` in it prints as itself)."""
    return escape(escape_controls(str(value)))


def stderr_console() -> Console:
    return Console(file=sys.stderr, soft_wrap=True)


def fail(message: str, *, exit_code: int = 1) -> NoReturn:
    """Print a one-line error on stderr and exit with ``exit_code``.

    Credentials in it are hidden (``worker/scrub.py``): a driver's error may quote the
    URL it got.
    """
    stderr_console().print(f"[bold red]error:[/] {shown(scrub_text(message))}",
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
    """One line of JSON, non-ASCII kept as is (the corpus files' own style) but for
    control characters, written as ``\\uXXXX`` escapes."""
    return escape_controls_in_json(json.dumps(to_jsonable(value), ensure_ascii=False))


def print_json(value: Any) -> None:
    sys.stdout.write(dumps_json(value) + "\n")


def display_url(url: str) -> str:
    """The URL with its password hidden, however the password is written."""
    return mask_url(url)


def expected_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn the errors an operator can fix into one-line messages instead of tracebacks."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        # Imported when a command runs: `--help` loads neither pydantic nor the store.
        import pydantic

        from db import (
            SchemaLockTimeout,
            SchemaMissing,
            SessionNotFound,
            StoreError,
            StoreUnavailable,
        )
        from worker.compaction import TokenizerUnavailable

        try:
            return command(*args, **kwargs)
        except pydantic.ValidationError as error:
            fail(f"invalid settings (COMPACTOR_* environment): {_first_error(error)}")
        except SessionNotFound as error:
            fail(f"unknown session: {error}")
        except SchemaMissing as error:
            fail(f"{error}; run `compactor db upgrade` first")
        except SchemaLockTimeout as error:
            fail(f"schema not changed: {error}")
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


_AGO = re.compile(r"^(\d+)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}


def parse_when(text: str) -> datetime:
    """A point in time from an option: an ISO 8601 datetime (UTC when it names no zone) or
    a span ago, like ``90m``, ``24h`` or ``7d`` (units s, m, h, d, w)."""
    ago = _AGO.match(text.strip())
    if ago:
        seconds = int(ago.group(1)) * _UNIT_SECONDS[ago.group(2)]
        return datetime.now(UTC) - timedelta(seconds=seconds)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither an ISO datetime (2026-11-21T18:00, 2026-11-21) nor a "
            "span ago (30m, 24h, 7d)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def get_settings() -> Settings:
    """The settings, read when a command runs: `--help` never loads pydantic-settings."""
    from worker.settings.config import get_settings as read_settings

    return read_settings()


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
    from db import Store, upgrade_database

    url = settings.effective_database_url
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
    from worker.compaction import TokenCounter
    from worker.tokenizer.offline import load_encoding

    return TokenCounter(load_encoding(encoding, cache_dir))
