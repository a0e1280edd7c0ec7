"""Logging configured once per process: structlog rendered through the standard library,
so our events and the records of Celery, alembic and the HTTP client leave as one JSON
object per line on stderr (a console renderer on a terminal), each scrubbed of
credentials on the way out. Every job ends in one ``compaction.job`` event (see README,
"Outcome events")."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from worker.compaction import escape_controls
from worker.scrub import scrub_value

JOB_EVENT = "compaction.job"
_HANDLER_NAME = "compactor"
# billiard's pool logger (Celery's prefork pool) never propagates to the root logger; it
# gets the handler itself, at Celery's own level for it (its notes below are chatter).
_POOL_LOGGER, _POOL_LEVEL = "multiprocessing", logging.ERROR

# Run on our events and on foreign records alike, before the renderer.
_SHARED_PROCESSORS: tuple[Processor, ...] = (
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
)


def is_json_format(log_format: str) -> bool:
    """True when ``log_format`` renders JSON here (``auto``: stderr is not a terminal)."""
    return log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    """Route structlog through the root logger and give the root one stderr handler.

    Idempotent: a second call replaces this module's handler, and leaves any other
    handler (a test runner's capture) in place.
    """
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED_PROCESSORS,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(_CurrentStderr())
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(_build_formatter(is_json_format(log_format)))
    root, pool = logging.getLogger(), logging.getLogger(_POOL_LOGGER)
    for logger in (root, pool):
        for existing in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
            logger.removeHandler(existing)
        logger.addHandler(handler)
    root.setLevel(level.upper())
    pool.setLevel(_POOL_LEVEL)
    _skip_unrendered_record_fields()
    # Python's warnings (Celery's root-user notice, deprecations) become log records too.
    logging.captureWarnings(True)


def _skip_unrendered_record_fields() -> None:
    """No record gathers its caller, thread or process: neither renderer writes them, and
    every record (ours are two: the event's and the formatter's copy of it) paid a frame
    walk and three look-ups for them (the logging HOWTO's "Optimization" switches)."""
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def _build_formatter(use_json: bool) -> structlog.stdlib.ProcessorFormatter:
    # JSON escapes control characters itself; console lines are written as they are.
    finishing: list[Processor] = [structlog.processors.JSONRenderer()] if use_json else [
        escape_event_controls, structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    # Every record, ours or a library's, passes here with its message formatted and its
    # traceback as text (one string field: a JSON record stays on one line), so the
    # scrubber sees all of it just before it is rendered.
    return structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=list(_SHARED_PROCESSORS),
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, scrub_event, *finishing],
    )


# Fields this module's own processors write (a clock reading, a level name): no credential.
_OWN_FIELDS = frozenset({"timestamp", "level"})


def scrub_event(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Credentials out of every field of a record (``worker/scrub.py``'s rules)."""
    return {key: value if key in _OWN_FIELDS else scrub_value(value)
            for key, value in event_dict.items()}


def escape_event_controls(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """Control characters of every text field escaped, line by line (a traceback keeps
    its lines): a stored id cannot drive the terminal a console log is read on."""
    return {key: "\n".join(map(escape_controls, value.split("\n")))
            if isinstance(value, str) else value for key, value in event_dict.items()}


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time (test runners swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger() -> Any:
    return structlog.get_logger("compactor")
