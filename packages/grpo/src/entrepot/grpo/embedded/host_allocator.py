"""glibc's allocator told to give freed tensor memory back to the OS (Linux with glibc; a no-op elsewhere).

At its defaults glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), so
after the first update most activation and scratch tensors (1-32 MiB) come from the heap, whose freed
pages stay in the process: about 0.5-1.0 GB of RSS on a SmolLM2-135M run (packages/grpo/BENCHMARKS.md).
A fixed 1 MiB threshold serves every block of 1 MiB or more by its own mmap, unmapped when freed; two
arenas keep the threads' heaps from each holding their own free pages. `release_host_memory` hands
back what the heap still holds free (`malloc_trim`) after a phase that freed a lot.

Set from Python through ctypes, so every torch process of a run (the driver, in-process and Ray
workers) gets it from `configure_threads`; a user's own ``MALLOC_*`` environment variables win
(glibc read them at start-up and nothing is changed here).
"""

from __future__ import annotations

import ctypes
import os
import sys
from functools import cache

__all__ = ["ALLOCATOR_ENV", "MMAP_THRESHOLD_BYTES", "release_host_memory", "tune_host_allocator"]

MMAP_THRESHOLD_BYTES = 1 << 20  # blocks from 1 MiB up get their own mapping, returned when freed
TRIM_THRESHOLD_BYTES = 1 << 20  # free memory above this at the heap's top is returned at once
ARENA_MAX = 2
# mallopt's parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# The environment variables with which a user sets glibc's allocator themselves.
ALLOCATOR_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX", "MALLOC_TOP_PAD_")


@cache
def _glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (it has `gnu_get_libc_version`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into this process
    except OSError:
        return None
    if not all(hasattr(libc, name) for name in ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None  # musl and others: their mallopt is absent or a stub
    return libc


def tune_host_allocator() -> bool:
    """Fix glibc's mmap threshold at 1 MiB, its trim threshold at 1 MiB and its arenas at two.

    Returns whether it did: False off glibc, or when one of `ALLOCATOR_ENV` is set (the user's
    choice stands). Safe to call more than once; later calls set the same values.
    """
    libc = _glibc()
    if libc is None or any(name in os.environ for name in ALLOCATOR_ENV):
        return False
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (_M_ARENA_MAX, ARENA_MAX),
    )
    return all(libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1 for param, value in settings)


def release_host_memory() -> bool:
    """Return the heap's free pages to the OS (glibc's `malloc_trim(0)`); whether any were returned.

    Off glibc (or with the user's own allocator settings) nothing is done and False returned.
    """
    libc = _glibc()
    if libc is None or any(name in os.environ for name in ALLOCATOR_ENV):
        return False
    return bool(libc.malloc_trim(ctypes.c_size_t(0)))
