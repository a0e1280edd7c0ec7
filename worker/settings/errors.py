"""Invalid settings as one line per problem, naming the environment variable, its value
and what is allowed; and unknown ``COMPACTOR_*`` variables, with the closest real name.

Every entrypoint (the command line, the worker, beat) reads its settings through
:func:`load_settings`, so an operator sees the same lines wherever a value is wrong.
"""

from __future__ import annotations

import difflib
import functools
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import annotated_types
import pydantic
from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo

from worker.logging import configure_logging, get_logger, is_json_format
from worker.scrub import mask_url, remember_secrets
from worker.settings.config import Settings, get_settings
from worker.settings.rules import ALLOWED

ENV_PREFIX = "COMPACTOR_"
# sysexits' EX_CONFIG: process managers can be told not to restart on it (a restart
# reads the same settings and fails the same way).
EXIT_INVALID_SETTINGS = 78


@dataclass(frozen=True)
class SettingProblem:
    """One invalid value: its variable, the value as set (secrets masked), what is wrong
    and what is allowed."""

    variable: str
    value: str | None
    problem: str
    allowed: str

    @property
    def line(self) -> str:
        shown = "" if self.value is None else f"={self.value!r}"
        allowed = f"; allowed: {self.allowed}" if self.allowed else ""
        return f"{self.variable}{shown}: {self.problem}{allowed}"


class InvalidSettings(Exception):
    """The settings cannot be read; ``problems`` holds one line's worth each."""

    def __init__(self, problems: tuple[SettingProblem, ...]) -> None:
        super().__init__("; ".join(problem.line for problem in problems))
        self.problems = problems


@dataclass(frozen=True)
class UnknownVariable:
    """A ``COMPACTOR_*`` variable no setting reads, and the setting it most resembles."""

    variable: str
    closest: str | None


def load_settings() -> Settings:
    """The process's settings (read once); InvalidSettings when a value is wrong."""
    try:
        return get_settings()
    except pydantic.ValidationError as error:
        raise InvalidSettings(settings_problems(error, os.environ)) from None


def settings_problems(error: pydantic.ValidationError,
                      environ: Mapping[str, str]) -> tuple[SettingProblem, ...]:
    """One problem per pydantic error, named by the environment variable that set it."""
    problems = []
    for detail in error.errors(include_url=False):
        field_name = _field_of(detail["loc"])
        problem = detail["msg"].removeprefix("Value error, ")
        if field_name is None:  # a rule across settings: its message names the variables
            problems.append(SettingProblem("settings", None, problem, ""))
            continue
        field = Settings.model_fields[field_name]
        raw = detail.get("input")
        problems.append(SettingProblem(
            _variable_of(field_name, field, environ),
            _shown_value(field_name, raw) if isinstance(raw, str) else None,
            problem,
            ALLOWED.get(field_name) or describe_allowed(field),
        ))
    return tuple(problems)


def unknown_variables(environ: Mapping[str, str]) -> list[UnknownVariable]:
    """The ``COMPACTOR_*`` variables in ``environ`` that no setting reads."""
    known = known_variables()
    # Compared without the shared prefix, which would make every name look alike.
    suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known
                      if name.startswith(ENV_PREFIX))
    unknown = sorted(name for name in environ
                     if name.upper().startswith(ENV_PREFIX) and name.upper() not in known)
    return [UnknownVariable(name, _closest(name.upper().removeprefix(ENV_PREFIX), suffixes))
            for name in unknown]


def _closest(suffix: str, suffixes: list[str]) -> str | None:
    matches = difflib.get_close_matches(suffix, suffixes, n=1, cutoff=0.6)
    return f"{ENV_PREFIX}{matches[0]}" if matches else None


def known_variables() -> set[str]:
    """Every variable a setting reads, upper-cased (aliases such as OPENAI_API_KEY too)."""
    names = set()
    for field_name, field in Settings.model_fields.items():
        names.add(f"{ENV_PREFIX}{field_name}".upper())
        if isinstance(field.validation_alias, AliasChoices):
            names.update(str(choice).upper() for choice in field.validation_alias.choices)
    return names


def describe_allowed(field: FieldInfo) -> str:
    """What a field accepts, from its type and bounds ("a number above 0, at most 1")."""
    annotation = field.annotation
    optional = type(None) in typing.get_args(annotation)
    if optional:
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        text = "one of " + ", ".join(str(member.value) for member in annotation)
    elif annotation is bool:
        text = "true or false (also 1/0, yes/no, on/off)"
    else:
        kinds = {int: "a whole number", float: "a number", Path: "a path", str: "text",
                 SecretStr: "text"}
        text = kinds.get(annotation, "a value") if isinstance(annotation, type) else "a value"
        bounds = [bound for bound in map(_bound, field.metadata) if bound]
        text += (" " + " and ".join(bounds)) if bounds else ""
    return text + (", or unset" if optional else "")


def _bound(metadata: Any) -> str | None:
    for kind, attribute, words in ((annotated_types.Gt, "gt", "above"),
                                   (annotated_types.Ge, "ge", "at least"),
                                   (annotated_types.Lt, "lt", "below"),
                                   (annotated_types.Le, "le", "at most")):
        if isinstance(metadata, kind):
            return f"{words} {getattr(metadata, attribute)}"
    return None


def _field_of(loc: tuple[int | str, ...]) -> str | None:
    if not loc:
        return None
    name = str(loc[0])
    if name in Settings.model_fields:
        return name
    for field_name, field in Settings.model_fields.items():  # reported by its alias
        if isinstance(field.validation_alias, AliasChoices) and name.upper() in {
                str(choice).upper() for choice in field.validation_alias.choices}:
            return field_name
    return None


def _variable_of(field_name: str, field: FieldInfo, environ: Mapping[str, str]) -> str:
    """The variable the value came from: the first alias set, else COMPACTOR_<NAME>."""
    names = [f"{ENV_PREFIX}{field_name}".upper()]
    if isinstance(field.validation_alias, AliasChoices):
        names = [str(choice).upper() for choice in field.validation_alias.choices]
    present = {name.upper() for name in environ}
    return next((name for name in names if name in present), names[0])


def _shown_value(field_name: str, raw: str) -> str:
    if field_name == "llm_api_key":
        return "***"
    return mask_url(raw) if "://" in raw else raw


def settings_or_exit() -> Settings:
    """The settings, with their secrets held for the scrubber (logs, command-line output),
    logging configured from them and unknown variables warned about once; on invalid
    settings, every problem reported and exit 78 (no traceback)."""
    try:
        settings = load_settings()
    except InvalidSettings as invalid:
        report_invalid_settings(invalid)
        raise SystemExit(EXIT_INVALID_SETTINGS) from None
    remember_secrets(settings.secret_values)
    configure_logging(settings.log_format.value, settings.log_level)
    warn_unknown_variables()
    return settings


def report_invalid_settings(invalid: InvalidSettings) -> None:
    """One ``settings.invalid`` error event per problem, or, on a terminal with console
    logs, one ``error:`` line each (the command line's style)."""
    log_format = os.environ.get(f"{ENV_PREFIX}LOG_FORMAT", "auto").strip().lower()
    if not is_json_format(log_format if log_format in ("json", "console") else "auto"):
        for problem in invalid.problems:
            sys.stderr.write(f"error: {problem.line}\n")
        return
    configure_logging("json")
    for problem in invalid.problems:
        get_logger().error("settings.invalid", variable=problem.variable, value=problem.value,
                           problem=problem.problem, allowed=problem.allowed,
                           message=problem.line)


@functools.cache
def warn_unknown_variables() -> None:
    """A ``settings.unknown_variable`` warning per unknown ``COMPACTOR_*`` variable
    (once per process: the command line and the Celery app both call this)."""
    for unknown in unknown_variables(os.environ):
        hint = f"; did you mean {unknown.closest}?" if unknown.closest else ""
        get_logger().warning("settings.unknown_variable", variable=unknown.variable,
                             closest=unknown.closest,
                             message=f"{unknown.variable} is not a setting and is "
                                     f"ignored{hint}")
