"""`compactor --help` loads no database, broker, LLM, tokenizer, settings or logging
library: the command modules import them inside the commands that use them (issue 14's
0.3 s target, measured by ``bench/startup_bench.py``; this is the guard that keeps it,
not a timing test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# Packages (any of their submodules counts). pydantic-settings is the settings' loader;
# structlog pulls rich's traceback and pretty-printer through structlog.dev.
HEAVY = ("celery", "kombu", "sqlalchemy", "alembic", "openai", "httpx", "tiktoken", "redis",
         "pydantic_settings", "structlog", "psycopg")
# The service's own modules that load those, or pydantic models, or the store's records.
SERVICE_HEAVY = ("worker.settings.config", "worker.settings.errors", "worker.logging",
                 "worker.errors", "worker.platform.ingest", "worker.compaction.messages",
                 "worker.broker.contract", "db.records", "db.errors")

PROBE = textwrap.dedent("""
    import json, sys
    {action}
    loaded = {{name.split(".")[0] for name in sys.modules}} & set({heavy!r})
    print(json.dumps(sorted(loaded | (set(sys.modules) & set({service!r})))))
""")


def loaded_by(action: str, also: tuple[str, ...] = ()) -> list[str]:
    script = PROBE.format(action=action, heavy=HEAVY + also, service=SERVICE_HEAVY)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def help_action(argv: list[str]) -> str:
    return textwrap.dedent(f"""
        import contextlib, io
        from scheduler.cli.main import app
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            app({argv!r})
    """)


def test_importing_the_command_line_loads_no_heavy_library() -> None:
    assert loaded_by("import scheduler.cli.main", also=("pydantic",)) == []


@pytest.mark.parametrize("argv", [["--help"], ["-h"]])
def test_the_top_level_help_loads_not_even_pydantic(argv: list[str]) -> None:
    assert loaded_by(help_action(argv), also=("pydantic",)) == []


@pytest.mark.parametrize("argv", [
    ["db", "--help"], ["dead", "--help"], ["scan", "--help"], ["demo", "--help"],
    ["import", "-h"], ["export", "--help"], ["append", "--help"], ["runs", "--help"],
    ["compact", "--help"], ["breaker", "reset", "--help"], ["check", "--help"],
    ["gc", "--help"], ["db", "backfill", "--help"], ["dead", "retry", "--help"],
    ["trigger", "--help"], ["worker", "--help"]])
def test_a_commands_help_loads_not_even_pydantic(argv: list[str]) -> None:
    # typer coerces option values through pydantic, except bool flags holding a bool: the
    # groups' help flag defaults to False (scheduler/cli/groups.py) so that passing
    # through a group on the way to a command's help coerces nothing.
    assert loaded_by(help_action(argv), also=("pydantic",)) == []


def test_the_probe_sees_a_heavy_import() -> None:
    # The store itself loads alembic only where it checks the schema.
    assert loaded_by("import db; db.Store") == ["db.errors", "db.records", "sqlalchemy"]
    # Migrations need no record type: the face loads each name with its own module only.
    assert loaded_by("import db; db.upgrade_database") == ["alembic", "db.errors", "sqlalchemy"]
    assert {"pydantic_settings", "worker.settings.config"} <= set(
        loaded_by("import worker.settings.config"))


def test_db_upgrade_s_lock_defaults_are_the_migrations_own() -> None:
    """Repeated in the command module, so that `compactor db --help` loads no alembic."""
    from db import migrate
    from scheduler.cli import db as db_command

    assert (db_command.DEFAULT_LOCK_TIMEOUT_S, db_command.DEFAULT_LOCK_ATTEMPTS) == (
        migrate.LOCK_TIMEOUT_S, migrate.LOCK_ATTEMPTS)
