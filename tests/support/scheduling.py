"""Building blocks of the scheduler tests: sessions with chosen figures, and a Celery app
and Redis client isolated under a per-test key prefix and queue."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine, update

from db import NewMessage, Store
from db.models import SessionRow
from scheduler.selection import DueSession, ScanPolicy, StopReason, preview_scan
from worker.broker.celery_app import create_app
from worker.settings.config import Settings

REDIS_URL = "redis://127.0.0.1:6379/0"
LONG_AGO = timedelta(days=1)


def put_session(store: Store, engine: Engine, session_id: str, projection_tokens: int, *,
                now: datetime, since_tokens: int | None = None, compacted: bool = False,
                **columns: Any) -> None:
    """Import a session of one message worth ``projection_tokens``, appended a day before
    ``now``, then set ``tokens_since_compaction`` and any other column directly;
    ``compacted`` marks it compacted two days before ``now`` (only then can it be dirty)."""
    message = NewMessage({"role": "user", "content": f"hello from {session_id}"}, "user",
                         None, projection_tokens)
    store.import_session(session_id, {}, [message], now - LONG_AGO)
    values = {"tokens_since_compaction": projection_tokens if since_tokens is None
              else since_tokens,
              "last_compacted_at": now - 2 * LONG_AGO if compacted else None, **columns}
    with engine.begin() as conn:
        conn.execute(update(SessionRow).where(SessionRow.session_id == session_id)
                     .values(**values))


def session_row(engine: Engine, session_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(SessionRow.__table__.select()
                            .where(SessionRow.session_id == session_id)).one()


@dataclass(frozen=True)
class Broker:
    """A Celery app, its settings and a Redis client, all under one test's prefix."""

    settings: Settings
    app: Celery
    client: redis.Redis

    @property
    def prefix(self) -> str:
        return self.settings.redis_key_prefix

    @property
    def queue(self) -> str:
        return self.settings.queue_name


@contextmanager
def isolated_broker(database_url: str, **overrides: Any) -> Iterator[Broker]:
    """A per-test key prefix and queue; every key under the prefix is deleted after."""
    tag = uuid.uuid4().hex[:10]
    settings = Settings(database_url=database_url, redis_url=REDIS_URL,
                        redis_key_prefix=f"test-{tag}:", queue_name=f"compaction-{tag}",
                        **overrides)
    app = create_app(settings)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield Broker(settings, app, client)
    finally:
        keys = list(client.scan_iter(match=f"{settings.redis_key_prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
        app.close()


def scan_takes(store: Store, policy: ScanPolicy, now: datetime, *, limit: int | None = None
               ) -> tuple[list[DueSession], StopReason]:
    """The sessions one scan at ``now`` would take and why it would stop, as
    ``compactor scan --dry-run`` shows them."""
    preview = preview_scan(store, policy, now, limit=limit)
    return preview.sessions, preview.stopped
