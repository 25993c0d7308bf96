"""Giving memory back to the OS after a burst: the broker's held fetches, the landing's backlog.

Measured (bench/longpoll_rss.py, docs/security.md "Request bounds"): after 5,000 concurrent long
polls end, the node's Python objects are all freed (tracemalloc back within 0.5 MiB of its level
before the burst, no object made by the burst's requests still reachable), yet with Python's own
small-object allocator RSS stays 28-33 MiB higher. That memory is pymalloc's: it hands a 1 MiB
arena back only when every block in it is free, and a few thousand blocks that outlive the burst
(free lists of the C extensions serving the connections, which no ``gc.collect`` empties) are
spread over dozens of arenas and pin them. glibc's malloc can give back any free page, so:

- :func:`exec_with_trimmable_allocator` (the ``mqd broker`` command, before anything is imported)
  starts the node again, same pid and arguments, with ``PYTHONMALLOC=malloc`` (every Python object
  from glibc's heap) and ``MALLOC_ARENA_MAX=2`` (without it the freed space stays in per-thread
  arenas: 55-64 MiB kept). Measured: 5-15 MiB kept instead of 28-33. An operator who sets
  ``PYTHONMALLOC`` (``pymalloc`` for the old behaviour) keeps their choice; an operator's
  ``MALLOC_ARENA_MAX`` too.
- After a burst, :func:`trim_heap` collects cyclic garbage first (so its pages are free too) and
  then calls glibc's ``malloc_trim(0)``, which hands every free page of every malloc arena back. It
  walks the heap, so it runs only after a burst: when the node held at least
  :data:`TRIM_AFTER_HELD` fetches since the last check and now holds far fewer; and twice more,
  while the burst's connections close.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import os
import sys

import structlog

log = structlog.get_logger(__name__)

TRIM_AFTER_HELD = 100  # a burst worth giving memory back after
TRIM_CHECK_INTERVAL_S = 5.0
TRIM_PASSES = 3  # the first when the burst ended, two more while its connections close
# what the node runs with unless the environment says otherwise (module docstring)
TRIMMABLE_ALLOCATOR = {"PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}


@functools.cache
def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def exec_with_trimmable_allocator() -> None:
    """Replace this process by itself (same pid, arguments and environment) running with
    :data:`TRIMMABLE_ALLOCATOR`; returns at once where ``PYTHONMALLOC`` is set already (an
    operator's choice, or this very process after the exec) or the C library has no malloc_trim."""
    if "PYTHONMALLOC" in os.environ or _malloc_trim() is None or not sys.executable:
        return
    env = {**TRIMMABLE_ALLOCATOR, **os.environ}  # the operator's MALLOC_ARENA_MAX wins
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def rss_mib() -> float | None:
    """This process's resident memory in MiB (Linux), None where /proc is not there."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)


def trim_heap(passes: int = TRIM_PASSES) -> bool:
    """Free the burst's cyclic garbage, then return the C heap's free pages to the OS and log the
    resident memory before and after; False where the C library cannot (not glibc).

    Inside a running event loop, ``passes - 1`` more passes follow, :data:`TRIM_CHECK_INTERVAL_S`
    apart: the burst's answers are sent when the check sees it ended, but its thousands of
    connections close as fast as their clients read (seconds on a loaded host), and what they free
    after the first pass would otherwise stay in malloc's free lists until the next burst."""
    before = rss_mib()
    collected = gc.collect()
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
    _release_arrow_pool()
    log.info(
        "memory given back after a burst",
        rss_mib_before=before,
        rss_mib_after=rss_mib(),
        gc_collected=collected,
        passes_left=passes - 1,
    )
    if fn is not None and passes > 1:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return True
        loop.call_later(TRIM_CHECK_INTERVAL_S, trim_heap, passes - 1)
    return fn is not None


def _release_arrow_pool() -> None:
    """Arrow's pool (jemalloc in the daemon) keeps freed pages for reuse as glibc does; where
    pyarrow is loaded, ask it to give them back too. Never imports pyarrow (the broker has none)."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        pa.default_memory_pool().release_unused()


def burst_ended(peak: int, held: int) -> bool:
    """Whether a trim is worth it: ``peak`` fetches were held since the last check, ``held`` now."""
    return peak >= TRIM_AFTER_HELD and held <= peak // 4
