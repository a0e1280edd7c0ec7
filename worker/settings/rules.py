"""The checks of settings values that a type alone cannot express: cron expressions, log
levels and URLs. Each raises ValueError saying what is wrong; ``ALLOWED`` says, per
setting, what is accepted (the one-line errors of ``worker.settings.errors`` quote it).

A cron expression is read by Celery's own parser, the one beat reads it with (croniter
reads other dialects: six fields, ``@daily``, ``L``, ``#``, 7 for Sunday), a database URL
by SQLAlchemy's. Redis and HTTP URLs keep ``urlsplit``: pydantic's URL types parse as
browsers do (``http:///v1`` gets the host ``v1``, which the SDK reads as no host), and
redis-py's reader ignores a missing host or a path that is no database number.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from celery.schedules import crontab

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
CRON_ALLOWED = ("five fields 'minute hour day-of-month month day-of-week' separated by "
                "single spaces, e.g. '0 2 * * *' (UTC)")
DATABASE_URL_ALLOWED = "a sqlite:///PATH or postgresql+psycopg://USER@HOST/DB URL"
REDIS_URL_ALLOWED = ("a redis://HOST[:PORT]/DB, rediss://… or unix://PATH URL, or "
                     "sentinel://HOST[:PORT][/DB] URLs joined by ';'")
HTTP_URL_ALLOWED = "an http:// or https:// URL with a host, e.g. https://api.openai.com/v1"

ALLOWED = {
    "log_level": ", ".join(LOG_LEVELS) + " (any case)",
    "scan_cron": CRON_ALLOWED,
    "gc_cron": CRON_ALLOWED + ", or unset",
    "database_url": DATABASE_URL_ALLOWED,
    "redis_url": REDIS_URL_ALLOWED,
    "llm_base_url": HTTP_URL_ALLOWED,
}

def check_log_level(value: str) -> str:
    """The level's standard name, upper-cased."""
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"{value!r} is not a log level")
    return level


def check_cron(expression: str) -> str:
    """The expression, when Celery's ``crontab.from_string`` reads it."""
    fields = len(expression.split(" "))
    if fields != 5:
        raise ValueError(f"a cron expression has 5 fields, {expression!r} has {fields}")
    try:
        crontab.from_string(expression)
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None
    return expression


def check_database_url(url: str) -> str:
    """A SQLite or PostgreSQL URL as SQLAlchemy's ``make_url``, the store's reader, reads it."""
    # Loaded only where a database URL is set, by processes that connect with SQLAlchemy.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError("not a sqlite:/// or postgresql:// URL") from None
    except ValueError:
        raise ValueError("the port is not a number") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql", "postgres"):
        raise ValueError("not a sqlite:/// or postgresql:// URL")
    if "@" in (parsed.host or ""):
        # The driver would read the host from inside the password and fail obscurely.
        raise ValueError("an @ in the user name or password must be percent-encoded (%40)")
    return url


def is_sentinel_url(url: str) -> bool:
    """True for kombu's Sentinel syntax, ``sentinel://H:P;sentinel://H2:P2``."""
    return urlsplit(url.split(";", 1)[0]).scheme == "sentinel"


def check_redis_url(url: str) -> str:
    if is_sentinel_url(url):
        for part in url.split(";"):
            if urlsplit(part).scheme != "sentinel":
                raise ValueError("every URL of a sentinel list is sentinel://HOST[:PORT]")
            _check_redis_part(part)
        return url
    if ";" in url:
        raise ValueError("only sentinel:// URLs form a list")
    return _check_redis_part(url)


def _check_redis_part(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix", "sentinel"):
        raise ValueError("not a redis://, rediss://, unix:// or sentinel:// URL")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError("the URL names no host")
    if parts.scheme != "unix" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise ValueError("the path must be the database number, e.g. /0")
    _check_port(url)
    return url


def check_http_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("not an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("the URL names no host")
    _check_port(url)
    return url


def _check_port(url: str) -> None:
    try:
        urlsplit(url).port  # noqa: B018 - reading it validates it
    except ValueError:
        raise ValueError("the port is not a number from 0 to 65535") from None
