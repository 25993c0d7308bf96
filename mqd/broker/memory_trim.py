"""Giving memory back to the OS after a burst of held fetches.

Measured (bench/longpoll_rss.py, docs/security.md "Request bounds"): after 5,000 concurrent long
polls end, the node's Python objects are all freed (tracemalloc back within 0.5 MiB of its level
before the burst) but RSS stays ~30-50 MiB higher, reached in the first burst and growing little
after. That memory is the allocators' free space: glibc keeps the freed pages of its heap, and
pymalloc keeps each 1 MiB arena that still holds one live object (a few hundred long-lived objects
made during the burst, such as bounded caches, are enough to pin dozens of arenas). After a burst,
:func:`trim_heap` collects cyclic garbage first (so its pages are free too) and then calls glibc's
``malloc_trim(0)``, which hands every free page of every malloc arena back. It walks the heap, so it
runs only after a burst: when the node held at least :data:`TRIM_AFTER_HELD` fetches since the last
check and now holds far fewer. Pinned pymalloc arenas stay until their last object goes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os

import structlog

log = structlog.get_logger(__name__)

TRIM_AFTER_HELD = 100  # a burst worth giving memory back after
TRIM_CHECK_INTERVAL_S = 5.0


@functools.cache
def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def rss_mib() -> float | None:
    """This process's resident memory in MiB (Linux), None where /proc is not there."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def trim_heap() -> bool:
    """Free the burst's cyclic garbage, then return the C heap's free pages to the OS and log the
    resident memory before and after; False where the C library cannot (not glibc)."""
    before = rss_mib()
    collected = gc.collect()
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
    log.info(
        "memory given back after a burst",
        rss_mib_before=before,
        rss_mib_after=rss_mib(),
        gc_collected=collected,
    )
    return fn is not None


def burst_ended(peak: int, held: int) -> bool:
    """Whether a trim is worth it: ``peak`` fetches were held since the last check, ``held`` now."""
    return peak >= TRIM_AFTER_HELD and held <= peak // 4
