"""Long polling (DESIGN.md §1): a fetch with nothing to answer is held, and woken by appends.

There is no timer tick: every held fetch registers one ``asyncio.Event`` on each partition it
asked for, and :meth:`LongPoll.notify` (after a produce, and on a slave after replication
appended) sets the events of that partition. :meth:`LongPoll.close` answers every held fetch at
once when the node stops.

The number of fetches held at once is capped (``limits.max_long_polls``): each holds a task, a
socket and its buffers, so without a cap anyone can tie up the node's memory and file descriptors.
A fetch that would be held over the cap raises :class:`LongPollFull` (the API answers 429); one
that can answer at once is never refused.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

from mqd.errors import MqdError
from mqd.waiting import wait_event

T = TypeVar("T")
PartitionKey = tuple[str, int]


class LongPollFull(MqdError):
    """The fetch would be held but the node already holds ``limit`` fetches (retriable later)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the node already holds {limit} fetches", retriable=True)
        self.limit = limit


class LongPoll:
    """The partitions' waiting fetches, and the hold loop; at most ``max_held`` capped holds at once."""

    def __init__(self, max_held: int = 1000) -> None:
        self._waiters: dict[PartitionKey, set[asyncio.Event]] = defaultdict(set)
        self.max_held = max_held
        self.held = 0  # capped holds now waiting
        self.held_peak = 0  # most capped holds at once since the last take_peak()
        self.closing = False

    def notify(self, topic: str, partition: int) -> None:
        """Wake every fetch held on this partition."""
        events = self._waiters.get((topic, partition))
        if events:
            for ev in events:
                ev.set()

    def take_peak(self) -> int:
        """The most capped holds at once since the last call (then counting starts again)."""
        peak, self.held_peak = self.held_peak, self.held
        return peak

    def close(self) -> None:
        """Answer every held fetch now, and hold no new one (the node is stopping)."""
        self.closing = True
        for events in self._waiters.values():
            for ev in events:
                ev.set()

    async def hold(
        self,
        keys: Iterable[PartitionKey],
        timeout: float,
        attempt: Callable[[], tuple[T, bool]],
        *,
        capped: bool = True,
    ) -> T:
        """Call ``attempt`` now and after every append to one of ``keys`` until it answers ready,
        ``timeout`` seconds pass or the poll closes; returns its last result.

        The result is used without an await after the last ``attempt``, so what it planned is
        still true when the caller reads it. Raises :class:`LongPollFull` when the fetch would be
        held, ``capped`` is set and ``max_held`` capped fetches are already held.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        result, ready = attempt()
        if ready or timeout <= 0 or self.closing:
            return result
        if capped and self.held >= self.max_held:
            raise LongPollFull(self.max_held)
        if capped:
            self.held += 1
            self.held_peak = max(self.held_peak, self.held)
        event = asyncio.Event()
        wanted = set(keys)
        for key in wanted:
            self._waiters[key].add(event)
        try:
            # no await since the first attempt: no append can have been missed before registering
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0 or self.closing:
                    return result
                await wait_event(event, remaining)
                event.clear()
                result, ready = attempt()
                if ready:
                    return result
        finally:
            if capped:
                self.held -= 1
            for key in wanted:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]
