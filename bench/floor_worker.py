"""The floor under a pool child's memory: a Celery prefork worker that loads, before its
pool forks, only the libraries the mission fixes (``BENCH_FLOOR_LIBRARIES``, a comma
list of ``LIBRARIES``' names), loaded as the service loads them, and none of the
service's code. ``python -P -m bench.floor_worker <Celery worker options>`` starts it the
way ``compactor worker`` starts the service's (Celery's worker command alone, rich and
pygments kept out), with ``COMPACTOR_REDIS_URL`` as its broker.

Its stderr carries one JSON object per line, as the service's does, so that
``bench.common.BenchWorker`` reads it: Celery's records, and ``worker.ready``.
``bench.memory_bench`` sets the pool child's memory against the service's, and
``bench.task_overhead`` its no-op task against the service's.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery.signals import worker_init, worker_ready

LIBRARIES_VARIABLE = "BENCH_FLOOR_LIBRARIES"


def _load_tokenizer() -> None:
    """o200k_base through tiktoken's own cache (``TIKTOKEN_CACHE_DIR``), without the
    Python dict of its ranks, which the service drops once the encoding is built."""
    import tiktoken

    encoding = tiktoken.get_encoding("o200k_base")
    del encoding._mergeable_ranks


def _load_sdk() -> None:
    """The OpenAI SDK, with a client created and closed: the SDK imports its HTTP stack
    and chat resources only then (the service does the same before its pool forks)."""
    import openai

    openai.OpenAI(api_key="floor", base_url="http://127.0.0.1:9/v1").close()


def _load_sqlalchemy() -> None:
    """SQLAlchemy's Core with the PostgreSQL dialect and its driver, psycopg."""
    from sqlalchemy.engine import make_url

    make_url("postgresql+psycopg://floor@127.0.0.1/floor").get_dialect().import_dbapi()


def _load_orm() -> None:
    importlib.import_module("sqlalchemy.orm")


def _load_support() -> None:
    """The models, settings, logging and Redis client libraries."""
    for name in ("pydantic", "pydantic_settings", "structlog", "redis"):
        importlib.import_module(name)


LIBRARIES: dict[str, Callable[[], None]] = {
    "tokenizer": _load_tokenizer,
    "sdk": _load_sdk,
    "sqlalchemy": _load_sqlalchemy,
    "orm": _load_orm,
    "support": _load_support,
}


def requested_libraries(value: str) -> list[str]:
    """The names in a ``BENCH_FLOOR_LIBRARIES`` value; an unknown one is an error."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = sorted(set(names) - set(LIBRARIES))
    if unknown:
        raise ValueError(f"{LIBRARIES_VARIABLE}: unknown {', '.join(unknown)} "
                         f"(known: {', '.join(LIBRARIES)})")
    return names


class JsonLines(logging.Formatter):
    """One JSON object per record, so the log parses as the service's does."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"event": "celery.log", "level": record.levelname.lower(),
                "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


app = Celery("floor", broker=os.environ.get("COMPACTOR_REDIS_URL", "redis://127.0.0.1:6379/0"))
# The delivery contract the service's app keeps (late acks, one message prefetched, no
# results): a measure of the app's own cost per task, not of a weaker contract's saving.
app.conf.update(worker_hijack_root_logger=False, worker_redirect_stdouts=False,
                broker_connection_retry_on_startup=True, task_acks_late=True,
                task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                task_ignore_result=True)


@app.task(name="bench.noop", bind=True)
def noop(self: Any) -> None:
    """One JSON line per task, as the service's no-op writes one event (bench.task_overhead)."""
    print(json.dumps({"event": "bench.noop", "task_id": self.request.id,
                      "timestamp": datetime.now(UTC).isoformat()}), file=sys.stderr, flush=True)


@worker_init.connect
def _load_before_fork(**_: Any) -> None:
    for name in requested_libraries(os.environ.get(LIBRARIES_VARIABLE, "")):
        LIBRARIES[name]()
    gc.freeze()  # as the service's worker does: the children's collections leave it shared


@worker_ready.connect
def _announce_ready(**_: Any) -> None:
    print(json.dumps({"event": "worker.ready"}), file=sys.stderr, flush=True)


def serve(argv: list[str]) -> None:
    """Celery's worker command alone on this app, as ``worker.broker.serve`` runs the service's.
    An unknown library name stops it here: Celery would only log a signal handler's error."""
    requested_libraries(os.environ.get(LIBRARIES_VARIABLE, ""))
    from worker.broker.serve import keep_out_terminal_only_modules

    keep_out_terminal_only_modules()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.captureWarnings(True)
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker as celery_worker

    celery_worker.main(argv, prog_name="floor worker", standalone_mode=False,
                       obj=CLIContext(app=app, no_color=None, workdir=None, quiet=True))


if __name__ == "__main__":
    serve(sys.argv[1:])
