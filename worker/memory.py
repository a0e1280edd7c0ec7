"""The worker's use of glibc's allocator: one malloc arena per process, large blocks in
mappings of their own, and the freed heap returned to the system after each job
(``malloc_trim``)."""

from __future__ import annotations

import ctypes
import functools

# glibc's malloc.h
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
# glibc's default threshold, held fixed (bytes).
LARGE_BLOCK_BYTES = 128 * 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): its allocator returns memory its own way
        return None


def use_one_malloc_arena() -> bool:
    """Have every thread allocate from the main arena (``M_ARENA_MAX`` = 1, what
    ``MALLOC_ARENA_MAX=1`` sets), before the pool forks so that each child inherits it.

    glibc gives each new thread its own arena: the summarizer's concurrent calls then build
    their prompts and parse their replies in arenas whose freed pages no other thread
    reuses, and a long job's peak grows (``bench.memory_bench``). The
    threads hold the GIL while they allocate, so one arena costs them no waiting."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_ARENA_MAX, 1))


def map_large_blocks() -> bool:
    """Serve every block of ``LARGE_BLOCK_BYTES`` or more from a mapping of its own, which
    goes back to the system when freed (what ``MALLOC_MMAP_THRESHOLD_`` sets); call it
    before the pool forks.

    By default glibc raises the threshold to the size of each mapped block freed (up to
    32 MiB): after a job's first large free, its later large blocks (prompts, request
    bodies, the swap's artifacts JSON) come from the heap, where freed small objects left
    holes too small for them, so the heap grows instead (``bench.memory_bench``)."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))


def return_free_heap() -> bool:
    """Release the free pages at the heap's top and inside it, which glibc keeps after
    large frees (a big job's rows and models); ``False`` where there is no glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
