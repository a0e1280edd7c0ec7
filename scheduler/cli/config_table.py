"""The generated reference docs: the README's configuration table and
``deploy/env.example`` from ``Settings.model_fields``, and the README's outcome-event
table from ``worker.job.outcome`` (``JobFigures`` included), each between its markers.

    python -m scheduler.cli.config_table markdown        # print the configuration table
    python -m scheduler.cli.config_table env             # print env.example
    python -m scheduler.cli.config_table events          # print the event table
    python -m scheduler.cli.config_table write           # rewrite the files in place

Tests regenerate them and fail when the files drift from the code.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pydantic import AliasChoices
from pydantic.fields import FieldInfo

from worker.job.outcome import EVENT_TABLE_END, EVENT_TABLE_START, render_event_table
from worker.settings.config import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]
README_PATH = REPO_ROOT / "README.md"
ENV_EXAMPLE_PATH = REPO_ROOT / "deploy" / "env.example"
TABLE_START = "<!-- config-table:start -->"
TABLE_END = "<!-- config-table:end -->"
ENV_PREFIX = "COMPACTOR_"

ENV_EXAMPLE_HEADER = """\
# Every setting of the session compactor with its default, one commented line each.
# Generated from worker/settings/config.py by `python -m scheduler.cli.config_table env`; a
# test fails when this file and the settings drift apart. Uncomment and change what you need, then
# use the file as a systemd EnvironmentFile, `docker run --env-file`, or compose `env_file`.
"""


@dataclass(frozen=True)
class SettingRow:
    """One setting as the docs show it."""

    name: str
    env_names: tuple[str, ...]  # the COMPACTOR_ name first, then any alias read too
    default: str | None  # None: unset by default
    description: str


def env_names(name: str, field: FieldInfo) -> tuple[str, ...]:
    """The environment variables a field is read from."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    return (f"{ENV_PREFIX}{name.upper()}",)


def format_default(value: object) -> str | None:
    """The default as it would be written in the environment (None: unset)."""
    if value is None:
        return None
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def setting_rows() -> list[SettingRow]:
    """Every field of Settings, in declaration order."""
    return [SettingRow(name, env_names(name, field), format_default(field.default),
                       field.description or "")
            for name, field in Settings.model_fields.items()]


def render_markdown_table() -> str:
    """The README's configuration table (without the markers)."""
    lines = ["| setting | environment variable | default | description |",
             "|---|---|---|---|"]
    for row in setting_rows():
        env = "<br>".join(f"`{name}`" for name in row.env_names)
        default = "unset" if row.default is None else f"`{row.default}`"
        description = row.description.replace("|", "\\|")
        lines.append(f"| `{row.name}` | {env} | {default} | {description} |")
    return "\n".join(lines) + "\n"


def render_env_example() -> str:
    """deploy/env.example: every setting, commented out at its default."""
    blocks = [ENV_EXAMPLE_HEADER]
    for row in setting_rows():
        comment = "".join(f"# {line}\n" for line in textwrap.wrap(row.description, 86))
        blocks.append(f"{comment}#{row.env_names[0]}={row.default or ''}\n")
    return "\n".join(blocks)


class MarkersMissing(ValueError):
    """Raised when a document lacks the config-table markers."""


def replace_table(document: str, table: str, markers: tuple[str, str] = (TABLE_START, TABLE_END)
                  ) -> str:
    """Put ``table`` between the document's ``markers`` (the config table's by default)."""
    start_marker, end_marker = markers
    start, end = document.find(start_marker), document.find(end_marker)
    if start < 0 or end < start:
        raise MarkersMissing(f"expected {start_marker} ... {end_marker} in the document")
    head = document[: start + len(start_marker)]
    return f"{head}\n{table}{document[end:]}"


def write_all() -> None:
    """Rewrite the README's tables and env.example from the code."""
    readme = replace_table(README_PATH.read_text(encoding="utf-8"), render_markdown_table())
    readme = replace_table(readme, render_event_table(), (EVENT_TABLE_START, EVENT_TABLE_END))
    README_PATH.write_text(readme, encoding="utf-8")
    ENV_EXAMPLE_PATH.write_text(render_env_example(), encoding="utf-8")


def main(argv: list[str]) -> int:
    commands = {"markdown": lambda: sys.stdout.write(render_markdown_table()),
                "env": lambda: sys.stdout.write(render_env_example()),
                "events": lambda: sys.stdout.write(render_event_table()),
                "write": write_all}
    if len(argv) != 1 or argv[0] not in commands:
        sys.stderr.write(f"usage: python -m scheduler.cli.config_table {{{'|'.join(commands)}}}\n")
        return 2
    commands[argv[0]]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
