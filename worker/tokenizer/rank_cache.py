"""A compact cached form of a tokenizer's parsed ranks, so a process skips the base64 parse.

Parsing o200k_base's 200,000 ``base64 rank`` lines costs ~0.3 s of CPU in every process;
``marshal`` reads the same dict back in a third of that. A cache file is written only
from a file that passed tiktoken's sha256 check, is named by that sha256 (a new encoding
file never meets an old cache), and carries the sha256 of its own payload: a truncated
or altered file is ignored and rewritten, never trusted. Writes are atomic and best
effort: a read-only directory only costs the parse.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
from pathlib import Path

FORMAT = b"compactor-ranks/1"
_DIGEST_BYTES = 32


def default_dir() -> Path:
    """Where ranks are cached without a ``TIKTOKEN_CACHE_DIR``: the user's cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "compactor" / "tiktoken-ranks"


def cache_path(file_name: str, source_sha256: str | None, cache_dir: Path | None) -> Path | None:
    """The cache file for one verified encoding file; none when its hash is unknown
    (an unverified file is never cached)."""
    if source_sha256 is None:
        return None
    directory = cache_dir if cache_dir is not None else default_dir()
    python = f"py{sys.version_info.major}{sys.version_info.minor}"  # marshal's format
    return directory / f"{file_name}.{source_sha256[:32]}.{python}.ranks"


def read(path: Path) -> dict[bytes, int] | None:
    """The ranks stored at ``path``, or ``None`` when it is missing or fails its check."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    header = len(FORMAT) + 1
    if not data.startswith(FORMAT + b"\n") or len(data) < header + _DIGEST_BYTES:
        return None
    digest, payload = data[header:header + _DIGEST_BYTES], data[header + _DIGEST_BYTES:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        ranks = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return ranks if isinstance(ranks, dict) else None


def write(path: Path, ranks: dict[bytes, int]) -> bool:
    """Store ``ranks`` at ``path`` atomically; ``False`` when the directory is not writable."""
    payload = marshal.dumps(ranks)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(FORMAT + b"\n" + hashlib.sha256(payload).digest() + payload)
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from other service users
        os.replace(temporary, path)  # readers see the old file or the whole new one
    except OSError:
        Path(temporary).unlink(missing_ok=True)
        return False
    return True
