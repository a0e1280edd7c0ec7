"""Credentials out of text that leaves the process: every log record (ours and every
library's), the command line's output and errors, provider error messages before they
reach events or runs rows, and URLs before they are shown.

One rule set: a URL's user-info password, the value of anything whose name says secret
(query parameters, headers, ``key=value`` and JSON pairs), bearer tokens, provider key
shapes, and the secrets this process was configured with, verbatim wherever they appear.
Provider error bodies are the provider's text, not ours (some echo the key they refused),
so ``scrub_secrets`` also redacts token-like runs there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from urllib.parse import unquote

REDACTED = "[redacted]"
MASK = "***"  # a URL's hidden part: the URL stays readable as one
_MIN_SECRET_CHARS = 8  # a configured secret shorter than this is too common a string to hunt

# A name is secret when its last word ends in one of these (api_key, X-Amz-Credential,
# refresh_token, sessionToken, client_secret, sig, Authorization, passwd...).
_SECRET_ENDINGS = re.compile(
    r"(key|token|secret|password|passwd|pwd|pass|sig|signature|credentials?|auth"
    r"|authorization|cookie)$")
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# name, separator (a quote, ':' or '=', a scheme word kept), value.
_NAMED_VALUE = re.compile(
    r"(?<![\w.-])(?P<name>[A-Za-z][\w.-]*)"
    r"(?P<sep>[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token|digest)\s+)?)"
    r"(?P<value>[^\s\"'&#,;)}\]]+)", re.IGNORECASE)
# A ";" that starts the next URL of a list (kombu's Sentinel syntax), not one inside a
# password.
_URL_LIST_SEPARATOR = re.compile(r";(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_QUERY_PAIR = re.compile(
    r"(?P<lead>[?&;])(?P<name>[^=&#;\s]+)=(?P<value>[^&#;\s\"'<>)\]}]*)")
_PATTERNS = (
    # Authorization values in prose: "Bearer abc...".
    re.compile(r"\b(?<=bearer\s)[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    # Provider key shapes: OpenAI sk-/sk-proj-, Anthropic sk-ant-, GitHub, Slack, AWS ids.
    re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{8,}"),
    re.compile(r"\b(ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{16,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    # JSON web tokens.
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
)
# What the patterns above need somewhere in a text: a text without any of these holds
# nothing they would change, and one search spares it their substitutions (the other
# rules need a character of their own: '@' a URL's user info, '=' or ':' a named value).
# Case is ignored only where its pattern ignores it: a case-blind search lowercases
# every character it reads, and every log field passes here.
_MAY_MATCH_PATTERNS = re.compile(
    r"[Bb][Ee][Aa][Rr][Ee][Rr]|[spr]k-|gh[pousr]_|github_pat_|xox|AKIA|eyJ")
# Long runs of mixed letters and digits: keys of providers we do not know by shape.
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9_+/=-]{32,}")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s]*)@")

_remembered: tuple[str, ...] = ()


def remember_secrets(secrets: Iterable[str | None]) -> None:
    """Hold this process's configured secrets: every later scrub removes them verbatim."""
    global _remembered
    _remembered = tuple(sorted({s for s in secrets if s and len(s) >= _MIN_SECRET_CHARS},
                               key=len, reverse=True))


def is_secret_name(name: str) -> bool:
    """True when a parameter, header or field name says its value is a credential."""
    words = _WORDS.findall(name)
    return bool(words) and bool(_SECRET_ENDINGS.search(words[-1].lower()))


def scrub_text(text: str, *, known: Iterable[str | None] = ()) -> str:
    """Return ``text`` with credentials replaced: the remembered and ``known`` secrets
    verbatim, URL passwords, named secret values, bearer tokens, provider key shapes."""
    for secret in (*_remembered, *known):
        if secret and len(secret) >= _MIN_SECRET_CHARS:
            text = text.replace(secret, REDACTED)
    if "@" in text:
        text = mask_urls(text)
    if "=" in text:
        text = _QUERY_PAIR.sub(_mask_query_value, text)
    if "=" in text or ":" in text:
        text = _NAMED_VALUE.sub(_redact_named_value, text)
    if _MAY_MATCH_PATTERNS.search(text):
        for pattern in _PATTERNS:
            text = pattern.sub(REDACTED, text)
    return text


def scrub_secrets(text: str, *, known: Iterable[str | None] = ()) -> str:
    """Return provider text scrubbed as ``scrub_text`` does, token-like runs redacted too.

    ``known`` are secrets this process holds (the configured API key): removed verbatim
    first, whatever their shape.
    """
    return _TOKEN_LIKE.sub(_redact_if_token, scrub_text(text, known=known))


def scrub_value(value: object) -> object:
    """``value`` with every string in it scrubbed (dicts, lists and tuples walked); any
    other object whose repr holds a credential becomes its scrubbed repr."""
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, dict):
        return {key: scrub_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):  # a named tuple comes back a plain one
        items = [scrub_value(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    if value is None or isinstance(value, bool | int | float):
        return value
    shown = repr(value)
    scrubbed = scrub_text(shown)
    return value if scrubbed == shown else scrubbed


def mask_url(url: str) -> str:
    """Return ``url`` with the password of its user info and its secret query values
    hidden, however they are written.

    The user info runs to the last ``@`` in the URL, so a password holding ``/``, ``@``,
    ``:`` or percent escapes is hidden whole. A ``;``-joined list (Sentinel's
    ``sentinel://…;sentinel://…``) has each of its URLs masked.
    """
    if len(urls := _URL_LIST_SEPARATOR.split(url)) > 1:
        return ";".join(mask_url(one) for one in urls)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, host_and_path = rest.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:{MASK}@{host_and_path}"
    return _QUERY_PAIR.sub(_mask_query_value, f"{scheme}://{rest}")


def mask_urls(text: str) -> str:
    """Return ``text`` with every URL's user-info password hidden (``mask_url``)."""
    return _USERINFO.sub(lambda m: mask_url(m.group(0)), text)


def url_secrets(url: str | None) -> Iterator[str]:
    """The secrets a URL holds (its password, its secret query values), as written and
    percent-decoded: what ``remember_secrets`` needs to find them in any text."""
    if not url:
        return
    if len(urls := _URL_LIST_SEPARATOR.split(url)) > 1:
        for one in urls:
            yield from url_secrets(one)
        return
    rest = url.partition("://")[2]
    userinfo, at, _ = rest.rpartition("@")
    values = [userinfo.split(":", 1)[1]] if at and ":" in userinfo else []
    values += [m["value"] for m in _QUERY_PAIR.finditer(url) if is_secret_name(m["name"])]
    for value in values:
        yield from {value, unquote(value)}


def _redact_named_value(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]) or match["value"] in (MASK, REDACTED):
        return match.group(0)
    return f"{match['name']}{match['sep']}{REDACTED}"


def _mask_query_value(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]) or not match["value"]:
        return match.group(0)
    return f"{match['lead']}{match['name']}={MASK}"


def _redact_if_token(match: re.Match[str]) -> str:
    """Keep long words and paths (``/usr/local/...``); redact runs that mix digits and
    letters of both cases, as generated keys do."""
    run = match.group(0)
    kinds = sum((any(c.isdigit() for c in run), any(c.islower() for c in run),
                 any(c.isupper() for c in run)))
    return REDACTED if kinds == 3 else run
