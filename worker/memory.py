"""Returning a process's freed heap to the system (glibc's ``malloc_trim``)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, macOS): its allocator returns memory its own way
        return None
    trim: Callable[[int], int] = libc.malloc_trim
    return trim


def return_free_heap() -> bool:
    """Release the free pages at the heap's top and inside it, which glibc keeps after
    large frees (a big job's rows and models); ``False`` where there is no glibc."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
