"""Keeping tests apart from the process-wide logging a command or test configures."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import structlog


@contextmanager
def preserved_logging() -> Iterator[None]:
    """Restore what ``configure_logging`` changes: handlers and levels, structlog's
    configuration, warnings capture."""
    loggers = [logging.getLogger(name) for name in (None, "multiprocessing", "alembic")]
    saved = [(list(logger.handlers), logger.level, logger.propagate) for logger in loggers]
    config = structlog.get_config()
    try:
        yield
    finally:
        for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
        structlog.configure(**config)
        logging.captureWarnings(False)
