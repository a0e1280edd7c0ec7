"""Credentials out of text that leaves the process: provider error messages before they
reach events, runs rows or logs, and URLs before they are shown.

Provider error bodies are the provider's text, not ours: some echo the key they refused
("Incorrect API key provided: sk-..."), a proxy may echo headers or a query string.
Anything that looks like a secret is replaced by ``[redacted]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "[redacted]"
_MIN_SECRET_CHARS = 8  # a configured key shorter than this is too common a string to hunt

_SECRET_NAMES = (r"api[_-]?key|apikey|x-api-key|access[_-]?token|auth[_-]?token|token|secret"
                 r"|password|passwd|pwd|authorization|key")
_PATTERNS = (
    # Authorization values in prose: "Bearer abc..." (a header's are caught below).
    re.compile(r"\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    # key=value and "key": "value" pairs whose name says secret, a scheme word kept.
    re.compile(rf"((?:{_SECRET_NAMES})[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic)\s+)?)"
               r"[^\s\"'&,;}]+", re.IGNORECASE),
    # Provider key shapes: OpenAI sk-/sk-proj-, Anthropic sk-ant-, GitHub, Slack, AWS ids.
    re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\b(ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{16,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    # JSON web tokens.
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
)
# Long runs of mixed letters and digits: keys of providers we do not know by shape.
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_+/=-]{32,}")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s]*)@")


def scrub_secrets(text: str, *, known: Iterable[str | None] = ()) -> str:
    """Return ``text`` with credentials and anything token-like replaced by ``[redacted]``.

    ``known`` are secrets this process holds (the configured API key): removed verbatim
    first, whatever their shape.
    """
    for secret in known:
        if secret and len(secret) >= _MIN_SECRET_CHARS:
            text = text.replace(secret, REDACTED)
    text = mask_urls(text)
    for pattern in _PATTERNS[:2]:
        text = pattern.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    for pattern in _PATTERNS[2:]:
        text = pattern.sub(REDACTED, text)
    return _TOKEN_LIKE.sub(_redact_if_token, text)


def mask_url(url: str) -> str:
    """Return ``url`` with the password of its user info hidden, however it is written.

    The user info runs to the last ``@`` in the URL, so a password holding ``/``, ``@``,
    ``:`` or percent escapes is hidden whole; a ``password=`` query value is hidden too.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host_and_path = rest.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:***@{host_and_path}"
    return re.sub(r"(?i)(password=)[^&#]*", r"\1***", f"{scheme}://{rest}")


def mask_urls(text: str) -> str:
    """Return ``text`` with every URL's user-info password hidden (``mask_url``)."""
    return _USERINFO.sub(lambda m: mask_url(m.group(0)), text)


def _redact_if_token(match: re.Match[str]) -> str:
    """Keep long words and paths (``/usr/local/...``); redact runs that mix digits and
    letters of both cases, as generated keys do."""
    run = match.group(0)
    kinds = sum((any(c.isdigit() for c in run), any(c.islower() for c in run),
                 any(c.isupper() for c in run)))
    return REDACTED if kinds == 3 else run
