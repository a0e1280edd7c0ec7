"""Scrubbing: credentials and token-like runs out of provider text, passwords out of URLs
however they are written; ordinary error text left as it was."""

from __future__ import annotations

import pytest

from worker.scrub import REDACTED, mask_url, mask_urls, scrub_secrets


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
    ("sqlite:////var/lib/compactor/compactor.db", "sqlite:////var/lib/compactor/compactor.db"),
])
def test_a_url_password_is_hidden_however_it_is_written(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_urls_inside_text_have_their_passwords_hidden() -> None:
    text = "Could not parse 'postgresql://app:pa/ss@db/c' (see docs)"

    assert mask_urls(text) == "Could not parse 'postgresql://app:***@db/c' (see docs)"
