"""The planted facts' values and the noise around them: identifiers of every kind the
fidelity benchmark checks, drawn per seed from a grammar (random segment counts,
separators, prefixes and wordings), so a rule tuned to one format fails it. Values are
unique per session and none occurs inside another (``ValueFactory`` refuses a draw that
would), so "the value occurs in the projection" means "this fact is kept".
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Callable

CODING_KINDS = ("path", "error", "version", "ticket", "hash")
CUSTOMER_KINDS = ("order_id", "user_id", "payment_id", "email", "phone", "uuid")

# How each kind reads in prose (one wording drawn per mention), and under which key a
# tool call passes it.
WORDINGS = {
    "path": ("the file {}", "{}", "the module at {}", "{} (the config)"),
    "error": ("the error {}", "{}", "error code {}", "a {} failure"),
    "version": ("the pinned version {}", "{}", "the requirement {}", "{} as pinned"),
    "ticket": ("ticket {}", "{}", "issue {}", "{} (the bug report)"),
    "hash": ("commit {}", "revision {}", "{}", "the change {}"),
    "order_id": ("order #{}", "order {}", "order number {}", "the order {}"),
    "user_id": ("user id {}", "the account {}", "customer {}", "user {}"),
    "payment_id": ("payment method {}", "the card {}", "{} (payment)", "payment {}"),
    "email": ("the email {}", "{}", "the address {}", "mail to {}"),
    "phone": ("the phone number {}", "{}", "phone {}", "the line {}"),
    "uuid": ("request id {}", "trace {}", "{}", "the request {}"),
}
# A bare number is only a fact where its wording names it.
_LABELLED_WORDINGS = {"order_id": ("order {}", "order number {}", "the order {}")}
ARGUMENT_KEYS = {
    "path": "path", "error": "error_code", "version": "requirement", "ticket": "ticket",
    "hash": "commit", "order_id": "order_id", "user_id": "user_id",
    "payment_id": "payment_method_id", "email": "email", "phone": "phone", "uuid": "request_id",
}

# No name below ends another name of its list, so noise never holds a planted value.
_FIRST = ("mia", "noah", "olivia", "liam", "yusuf", "chen", "sofia", "omar", "priya", "lucas")
_LAST = ("garcia", "kim", "nguyen", "patel", "silva", "kowalski", "okafor", "rossi")
_MODULES = ("billing", "ledger", "ingest", "search", "auth", "webhooks", "exports")
_NOISE_NAMES = ("queue", "cache", "worker", "batch", "buffer", "item", "node", "slot")
_NOISE_VERBS = ("fetch", "merge", "flush", "retry", "drain", "apply")
_PAYMENT_WORDS = ("credit_card", "paypal", "gift_card", "pm", "card", "bank", "wallet", "acct")


class ValueFactory:
    """Draws fresh values per kind: a value is never drawn twice, and never one that
    holds or sits inside a value drawn before."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._taken: set[str] = set()

    def new(self, kind: str) -> str:
        """Return a value of ``kind`` not drawn before, none inside another."""
        while True:
            value = _DRAW[kind](self._rng)
            if value not in self._taken and not any(
                    value in taken or taken in value for taken in self._taken):
                self._taken.add(value)
                return value

    def phrase(self, kind: str, value: str) -> str:
        """One of the kind's wordings around ``value``."""
        wordings = _LABELLED_WORDINGS.get(kind) if value.isdigit() else None
        return self._rng.choice(wordings or WORDINGS[kind]).format(value)


# --- the grammar: segments, separators, prefixes ------------------------------------

def _letters(rng: random.Random, low: int, high: int,
             alphabet: str = string.ascii_uppercase) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def _digits(rng: random.Random, low: int, high: int) -> str:
    """A number of ``low`` to ``high`` digits, the first not zero."""
    width = rng.randint(low, high)
    return str(rng.randint(10 ** (width - 1), 10 ** width - 1))


def _word(rng: random.Random) -> str:
    return _letters(rng, 3, 8, string.ascii_lowercase)


def _joined(rng: random.Random, parts: list[str], separators: str) -> str:
    separator = rng.choice(separators)
    return separator.join(parts)


def _path(rng: random.Random) -> str:
    depth = rng.randint(2, 5)
    parts = [_joined(rng, [_word(rng) for _ in range(rng.randint(1, 2))], "_-")
             for _ in range(depth)]
    if depth == 2 or rng.random() < 0.7:
        parts[-1] += "." + _letters(rng, 1, 4, string.ascii_lowercase)
    # No Windows path: JSON arguments escape its backslashes, so it is never verbatim.
    return rng.choice(("", "", "/", "./", "~/", "../")) + "/".join(parts)


def _error(rng: random.Random) -> str:
    form = rng.randrange(5)
    if form == 0:  # a lettered number with worded segments: E1234-SCHEMA-LOCK
        head = _letters(rng, 1, 4) + _digits(rng, 3, 5)
        tail = [_letters(rng, 2, 8) for _ in range(rng.randint(0, 3))]
        return _joined(rng, [head, *tail], "-_.:")
    if form == 1:  # a constant: ERR_CONN_RESET
        words = [_letters(rng, 3, 8) for _ in range(rng.randint(1, 3))]
        return _joined(rng, [rng.choice(("ERR", "ERROR", "E")), *words], "_")
    if form == 2:  # a status
        return f"{rng.choice(('HTTP', 'HTTP/1.1', 'HTTP/2', 'status'))} {rng.randint(400, 599)}"
    if form == 3:  # hex: 0x8007000E
        return "0x" + _letters(rng, 4, 8, rng.choice(("0123456789ABCDEF", "0123456789abcdef")))
    # dotted: KX.404.17, ORA-12541
    segments = [_digits(rng, 1, 5) for _ in range(rng.randint(1, 3))]
    return _joined(rng, [_letters(rng, 2, 4), *segments], ".-")


def _version(rng: random.Random) -> str:
    name = _joined(rng, [_word(rng) for _ in range(rng.randint(1, 2))], "-_")
    if rng.random() < 0.15:
        name = f"@{_word(rng)}/{name}"
    number = ".".join(_digits(rng, 1, 2) for _ in range(rng.randint(2, 4)))
    number = rng.choice(("", "", "v")) + number + rng.choice(
        ("", "", "", "rc1", "-beta.2", ".post3", "b4", f"-{_word(rng)}"))
    separator = rng.choice(("==", ">=", "~=", "@", "@^", "@~", "-", "/", ":", "=="))
    return f"{name}{separator}{number}"


def _ticket(rng: random.Random) -> str:
    form = rng.randrange(4)
    if form == 0:  # #W9502127
        return "#" + _letters(rng, 1, 3) + _digits(rng, 5, 9)
    prefix = _letters(rng, 2, 6)
    if rng.random() < 0.2:
        prefix = prefix.lower()
    segments = [_digits(rng, 1, 6) for _ in range(rng.randint(1, 3))]
    return _joined(rng, [prefix, *segments], "-_.:" if form < 3 else "-")


def _hash(rng: random.Random) -> str:
    while True:
        value = f"{rng.getrandbits(160):040x}"[: rng.randint(7, 40)]
        # A hash that is all digits or all letters reads as something else.
        if any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
            return value.upper() if rng.random() < 0.15 else value


def _order(rng: random.Random) -> str:
    form = rng.randrange(4)
    if form == 0:
        return rng.choice(string.ascii_uppercase) + _digits(rng, 6, 9)
    if form == 1:
        return _joined(rng, [_letters(rng, 2, 5), _digits(rng, 5, 10)], "-_")
    if form == 2:
        return _digits(rng, 9, 12)  # a bare number: its wording names it
    return _letters(rng, 6, 10, string.ascii_uppercase + string.digits) + _digits(rng, 1, 2)


def _user(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return _joined(rng, [rng.choice(("usr", "user", "u", "cust")),
                             _letters(rng, 5, 10, string.ascii_lowercase + string.digits)
                             + _digits(rng, 1, 2)], "_-")
    names = [rng.choice(_FIRST), *([rng.choice(_LAST)] * rng.randint(0, 1))]
    return _joined(rng, [*names, _digits(rng, 2, 6)], "_.-")


def _payment(rng: random.Random) -> str:
    word = rng.choice(_PAYMENT_WORDS)
    if rng.random() < 0.35:
        alphabet = string.ascii_letters + string.digits
        return word.split("_")[0] + "_" + _letters(rng, 10, 24, alphabet) + _digits(rng, 1, 2)
    return _joined(rng, [word, *(_digits(rng, 3, 8) for _ in range(rng.randint(1, 2)))], "_-")


def _email(rng: random.Random) -> str:
    local = _joined(rng, [rng.choice(_FIRST), *([rng.choice(_LAST)] * rng.randint(0, 2))],
                    "._+-") + _digits(rng, 1, 4)
    domain = ".".join([_word(rng) for _ in range(rng.randint(1, 3))]
                      + [rng.choice(("com", "org", "net", "io", "co.uk"))])
    return f"{local}@{domain}"


def _phone(rng: random.Random) -> str:
    country = f"+{_digits(rng, 1, 3)}"
    groups = [_digits(rng, 2, 4) for _ in range(rng.randint(2, 4))]
    while sum(map(len, groups)) < 7:  # a dialable number
        groups.append(_digits(rng, 2, 4))
    if rng.random() < 0.3:
        return f"({_digits(rng, 3, 3)}) {_digits(rng, 3, 3)}-{_digits(rng, 4, 4)}"
    return _joined(rng, [country, *groups], " -.")


def _uuid(rng: random.Random) -> str:
    value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return value.upper() if rng.random() < 0.2 else value


_DRAW: dict[str, Callable[[random.Random], str]] = {
    "path": _path, "error": _error, "version": _version, "ticket": _ticket,
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
