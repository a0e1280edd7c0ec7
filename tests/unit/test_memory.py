"""The worker's use of glibc's allocator: freed heap returned after a job, one arena."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

FREED_MIB = 64
LARGE_MIB = 16  # under glibc's 32 MiB cap on its dynamic mmap threshold
# What each script measures with: its own resident memory, in MiB.
_RSS_MIB = textwrap.dedent("""
    def rss_mib():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) // 1024 for line in status
                        if line.startswith("VmRSS:"))
""")


def _run_with_rss(script: str) -> list[str]:
    """Run ``script`` in a fresh interpreter, with ``rss_mib()`` defined; its printed words."""
    done = subprocess.run([sys.executable, "-c", _RSS_MIB + script], capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.split()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_the_heap_a_job_freed_leaves_the_process_once_returned() -> None:
    # Objects over pymalloc's 512 bytes come from glibc's heap, which keeps them once
    # freed: the last one still alive pins the heap's top, so nothing shrinks on its own.
    script = textwrap.dedent(f"""
        from worker.memory import return_free_heap

        chunks = [bytes(1000) + bytes([i % 256]) for i in range({FREED_MIB} * 1024)]
        pin = bytes(1000) + b"pin"
        del chunks
        before = rss_mib()
        print(return_free_heap(), before - rss_mib())
    """)
    returned, released_mib = _run_with_rss(script)
    assert returned == "True"
    assert int(released_mib) >= FREED_MIB // 2


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="M_ARENA_MAX is glibc's")
def test_with_one_arena_the_heap_a_thread_freed_serves_the_main_thread() -> None:
    # A thread's own arena keeps the pages it freed for that arena: the main thread's
    # allocations after it would take new pages. With one arena they reuse them.
    script = textwrap.dedent(f"""
        import threading
        from worker.memory import use_one_malloc_arena

        def allocate():
            return [bytes(1000) + bytes([i % 256]) for i in range({FREED_MIB} * 1024)]

        pins = []

        def in_a_thread():
            chunks = allocate()
            pins.append(bytes(1000) + b"pin")
            del chunks

        one_arena = use_one_malloc_arena()
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join()
        before = rss_mib()
        kept = allocate()
        print(one_arena, rss_mib() - before)
    """)
    one_arena, grown_mib = _run_with_rss(script)
    assert one_arena == "True"
    assert int(grown_mib) <= FREED_MIB // 4


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="M_MMAP_THRESHOLD is glibc's")
@pytest.mark.parametrize("mapped", [False, True])
def test_with_large_blocks_mapped_a_large_block_freed_leaves_the_process_at_once(
    mapped: bool,
) -> None:
    # By default the first large block freed raises glibc's threshold to its size (up to
    # 32 MiB): the next such block comes from the heap, whose top a later block pins.
    script = textwrap.dedent(f"""
        from worker.memory import map_large_blocks

        print(map_large_blocks() if {mapped} else "default")
        first = bytearray({LARGE_MIB} * 2**20)
        del first
        block = bytearray({LARGE_MIB} * 2**20)
        pin = bytes(1000) + b"pin"
        before = rss_mib()
        del block
        print(before - rss_mib())
    """)
    setting, released_mib = _run_with_rss(script)
    assert setting == ("True" if mapped else "default")
    assert (int(released_mib) >= LARGE_MIB // 2) is mapped
