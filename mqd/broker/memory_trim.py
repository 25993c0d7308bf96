"""Giving memory back to the OS after a burst of held fetches.

Measured (bench/longpoll_rss.py): after 2,000 concurrent long polls end, the node's Python objects
are all freed (tracemalloc back to its level before the burst, no object count growth) but RSS
stays ~30 MiB higher, plateauing over rounds: glibc keeps the freed pages of its fragmented heap.
``malloc_trim(0)`` hands them back. It walks the heap, so it runs only after a burst: when the node
held at least :data:`TRIM_AFTER_HELD` fetches since the last check and now holds far fewer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

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


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS; False where the C library cannot (not glibc)."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True


def burst_ended(peak: int, held: int) -> bool:
    """Whether a trim is worth it: ``peak`` fetches were held since the last check, ``held`` now."""
    return peak >= TRIM_AFTER_HELD and held <= peak // 4
