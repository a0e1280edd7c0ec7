"""Scrubbing: credentials and token-like runs out of provider text, passwords out of URLs
however they are written; ordinary error text left as it was."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker import scrub
from worker.scrub import (
    REDACTED,
    is_secret_name,
    mask_url,
    mask_urls,
    remember_secrets,
    scrub_secrets,
    scrub_text,
    scrub_value,
    url_secrets,
)


@pytest.mark.parametrize("text, secret", [
    ("Incorrect API key provided: sk-abc123DEF456ghi789.", "sk-abc123DEF456ghi789"),
    ("key sk-ant-api03-Zx9_yW8-vU7tS6rQ5 refused", "sk-ant-api03-Zx9_yW8-vU7tS6rQ5"),
    ("Authorization: Bearer eyJhbGciOi.eyJzdWIiOi.c2lnbmF0dXJl", "eyJhbGciOi"),
    ("sent bearer 0123456789abcdef", "0123456789abcdef"),
    ("GET /v1/x?api_key=hunter2hunter2&x=1", "hunter2hunter2"),
    ('{"password": "pa55word"}', "pa55word"),
    ("token=abc%2Fdef; retry", "abc%2Fdef"),
    ("key=k3y-value rejected", "k3y-value"),
    ("a github token ghp_0123456789abcdefABCDEF0123", "ghp_0123456789abcdefABCDEF0123"),
    ("unknown vendor key Q2hlY2tUaGlzT3V0MTIzNDU2Nzg5MGFiY2RlZg", "Q2hlY2tUaGlzT3V0MTIzNDU2"),
    ("proxy at https://bob:p/a@ss@proxy.internal:8080/v1", "p/a@ss"),
])
def test_credentials_and_token_like_runs_are_redacted(text: str, secret: str) -> None:
    scrubbed = scrub_secrets(text)

    assert secret not in scrubbed
    assert REDACTED in scrubbed or "***" in scrubbed


def test_the_configured_key_is_removed_verbatim_whatever_its_shape() -> None:
    scrubbed = scrub_secrets("you sent plain-words-key, which is wrong",
                             known=("plain-words-key", None))

    assert scrubbed == f"you sent {REDACTED}, which is wrong"


@pytest.mark.parametrize("text", [
    "This model's maximum context length is 128000 tokens. However, you requested 130000 "
    "tokens (129000 in the messages, 1000 in the completion).",
    "Rate limit reached for requests. Limit: 500 / min. Please try again in 120ms.",
    "The server had an error while processing your request.",
    "Invalid 'messages[0].role': expected one of system, user, assistant, tool",
    "Error at /usr/local/lib/python3.11/site-packages/openai/_base_client.py",
])
def test_ordinary_error_text_is_left_as_it_was(text: str) -> None:
    assert scrub_secrets(text) == text


@pytest.mark.parametrize("url, shown", [
    ("postgresql://app:s3cret@db:5432/compactor", "postgresql://app:***@db:5432/compactor"),
    ("postgresql://app:pa/ss@db/compactor", "postgresql://app:***@db/compactor"),
    ("postgresql+psycopg://app:p@s:s/w@db/c", "postgresql+psycopg://app:***@db/c"),
    ("postgresql://app:p%2Fa%40ss@db/c", "postgresql://app:***@db/c"),
    ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("postgresql://db/c?user=app&password=s3cret", "postgresql://db/c?user=app&password=***"),
    ("postgresql://app@db/c", "postgresql://app@db/c"),
    ("http://u:pw@llm/v1?api-key=k1&model=m&sig=s2",
     "http://u:***@llm/v1?api-key=***&model=m&sig=***"),
    ("https://blob/x?sv=2024&X-Amz-Credential=c&X-Amz-Signature=s",
     "https://blob/x?sv=2024&X-Amz-Credential=***&X-Amz-Signature=***"),
    ("sqlite:////var/lib/compactor/compactor.db", "sqlite:////var/lib/compactor/compactor.db"),
    ("sentinel://:pw1@s1:26379/0;sentinel://:pw2@s2:26379;sentinel://s3:26379",
     "sentinel://:***@s1:26379/0;sentinel://:***@s2:26379;sentinel://s3:26379"),
    ("sentinel://:p;w@s1:26379;sentinel://:p;w@s2", "sentinel://:***@s1:26379;sentinel://:***@s2"),
])
def test_a_url_password_is_hidden_however_it_is_written(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_urls_inside_text_have_their_passwords_hidden() -> None:
    text = "Could not parse 'postgresql://app:pa/ss@db/c' (see docs)"

    assert mask_urls(text) == "Could not parse 'postgresql://app:***@db/c' (see docs)"


@pytest.mark.parametrize("name", [
    "api-key", "api_key", "apiKey", "key", "token", "access_token", "refresh_token",
    "sessionToken", "sig", "signature", "X-Amz-Signature", "X-Amz-Credential", "password",
    "passwd", "client_secret", "secret", "Authorization", "x-api-key", "subscription-key",
])
def test_a_name_that_ends_in_a_secret_word_is_secret(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", [
    "tokens", "max_tokens", "model", "session_id", "user", "sv", "keys", "author", "passage",
])
def test_ordinary_names_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


@pytest.mark.parametrize("text, secret", [
    ('HTTP Request: POST http://u:hunter2hunter2@llm/v1/chat?api-key=q-KEY-1 "200 OK"',
     "hunter2hunter2"),
    ('HTTP Request: POST http://llm/v1/chat?api-key=q-KEY-1 "200 OK"', "q-KEY-1"),
    ("headers: {'api-key': 'abc123', 'accept': 'json'}", "abc123"),
    ("Authorization: Basic dXNlcjpwdw==", "dXNlcjpwdw=="),
    ("signed at https://blob/x?se=1&sig=zz9%2Fyy", "zz9%2Fyy"),
])
def test_log_text_loses_its_credentials_and_keeps_the_rest(text: str, secret: str) -> None:
    scrubbed = scrub_text(text)

    assert secret not in scrubbed
    assert scrubbed.startswith(text[:12])


def test_remembered_secrets_are_removed_from_every_later_text() -> None:
    try:
        remember_secrets(["plain-password-1", None, "short"])

        assert scrub_text("connect failed for plain-password-1 (short)") == \
            f"connect failed for {REDACTED} (short)"
    finally:
        remember_secrets([])


def test_a_urls_secrets_are_found_as_written_and_decoded() -> None:
    url = "http://bob:p%2Fa%40ss@llm/v1?api-key=k%3D1&model=m"

    assert set(url_secrets(url)) == {"p%2Fa%40ss", "p/a@ss", "k%3D1", "k=1"}
    assert list(url_secrets("redis://127.0.0.1:6379/0")) == []
    assert set(url_secrets("sentinel://:a1@s1;sentinel://:b%402@s2")) == {"a1", "b%402", "b@2"}


class Address(NamedTuple):
    url: str
    port: int


def test_values_are_scrubbed_inside_containers_and_reprs_only_when_they_hold_one() -> None:
    class Endpoint:
        def __repr__(self) -> str:
            return "Endpoint(http://u:pw@llm/v1)"

    marker = object()
    value = scrub_value({"urls": ["http://u:pw@h/"], "n": 3, "ok": True, "e": Endpoint(),
                         "o": marker, "at": Address("http://u:pw@h/", 80)})

    assert value == {"urls": ["http://u:***@h/"], "n": 3, "ok": True,
                     "e": "Endpoint(http://u:***@llm/v1)", "o": marker,
                     "at": ("http://u:***@h/", 80)}


# Texts of units built from the patterns' own heads in either case, each after a
# separator (word, non-word or none) and before a run long enough to complete a match or
# not, so that matches and near misses of every pattern come up.
_SEPARATORS = ["", " ", ".", "x", "="]
_HEADS = ["bearer ", "sk-", "pk-", "rk-", "ghp_", "gho_", "github_pat_", "xoxb-", "AKIA",
          "eyJ", "token"]
_TAILS = ["", "0123", "0123456789ABCDEF", "0123456789ABCDEF0123456789",
          "abcdefgh.eyJ0123456789.x"]


def _unit(separator: str, head: str, upper: bool, tail: str) -> str:
    return separator + (head.upper() if upper else head) + tail


def _passed_over_only_when_no_pattern_matches(text: str) -> bool:
    return bool(scrub._MAY_MATCH_PATTERNS.search(text)) or all(
        pattern.search(text) is None for pattern in scrub._PATTERNS)


def test_the_prefilter_finds_every_single_unit_a_pattern_would_change() -> None:
    units = [_unit(*parts) for parts in itertools.product(
        _SEPARATORS, _HEADS, [False, True], _TAILS)]

    assert [unit for unit in units if not _passed_over_only_when_no_pattern_matches(unit)] == []


@given(st.lists(st.builds(_unit, st.sampled_from(_SEPARATORS), st.sampled_from(_HEADS),
                          st.booleans(), st.sampled_from(_TAILS)), min_size=2, max_size=4))
def test_the_prefilter_finds_every_joined_text_a_pattern_would_change(units: list[str]) -> None:
    assert _passed_over_only_when_no_pattern_matches("".join(units))
