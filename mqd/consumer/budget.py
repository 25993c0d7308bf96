"""ByteBudget: the one daemon-wide bound on the memory fetch answers may hold (max_buffered_bytes).

Every counter of the budget lives here; the fetchers reserve before sending, the answer callback
pins the answer body and buffers batches, the drain takes them, and whoever frees bytes wakes the
fetchers through ``on_freed``.

- ``reserved``: max_bytes of fetches in flight (an answer can be that large).
- ``buffered``: wire bytes of batches in process queues.
- ``pinned``: bytes of fetch answer bodies still in memory. Batches are zero-copy slices, so a body
  lives until the last slice of any of its partitions is gone, wherever it went (queue, drained and
  held by the caller, a sink, a publication). With ``held`` (the daemon) the budget charges these
  instead of the buffered bytes: drained batches stay charged until the caller drops them, so the
  budget bounds what the process really holds.
- ``blocked``: an answer did not fit; no node fetches until something is freed, so a nearly full
  budget does not turn into a loop of answers that are thrown away.
- ``waiting``: some fetcher is idle because the budget was used up; the end of any fetch in flight
  wakes them all.
- ``queue``: the nodes waiting for budget, in the order they found it short; a node sends only when
  none waits ahead of it (the fetcher's ``_round``). Why: the node whose request ends is woken
  first, and it took what was left again each time, so a node that had once found the budget
  short could wait for good (seen: a burst of the ``wide`` shape stuck at 1,752,000 of 2,000,000
  records while two caught-up nodes took turns long-polling; docs/decisions/072-fetch-budget-turns.md).
- ``gauge`` (the daemon's, mqd/consumer/memory_gauge.py): the RSS above the idle baseline that the
  charges above do not cover (the landing's encoder, Python objects, allocator slack) is counted
  too, so the limit bounds the process's memory, not only what the budget can name.

The limit has no default here: it is the config's ``consumer.max_buffered_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable

from mqd import metrics
from mqd.consumer.memory_gauge import MemoryGauge


class ByteBudget:
    """Reserve / release (fetches in flight), buffer / take (queues), pin / unpin (answer bodies)."""

    def __init__(self, limit: int, *, held: bool = False, gauge: MemoryGauge | None = None) -> None:
        self.limit = limit
        self.held = held
        self.gauge = gauge
        self.buffered = 0
        self.reserved = 0
        self.pinned = 0
        self.pinned_bodies = 0
        self.blocked = False
        self.waiting = False
        self.queue: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        # called when bytes were freed: every node may be able to fetch again
        self.on_freed: Callable[[], None] = lambda: None

    def charged(self) -> int:
        """Bytes held now by what the budget charges (not the fetches in flight)."""
        # pinned covers every buffered batch once answers are tracked; max() keeps untracked
        # batches (an answer that could not be tracked, hand-made ones) counted
        return max(self.pinned, self.buffered) if self.held else self.buffered

    def used(self) -> int:
        """What ``left()`` last counted against the limit (the gauge is not read again)."""
        return self.charged() + self.reserved + (self.gauge.counted if self.gauge is not None else 0)

    def left(self) -> int:
        held = self.charged()
        if self.gauge is not None:
            held += self.gauge.excess(held, self.limit)
        return self.limit - held - self.reserved

    def exhausted(self) -> bool:
        """No fetch may be sent now."""
        return self.left() <= 0 or self.blocked

    # -- fetches in flight -----------------------------------------------------------------------

    def reserve(self, nbytes: int) -> None:
        self.reserved += nbytes

    def release(self, nbytes: int) -> bool:
        """Return a reservation; True when a fetcher was waiting for budget (wake them all)."""
        self.reserved -= nbytes
        was_waiting, self.waiting = self.waiting, False
        return was_waiting

    def wait(self, node: str) -> None:
        """``node``'s fetcher found the budget used up, or another node waiting ahead of it: it
        waits for a release or a free, in line."""
        metrics.flow_control_events.labels("budget").inc()
        self.waiting = True
        if node not in self.queue:
            self.queue.append(node)

    def ahead(self, node: str) -> bool:
        """Another node waits for budget ahead of ``node``: it goes first."""
        return bool(self.queue) and self.queue[0] != node

    def leave(self, node: str) -> str | None:
        """``node`` no longer waits (it sent, or has nothing to fetch); returns the node first in
        line now if ``node`` was, to be woken: a turn is never left unannounced."""
        if node not in self.queue:
            return None
        was_first = self.queue[0] == node
        self.queue.remove(node)
        return self.queue[0] if was_first and self.queue else None

    # -- buffered batches ------------------------------------------------------------------------

    def fits(self, nbytes: int) -> bool:
        """A batch of ``nbytes`` may be buffered: hard cap on memory, except that an empty buffer
        always takes one batch (progress)."""
        return not self.buffered or self.buffered + nbytes <= self.limit

    def block(self) -> None:
        """An answer did not fit: hold every node until something is freed."""
        metrics.flow_control_events.labels("budget").inc()
        self.blocked = True

    def add_buffered(self, nbytes: int) -> None:
        self.buffered += nbytes
        metrics.buffered_bytes.set(self.buffered)

    def take_buffered(self, nbytes: int) -> None:
        """Bytes left the queues (drained or discarded); call ``freed()`` once after a run of these."""
        self.buffered -= nbytes
        metrics.buffered_bytes.set(self.buffered)

    def freed(self) -> None:
        self.blocked = False
        self.on_freed()

    def memory_bound(self, low: int) -> bool:
        """Fetching is held back by the budget: blocked, or less than ``low`` bytes left."""
        return self.blocked or self.left() < low

    # -- answer bodies ---------------------------------------------------------------------------

    def pin(self, body: object, nbytes: int) -> bool:
        """Charge an answer body of ``nbytes`` until it is freed; False when it cannot be tracked
        (it does not take weak references, e.g. plain bytes)."""
        try:
            fin = weakref.finalize(body, self._freed_from_any_thread, nbytes)
        except TypeError:
            return False
        fin.atexit = False
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self.pinned += nbytes
        self.pinned_bodies += 1
        return True

    def _freed_from_any_thread(self, nbytes: int) -> None:
        # runs wherever the last slice died: a landing worker thread, or the loop in the middle
        # of any statement; counters are only touched on the loop, between callbacks
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed: nothing left to account
                loop.call_soon_threadsafe(self._unpin, nbytes)

    def _unpin(self, nbytes: int) -> None:
        self.pinned -= nbytes
        self.pinned_bodies -= 1
        if self.held:
            self.freed()
