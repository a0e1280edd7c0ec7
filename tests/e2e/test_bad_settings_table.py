"""The RUNBOOK's "Bad settings and what they say" table, kept true: every row's command
runs for real (a worker, beat, scan, ...) with the row's setting, and says what the row
says, with the row's exit status."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import REPO_ROOT, Compactor
from tests.support.openai_server import OpenAIServer

RUNBOOK = REPO_ROOT / "docs" / "RUNBOOK.md"
DOCUMENTED_LLM_URL = "http://127.0.0.1:8000/v1"  # the rows' stand-in for the test server
_TABLE = re.compile(r"<!-- bad-settings:start -->\n(.*?)<!-- bad-settings:end -->", re.S)
_CODE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    settings: dict[str, str]
    command: list[str]
    message: str
    exit_code: int


def documented_rows() -> list[Row]:
    [table] = _TABLE.findall(RUNBOOK.read_text(encoding="utf-8"))
    rows = []
    for line in table.strip().splitlines()[2:]:
        setting, command, says, exit_code = (cell.strip() for cell in line.strip("|").split("|"))
        settings = dict(code.split("=", 1) for code in _CODE.findall(setting))
        [command_line] = _CODE.findall(command)
        assert command_line.startswith("compactor "), line
        rows.append(Row(settings, command_line.split()[1:], _CODE.findall(says)[0],
                        int(exit_code)))
    return rows


def said(stderr: str) -> list[str]:
    """What the process said: each JSON line's message, or the text after `error: `."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            lines.append(str(json.loads(line).get("message", "")))
        else:
            lines.append(line.removeprefix("error: "))
    return lines


def matches(documented: str, line: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in documented.split("…"))
    return re.fullmatch(pattern, line) is not None


def test_the_table_covers_every_bad_setting_of_issue_14() -> None:
    variables = {name for row in documented_rows() for name in row.settings}
    assert {"COMPACTOR_TRIGGER_RATIO", "COMPACTOR_LOG_LEVEL", "COMPACTOR_TRIGER_RATIO",
            "COMPACTOR_SCAN_CRON", "COMPACTOR_REDIS_URL", "COMPACTOR_DATABASE_URL",
            "COMPACTOR_LLM_API_KEY"} <= variables


@pytest.mark.parametrize("row", documented_rows(), ids=lambda row: " ".join(row.settings))
def test_each_bad_setting_says_what_the_runbook_says(
    row: Row, migrated_postgres_url: str, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    env = {"COMPACTOR_DATABASE_URL": migrated_postgres_url, "COMPACTOR_DATA_DIR": str(tmp_path),
           "COMPACTOR_REDIS_KEY_PREFIX": f"test-bad-{tag}:",
           "COMPACTOR_QUEUE_NAME": f"bad-{tag}", "COMPACTOR_LOG_FORMAT": "json"}
    with OpenAIServer(latency_ms=0, api_key="sk-the-right-key") as server:
        settings = {name: value.replace(DOCUMENTED_LLM_URL, server.base_url)
                    for name, value in row.settings.items()}
        done = Compactor({**env, **settings}).subprocess(*row.command)

    expected = row.message.replace(DOCUMENTED_LLM_URL, server.base_url)
    lines = said(done.stderr)
    assert any(matches(expected, line) for line in lines), (expected, done.stderr)
    assert done.returncode == row.exit_code, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
