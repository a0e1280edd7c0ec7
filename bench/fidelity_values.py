"""The planted facts' values and the noise around them: identifiers of every kind the
fidelity benchmark checks, unique per session and none inside another (fixed widths and
suffix-free name lists), so "the value occurs in the projection" means "this fact is kept".
"""

from __future__ import annotations

import random
import uuid

CODING_KINDS = ("path", "error", "version", "ticket", "hash")
CUSTOMER_KINDS = ("order_id", "user_id", "payment_id", "email", "phone", "uuid")

# How each kind reads in prose, and under which key a tool call passes it.
PHRASES = {
    "path": "the file {}", "error": "the error {}", "version": "the pinned version {}",
    "ticket": "ticket {}", "hash": "commit {}", "order_id": "order #{}",
    "user_id": "user id {}", "payment_id": "payment method {}", "email": "the email {}",
    "phone": "the phone number {}", "uuid": "request id {}",
}
ARGUMENT_KEYS = {
    "path": "path", "error": "error_code", "version": "requirement", "ticket": "ticket",
    "hash": "commit", "order_id": "order_id", "user_id": "user_id",
    "payment_id": "payment_method_id", "email": "email", "phone": "phone", "uuid": "request_id",
}

# No name below ends another name of its list, so no value can hide inside another.
_FIRST = ("mia", "noah", "olivia", "liam", "yusuf", "chen", "sofia", "omar", "priya", "lucas")
_LAST = ("garcia", "kim", "nguyen", "patel", "silva", "kowalski", "okafor", "rossi")
_PACKAGES = ("fastapi", "pydantic", "sqlalchemy", "celery", "httpx", "numpy", "boto3",
             "django", "uvicorn", "tiktoken", "psycopg", "alembic")
_TOPS = ("src", "services", "lib", "tests", "deploy")
_MODULES = ("billing", "ledger", "ingest", "search", "auth", "webhooks", "exports")
_EXTENSIONS = ("py", "ts", "yaml", "sql", "toml")
_ERROR_WORDS = ("SCHEMA", "TIMEOUT", "LOCKED", "DENIED", "QUOTA", "PARSE")
_ERR_NAMES = ("CONN_RESET", "DISK_FULL", "AUTH_EXPIRED", "CACHE_STALE", "PEER_LOST",
              "LOCK_TIMEOUT", "TLS_HANDSHAKE", "QUEUE_OVERFLOW")
_HTTP_CODES = ("HTTP 500", "HTTP 502", "HTTP 503", "HTTP 504", "HTTP 429", "HTTP 409")
_TICKETS = ("PROJ", "BILL", "INFRA", "CORE", "SRE")
_NOISE_NAMES = ("queue", "cache", "worker", "batch", "buffer", "item", "node", "slot")
_NOISE_VERBS = ("fetch", "merge", "flush", "retry", "drain", "apply")


class ValueFactory:
    """Draws fresh values per kind; a value is never drawn twice."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._taken: set[str] = set()

    def new(self, kind: str) -> str:
        """Return a value of ``kind`` not drawn before."""
        while True:
            value = _DRAW[kind](self._rng)
            if value not in self._taken:
                self._taken.add(value)
                return value


def _path(rng: random.Random) -> str:
    return (f"{rng.choice(_TOPS)}/{rng.choice(_MODULES)}/"
            f"{rng.choice(_NOISE_NAMES)}_{rng.randint(1000, 9999)}.{rng.choice(_EXTENSIONS)}")


def _error(rng: random.Random) -> str:
    form = rng.random()
    if form < 0.12:
        return rng.choice(_HTTP_CODES)
    if form < 0.3:
        return f"ERR_{rng.choice(_ERR_NAMES)}"
    return f"E{rng.randint(1000, 9999)}-{rng.choice(_ERROR_WORDS)}"


def _version(rng: random.Random) -> str:
    name = rng.choice(_PACKAGES)
    if rng.random() < 0.25:
        return f"{name}@^{rng.randint(1, 9)}.{rng.randint(10, 99)}"
    return f"{name}=={rng.randint(1, 9)}.{rng.randint(10, 99)}.{rng.randint(10, 99)}"


def _hash(rng: random.Random) -> str:
    while True:
        value = f"{rng.getrandbits(48):012x}"
        # A hash that is all digits or all letters reads as something else.
        if any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
            return value


def _order(rng: random.Random) -> str:
    prefix = "W" if rng.random() < 0.5 else "ORD-"
    return f"{prefix}{rng.randint(1_000_000, 9_999_999)}"


def _user(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)}_{rng.choice(_LAST)}_{rng.randint(1000, 9999)}"


def _payment(rng: random.Random) -> str:
    form = rng.choice(("credit_card", "paypal", "gift_card", "pm"))
    if form == "pm":
        alphabet = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"
        return "pm_" + "".join(rng.choice(alphabet) for _ in range(14))
    return f"{form}_{rng.randint(1_000_000, 9_999_999)}"


def _email(rng: random.Random) -> str:
    return (f"{rng.choice(_FIRST)}.{rng.choice(_LAST)}{rng.randint(10, 99)}@"
            f"{rng.choice(('example.com', 'mail.example.org', 'shop.example.net'))}")


def _phone(rng: random.Random) -> str:
    area, line = rng.randint(200, 989), rng.randint(1000, 9999)
    return rng.choice((f"+1-{area}-555-{line}", f"({area}) 555-{line}",
                       f"+44 20 7946 {line}"))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


_DRAW = {
    "path": _path, "error": _error, "version": _version, "ticket": lambda rng: (
        f"{rng.choice(_TICKETS)}-{rng.randint(1000, 9999)}"),
    "hash": _hash, "order_id": _order, "user_id": _user, "payment_id": _payment,
    "email": _email, "phone": _phone, "uuid": _uuid,
}


def customer_name(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST).title()} {rng.choice(_LAST).title()}"


def noise_name(rng: random.Random) -> str:
    """A code-local name (``queue_2``, ``cache_17``): identifier-shaped, never a fact."""
    return f"{rng.choice(_NOISE_NAMES)}_{rng.randint(1, 99)}"


def code_line(rng: random.Random) -> str:
    """One line of plausible source code full of code-local names."""
    target, source, other = noise_name(rng), noise_name(rng), noise_name(rng)
    verb = rng.choice(_NOISE_VERBS)
    return rng.choice((
        f"    {target} = {source}.{verb}({other}, timeout={rng.randint(1, 90)})",
        f"    if {source} is None or len({other}) > {rng.randint(2, 500)}:",
        f"        return {target}",
        f"def {rng.choice(_NOISE_VERBS)}_{noise_name(rng)}({source}, {other}):",
        f"    # {rng.choice(_NOISE_VERBS)} {source} before {other} is reused",
    ))


def passing_test_line(rng: random.Random) -> str:
    """One passing line of a test run's output."""
    return (f"tests/test_{rng.choice(_MODULES)}.py::test_{rng.choice(_NOISE_VERBS)}_"
            f"{noise_name(rng)} PASSED [{rng.randint(1, 99):3d}%]")


def catalog_item(rng: random.Random) -> dict[str, object]:
    """One product of an order lookup: ids of its own that are not facts."""
    return {"item_id": str(rng.randint(10**9, 10**10 - 1)),
            "name": rng.choice(("T-Shirt", "Desk Lamp", "Backpack", "Kettle", "Headphones")),
            "price": round(rng.uniform(5, 400), 2),
            "options": {"color": rng.choice(("black", "blue", "red")),
                        "size": rng.choice(("S", "M", "L", "XL"))}}
