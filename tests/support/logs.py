"""Keeping tests apart from the process-wide logging a command or test configures."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

_RECORD_FIELD_SWITCHES = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")


@contextmanager
def preserved_logging() -> Iterator[None]:
    """Restore what ``configure_logging`` changes: handlers and levels, structlog's
    configuration, warnings capture, which fields records gather."""
    loggers = [logging.getLogger(name) for name in (None, "multiprocessing", "alembic")]
    saved = [(list(logger.handlers), logger.level, logger.propagate) for logger in loggers]
    config = structlog.get_config()
    record_fields = {name: getattr(logging, name) for name in _RECORD_FIELD_SWITCHES}
    try:
        yield
    finally:
        for name, value in record_fields.items():
            setattr(logging, name, value)
        for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
        structlog.configure(**config)
        logging.captureWarnings(False)
