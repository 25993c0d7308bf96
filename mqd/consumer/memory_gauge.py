"""MemoryGauge: the daemon's resident memory above its idle baseline, read for the byte budget.

Why: ``consumer.max_buffered_bytes`` promises that the daemon's RSS above what it holds idle stays
within it. The budget charges what it can name (answers in flight and in memory, decoded records
until they are published), but the process holds more for them: the landing's Parquet encoder and
its row groups, Python objects on the records' way, and allocator pages kept for reuse. Measured on
the ``kafka`` shape that was ~25 MiB on top of a full 80 MiB budget. So the budget also counts what
this gauge reads above the baseline beyond its own charges ("outside"), and fetches less.

- *The baseline* is set once the daemon holds its code: the landing's first encode has run
  (``mqd/landing/preflight.py``), pyarrow and the codecs are loaded. It is the RSS then, less what
  the budget charges at that moment (answers may already be in memory).
- *The reading* is ``/proc/self/statm``'s resident pages, one ``pread`` on a kept descriptor
  (~1.5 us), when the budget is asked what is left and the last reading is older than
  ``READ_EVERY_S`` (10 ms): no sampling thread. Younger, the last reading's outside is counted
  again: a ``pread`` releases the GIL, and taking it back waits for a landing thread's turn (a
  run of 600,000 x 1 KiB records asked ~1,000 times, 40-80 us a reading, 3-4 % of the event
  loop's time). What is outside the charges (the encoder's buffers, the allocator's pages) moves
  over publications, tens of milliseconds, not between two questions of one fetch round.
- *Progress before precision*: what is outside counts at most half the limit, so a budget smaller
  than the daemon's own working set (a test's 1 MiB) still fetches; then RSS may exceed the limit,
  which a counter and a warning (at most one per ``WARN_EVERY_S``) say.
- Before the baseline (and where ``/proc`` is missing) the gauge reads nothing: the budget is its
  charges alone.
- *Code loaded later* (the admin endpoint, built at its first connection) raises the baseline by
  what it added (``loading_code``), so a scrape does not shrink what is left for records.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator

import structlog

from mqd import metrics

log = structlog.get_logger(__name__)

WARN_EVERY_S = 300.0
READ_EVERY_S = 0.01  # a reading younger than this is counted again (module docstring)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class MemoryGauge:
    """RSS above the idle baseline, beyond what the budget charges. See the module docstring."""

    def __init__(
        self,
        path: str = "/proc/self/statm",
        *,
        read_every_s: float = READ_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.read_every_s = read_every_s
        self._clock = clock
        self._read_at = float("-inf")  # when excess() last read the RSS
        self.baseline: int | None = None  # bytes of RSS the daemon holds idle
        self.outside = 0  # bytes above the baseline the budget did not charge, at the last reading
        self.counted = 0  # of those, what the last reading counted against the limit (the cap applied)
        self.outside_peak = 0
        self.capped = 0  # readings where outside was more than half the limit
        self._fd: int | None = None
        self._warned_at = float("-inf")

    def rss(self) -> int:
        """Resident bytes now (0 when the gauge is not started)."""
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 64, 0).split(maxsplit=2)[1]) * _PAGE

    def start(self, charged: int) -> None:
        """Take the baseline now: the RSS less ``charged``, the bytes the budget holds at this
        moment. Without /proc the gauge stays off."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as exc:
                log.warning("memory gauge off: cannot read the process's RSS", path=self.path, error=str(exc))
                return
        self.baseline = self.rss() - charged
        self._read_at = float("-inf")  # the next question reads
        log.info("memory baseline taken", rss_mb=round(self.baseline / 2**20, 1), charged_bytes=charged)

    @contextlib.contextmanager
    def loading_code(self, charged: Callable[[], int]) -> Iterator[None]:
        """Code the process loads inside, after the baseline (the admin endpoint, built at its first
        connection: ~10 MiB), is not what records cost: the RSS it adds beyond the charges
        (``charged()``, read before and after) raises the baseline. Records allocated or freed
        meanwhile blur the figure, so only growth counts. Safe on a worker thread: a pread and
        integer reads."""
        before = self.rss() - charged() if self.baseline is not None else None
        yield
        if before is None or self.baseline is None:
            return
        grown = self.rss() - charged() - before
        if grown > 0:
            self.baseline += grown
            log.info("memory baseline raised for code loaded", grown_mb=round(grown / 2**20, 1))

    def stop(self) -> None:
        fd, self._fd = self._fd, None
        self.baseline = None
        self.counted = 0
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def excess(self, charged: int, limit: int) -> int:
        """Bytes to count against ``limit`` beyond ``charged``: the RSS above the baseline that the
        charges do not cover, at most half the limit."""
        if self.baseline is None:
            return 0
        now = self._clock()
        if now - self._read_at < self.read_every_s:
            return self.counted  # the last reading's outside, the cap applied
        self._read_at = now
        outside = max(0, self.rss() - self.baseline - charged)
        self.outside = self.counted = outside
        metrics.memory_outside_budget.set(outside)
        self.outside_peak = max(self.outside_peak, outside)
        cap = limit // 2
        if outside <= cap:
            return outside
        self.counted = cap
        self.capped += 1
        metrics.memory_outside_capped.inc()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "memory outside the budget's charges is over half of max_buffered_bytes: the daemon's "
                "RSS above idle may exceed it (raise consumer.max_buffered_bytes)",
                outside_mb=round(outside / 2**20, 1),
                limit_mb=round(limit / 2**20, 1),
            )
        return cap
