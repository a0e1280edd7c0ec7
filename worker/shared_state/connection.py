"""The one way the service opens a redis-py client: a plain ``redis://``, ``rediss://`` or
``unix://`` URL, or Sentinel's ``sentinel://`` URLs (kombu's syntax, so the broker and the
fleet state read one setting alike), where the client follows the master Sentinel names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import redis
from pydantic import SecretStr
from redis.sentinel import Sentinel

SENTINEL_DEFAULT_PORT = 26379  # kombu's SentinelTransport reads a port-less URL the same


class RedisSource(Protocol):
    """Where Redis is: the settings' fields, read structurally (``Settings`` has them)."""

    @property
    def redis_url(self) -> str: ...

    @property
    def redis_sentinel_master(self) -> str | None: ...

    @property
    def redis_sentinel_password(self) -> SecretStr | None: ...

    @property
    def redis_socket_timeout_s(self) -> float: ...


@dataclass(frozen=True)
class SentinelAddress:
    """What a ``sentinel://`` URL list names: the sentinels, and the master's database and
    credentials (the first URL's, as kombu reads them)."""

    sentinels: tuple[tuple[str, int], ...]
    db: int
    username: str | None
    password: str | None


def read_sentinel_url(url: str) -> SentinelAddress:
    """The sentinels and master credentials of ``sentinel://H:P[/DB];sentinel://H2:P2``."""
    parts = [urlsplit(part) for part in url.split(";") if part]
    first = parts[0]
    db = first.path.strip("/")
    return SentinelAddress(
        sentinels=tuple((part.hostname or "", part.port or SENTINEL_DEFAULT_PORT)
                        for part in parts),
        db=int(db) if db else 0,
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
    )


def connect_redis(source: RedisSource, *, timeout_s: float | None = None,
                  keepalive: bool = False, **options: Any) -> redis.Redis:
    """A client of the settings' Redis: with a Sentinel master named, of the master the
    sentinels name (each command asks again after a failover); connects on first use.

    ``timeout_s`` is the connect and read timeout (the settings' ``redis_socket_timeout_s``
    when None); ``options`` are more of redis-py's connection arguments."""
    timeout = source.redis_socket_timeout_s if timeout_s is None else timeout_s
    sockets = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
               "socket_keepalive": keepalive}
    # Settings hold the master's name exactly when the URL is sentinel://.
    if source.redis_sentinel_master is None:
        return redis.Redis.from_url(source.redis_url, **sockets, **options)
    address = read_sentinel_url(source.redis_url)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py: unannotated
        list(address.sentinels), sentinel_kwargs=sentinel_options(source, sockets), **sockets)
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]  # as above
        source.redis_sentinel_master, redis_class=redis.Redis, db=address.db,
        username=address.username, password=address.password, **options)
    return client


def sentinel_options(source: RedisSource, sockets: dict[str, Any]) -> dict[str, Any]:
    """The connection arguments of the sentinels themselves (kombu's ``sentinel_kwargs``):
    the sockets' timeouts, and their password when they require one."""
    password = source.redis_sentinel_password
    return {**sockets, **({"password": password.get_secret_value()} if password else {})}
