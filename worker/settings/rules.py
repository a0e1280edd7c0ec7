"""The checks of settings values that a type alone cannot express: cron expressions, log
levels and URLs. Each raises ValueError saying what is wrong; ``ALLOWED`` says, per
setting, what is accepted (the one-line errors of ``worker.settings.errors`` quote it).

Pure and cheap: every process validates its settings at start, and Celery's own cron
parser costs a third of a second to import, so the cron rule is written out here (a
unit test holds it to Celery's parser, which beat uses).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
CRON_ALLOWED = ("five fields 'minute hour day-of-month month day-of-week' separated by "
                "single spaces, e.g. '0 2 * * *' (UTC)")
DATABASE_URL_ALLOWED = "a sqlite:///PATH or postgresql+psycopg://USER@HOST/DB URL"
REDIS_URL_ALLOWED = "a redis://HOST[:PORT]/DB, rediss://… or unix://PATH URL"
HTTP_URL_ALLOWED = "an http:// or https:// URL with a host, e.g. https://api.openai.com/v1"

ALLOWED = {
    "log_level": ", ".join(LOG_LEVELS) + " (any case)",
    "scan_cron": CRON_ALLOWED,
    "gc_cron": CRON_ALLOWED + ", or unset",
    "database_url": DATABASE_URL_ALLOWED,
    "redis_url": REDIS_URL_ALLOWED,
    "llm_base_url": HTTP_URL_ALLOWED,
}

# (name, lowest, highest, names of the values) per field, in cron order.
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_CRON_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
_CRON_PART = re.compile(r"^(?:\*|(?P<low>\w+)(?:-(?P<high>\w+))?)(?:/(?P<step>\d+))?$")
_SUPPORTED_DATABASE = re.compile(r"^(sqlite|postgresql|postgres)(\+\w+)?://")


def check_log_level(value: str) -> str:
    """The level's standard name, upper-cased."""
    level = value.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"{value!r} is not a log level")
    return level


def check_cron(expression: str) -> str:
    """The expression, when Celery's ``crontab.from_string`` reads it as meant."""
    fields = expression.split(" ")
    if len(fields) != len(_CRON_FIELDS):
        raise ValueError(f"a cron expression has 5 fields, {expression!r} has {len(fields)}")
    for text, (name, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for part in text.split(","):
            _check_cron_part(part, name, low, high, names)
    return expression


def _check_cron_part(part: str, name: str, low: int, high: int, names: tuple[str, ...]) -> None:
    match = _CRON_PART.match(part)
    if match is None:
        raise ValueError(f"the {name} field has {part!r}, not *, N, N-M or one with /STEP")
    if match["step"] is not None and int(match["step"]) < 1:
        raise ValueError(f"the {name} field's step in {part!r} must be at least 1")
    for bound in (match["low"], match["high"]):
        if bound is not None:
            _cron_value(bound, name, low, high, names)


def _cron_value(text: str, name: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.isdigit():
        value = int(text)
    elif text[:3].lower() in names:
        value = names.index(text[:3].lower()) + low
    else:
        raise ValueError(f"the {name} field has {text!r}, not a number")
    if not low <= value <= high:
        raise ValueError(f"the {name} field has {value}, outside {low}-{high}")
    return value


def check_database_url(url: str) -> str:
    """A SQLite or PostgreSQL URL the driver reads as written."""
    if not _SUPPORTED_DATABASE.match(url):
        raise ValueError("not a sqlite:/// or postgresql:// URL")
    authority_and_path = url.partition("://")[2].partition("?")[0]
    if "@" in authority_and_path.rpartition("@")[0]:
        # The driver would read the host from inside the password and fail obscurely.
        raise ValueError("an @ in the user name or password must be percent-encoded (%40)")
    return url  # SQLAlchemy reads the rest (a password may hold / and :)


def check_redis_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("not a redis://, rediss:// or unix:// URL")
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
