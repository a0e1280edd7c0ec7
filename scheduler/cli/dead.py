"""`compactor dead list|show|retry|purge`: the queue items the workers refused
(docs/RUNBOOK.md, "Dead-lettered queue items")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from typing import TYPE_CHECKING, Annotated, ParamSpec, TypeVar

import typer

from scheduler.cli.common import (
    expected_errors,
    fail,
    get_settings,
    print_json,
    readable_table,
    shown,
    stdout_console,
)
from scheduler.cli.groups import CommandGroup
from worker.shared_state.keys import RedisKeys

if TYPE_CHECKING:
    from worker.settings.config import Settings
    from worker.shared_state.dead_letters import DeadLetter, DeadLetters

P = ParamSpec("P")
R = TypeVar("R")

# Exit status of an entry that does not exist (apart from errors, 1), and of a retry refused.
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
SHOWN_ITEM_CHARS = 2_000

dead_app = typer.Typer(cls=CommandGroup, no_args_is_help=True,
                       help="Queue items the workers refused: list, show, retry, purge.")
JsonOption = Annotated[bool, typer.Option("--json", help="JSON on stdout.")]
EntryArgument = Annotated[str, typer.Argument(metavar="ID", help="The entry's id (from list).")]


def redis_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn an unreachable Redis into a one-line error."""

    @wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        import redis

        try:
            return command(*args, **kwargs)
        except redis.RedisError as error:
            fail(f"redis unreachable: {error}")

    return run


@dead_app.command("list")
@expected_errors
@redis_errors
def list_command(
    limit: Annotated[int, typer.Option(help="Newest entries to list.", min=1)] = 50,
    as_json: JsonOption = False,
) -> None:
    """List refused items, newest first (id, time, reason, task id, size)."""
    letters = _dead_letters(_settings()).list(limit)
    if as_json:
        print_json([_summary(letter) for letter in letters])
        return
    table = readable_table("id", "at", "reason", "task id", "bytes", "detail",
                           shrink=("task id", "detail"))
    for letter in letters:
        table.add_row(shown(letter.entry_id), shown(letter.at), shown(letter.reason),
                      shown(letter.task_id or ""), str(letter.item_bytes), shown(letter.detail))
    stdout_console().print(table)


@dead_app.command("show")
@expected_errors
@redis_errors
def show_command(entry_id: EntryArgument, as_json: JsonOption = False) -> None:
    """Show one refused item with its raw text (as kept: at most 64 KiB)."""
    letter = _find(_dead_letters(_settings()), entry_id)
    if as_json:
        print_json(letter)
        return
    console = stdout_console()
    for name, value in dataclasses.asdict(_summary(letter)).items():
        console.print(f"{name}: {shown(value)}", highlight=False)
    head = letter.item[:SHOWN_ITEM_CHARS]
    more = len(letter.item) - len(head)
    console.print(shown(head) + (f" ... ({more} more characters; --json for all)"
                                 if more else ""), highlight=False, soft_wrap=True)


@dead_app.command("retry")
@expected_errors
@redis_errors
def retry_command(entry_id: EntryArgument, as_json: JsonOption = False) -> None:
    """Put an item back on its queue, once it would be admitted (exit 4 if it would be
    refused again, or was kept cut short)."""
    from worker.broker.queue_items import item_limits
    from worker.shared_state.dead_letters import RetryRefused

    settings = _settings()
    try:
        letter = _dead_letters(settings).retry(entry_id, item_limits(settings),
                                               datetime.now(UTC))
    except RetryRefused as exc:
        fail(f"not retried: {exc}", exit_code=EXIT_REFUSED)
    if letter is None:
        fail(f"no dead-letter entry {entry_id}", exit_code=EXIT_NOT_FOUND)
    if as_json:
        print_json(_summary(letter))
        return
    stdout_console().print(f"re-queued {shown(letter.entry_id)} on {shown(letter.queue)}",
                           highlight=False)


@dead_app.command("purge")
@expected_errors
@redis_errors
def purge_command(as_json: JsonOption = False) -> None:
    """Drop every entry of the dead-letter list."""
    count = _dead_letters(_settings()).purge()
    if as_json:
        print_json({"purged": count})
        return
    stdout_console().print(f"purged {count} entries", highlight=False)


@dataclasses.dataclass(frozen=True)
class LetterSummary:
    """An entry without its item, as ``list`` shows it."""

    entry_id: str
    at: str
    queue: str
    reason: str
    detail: str
    task_id: str | None
    item_bytes: int
    truncated: bool


def _summary(letter: DeadLetter) -> LetterSummary:
    fields = {f.name for f in dataclasses.fields(LetterSummary)}
    return LetterSummary(**{k: v for k, v in dataclasses.asdict(letter).items() if k in fields})


def _find(letters: DeadLetters, entry_id: str) -> DeadLetter:
    letter = letters.get(entry_id)
    if letter is None:
        fail(f"no dead-letter entry {entry_id}", exit_code=EXIT_NOT_FOUND)
    return letter


def _dead_letters(settings: Settings) -> DeadLetters:
    from worker.shared_state.connection import connect_redis
    from worker.shared_state.dead_letters import DeadLetters

    client = connect_redis(settings, timeout_s=10)
    return DeadLetters(client, RedisKeys(settings.redis_key_prefix),
                       settings.dead_letter_max_items)


def _settings() -> Settings:
    from worker.logging import configure_logging

    settings = get_settings()
    configure_logging(settings.log_format.value, settings.log_level)
    return settings
