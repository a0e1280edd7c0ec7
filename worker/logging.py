"""structlog configured once per process: contextvars first, ISO UTC timestamps, JSON
when stderr is not a TTY and a console renderer when it is. Every job ends in one
``compaction.job`` event (see README, "Outcome events")."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO, cast

import structlog

JOB_EVENT = "compaction.job"


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    """Configure structlog (and stdlib logging) for this process; idempotent."""
    use_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=False,
    )


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger() -> Any:
    return structlog.get_logger("compactor")
