"""The test server's prompt cache, counted as OpenAI reports it: ``cached_tokens`` is the
longest prefix of a request's tokens that an earlier request shared, in whole blocks of
128 tokens, and nothing under 1,024 tokens. A request that sends ``prompt_cache_key`` is
served from earlier requests with the same key; one without, from any earlier request.

A request's tokens are its messages in order, each its role and its text encoded with
tiktoken (o200k_base, as the server counts). Blocks are remembered as chained hashes:
block k's hash covers every token before its end, so a hit on block k is a hit on the
whole prefix through it.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections.abc import Sequence

from worker.compaction.messages import ChatMessage
from worker.compaction.tokens import TokenCounter

BLOCK_TOKENS = 128
MIN_CACHED_TOKENS = 1_024


def prefix_block_hashes(messages: Sequence[ChatMessage], counter: TokenCounter
                        ) -> tuple[bytes, ...]:
    """The chained hash of each whole 128-token block of the request's token sequence."""
    tokens: list[int] = []
    for message in messages:
        tokens += counter.encoding.encode_ordinary(f"{message.role.value}\n{message.text}\n")
    hashes: list[bytes] = []
    previous = b""
    for end in range(BLOCK_TOKENS, len(tokens) + 1, BLOCK_TOKENS):
        block = array("I", tokens[end - BLOCK_TOKENS:end]).tobytes()
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        hashes.append(previous)
    return tuple(hashes)


class PromptCache:
    """The blocks every request so far left behind, by ``prompt_cache_key``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str | None, set[bytes]] = {None: set()}

    def serve(self, blocks: Sequence[bytes], key: str | None) -> int:
        """Return the cached tokens of a request with these blocks, then remember them."""
        with self._lock:
            seen = self._by_key.setdefault(key, set())
            hits = 0
            for block in blocks:
                if block not in seen:
                    break
                hits += 1
            seen.update(blocks)
            self._by_key[None].update(blocks)
        cached = hits * BLOCK_TOKENS
        return cached if cached >= MIN_CACHED_TOKENS else 0
