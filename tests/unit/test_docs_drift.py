"""The README and the runbook stay true to the code: the configuration and outcome-event
tables are the ones generated from the settings and the event (figures included), every
`compactor` command they show exists, every command is documented, and the raw trigger
example is a message the worker accepts."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from scheduler.cli.config_table import (
    README_PATH,
    TABLE_END,
    TABLE_START,
    render_markdown_table,
    setting_rows,
)
from tests.support.corpus import CORPUS_DIR_ENV
from tests.support.databases import POSTGRES_URL_ENV
from tests.unit.cli_tree import command_paths, resolve_command, subcommands
from worker.broker.contract import TASK_NAME, JobMessage, queue_list_key
from worker.errors import Outcome
from worker.job.figures import JobFigures
from worker.job.outcome import (
    EVENT_TABLE_END,
    EVENT_TABLE_START,
    job_event_fields,
    render_event_table,
)
from worker.job.values import JobResult
from worker.settings.config import Settings

DOCS = [README_PATH, README_PATH.parent / "docs" / "RUNBOOK.md"]
# `compactor WORD [WORD]` where a command is written (not session-compactor, compactor:).
COMMAND = re.compile(r"(?<![\w./-])compactor[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?")
# The test suite's own variables share the settings' prefix, and the README names them.
TEST_SUITE_ENV = {CORPUS_DIR_ENV, POSTGRES_URL_ENV}
# The RUNBOOK's bad-settings table shows what a misspelled variable gets.
MISSPELLED_ON_PURPOSE = {"COMPACTOR_TRIGER_RATIO"}


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The body of a level-2 section, up to the next level-2 heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def code_in(text: str) -> list[str]:
    """Fenced blocks and inline code spans: where commands are written."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def written_commands(path: Path) -> list[list[str]]:
    return [[word for word in match if word] for code in code_in(read(path))
            for match in COMMAND.findall(code)]


def test_readme_config_table_is_the_one_generated_from_the_settings() -> None:
    readme = read(README_PATH)
    table = readme[readme.index(TABLE_START) + len(TABLE_START): readme.index(TABLE_END)]
    assert table.strip() == render_markdown_table().strip(), \
        "README configuration table drifted: run `python -m scheduler.cli.config_table write`"
    assert len(setting_rows()) == len(Settings.model_fields)


def test_readme_event_table_is_the_one_generated_from_the_event_and_its_figures() -> None:
    readme = read(README_PATH)
    table = readme[readme.index(EVENT_TABLE_START) + len(EVENT_TABLE_START):
                   readme.index(EVENT_TABLE_END)]
    assert table.strip() == render_event_table().strip(), \
        "README event table drifted: run `python -m scheduler.cli.config_table write`"


def test_the_event_table_names_exactly_the_fields_a_job_event_carries() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \|", render_event_table(), flags=re.M))
    result = JobResult(
        session_id="s", task_id="t", attempt=1, trigger="x", outcome=Outcome.COMPACTED,
        reason="r", summarizer=None, failure_class=None, failure_message=None,
        retryable=False, retry_after_s=None, revision_id=None, parent_revision_id=None,
        breaker_state=None, figures=JobFigures(), durations_ms={}, duration_ms=0.0)
    assert {"session_id", "outcome", "tokens_before", "tokens_after"} <= documented
    assert set(job_event_fields(result)) == documented


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_compactor_command_in_the_docs_exists(path: Path) -> None:
    written = written_commands(path)
    assert written, f"no `compactor` command found in {path.name}"
    for words in written:
        command, used, _ = resolve_command(words)
        if subcommands(command) is not None:
            pytest.fail(f"{path.name}: `compactor {' '.join(words)}` names no command")
        assert used, words


def test_a_misspelt_command_in_the_docs_would_be_caught() -> None:
    assert COMMAND.findall("see `compactor rollbak sess-1`, session-compactor, compactor:") \
        == [("rollbak", "sess-1")]
    with pytest.raises(LookupError):
        resolve_command(["rollbak", "sess-1"])


def test_readme_lists_every_command_in_its_commands_section() -> None:
    listed = {" ".join(words) for words in (
        [w for w in match if w] for match in COMMAND.findall(section(read(README_PATH),
                                                                     "Commands")))}
    missing = {path for path in command_paths()
               if not any(entry == path or entry.startswith(path + " ") for entry in listed)}
    assert sorted(missing) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_setting_the_docs_name_exists(path: Path) -> None:
    known = ({name for row in setting_rows() for name in row.env_names} | TEST_SUITE_ENV
             | MISSPELLED_ON_PURPOSE)
    named = set(re.findall(r"\bCOMPACTOR_[A-Z0-9_]+", read(path)))
    assert named
    assert sorted(named - known) == []


def test_readme_raw_trigger_example_is_a_message_the_worker_accepts() -> None:
    text = section(read(README_PATH), "Triggering a compaction from another system")
    example = re.search(r"```json\n(.*?)```", text, flags=re.S)
    assert example is not None
    envelope = json.loads(example.group(1))
    args, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    assert args == [] and embed == {"callbacks": None, "errbacks": None, "chain": None,
                                    "chord": None}
    JobMessage.model_validate(kwargs)
    assert envelope["headers"]["task"] == TASK_NAME
    assert envelope["content-type"] == "application/json"
    assert envelope["properties"]["body_encoding"] == "base64"
    queue = Settings.model_fields["queue_name"].default
    prefix = Settings.model_fields["redis_key_prefix"].default
    assert envelope["properties"]["delivery_info"]["routing_key"] == queue
    assert queue_list_key(prefix, queue) in text
