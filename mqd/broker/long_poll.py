"""Long polling (DESIGN.md §1): a fetch with nothing to answer is held, and woken by appends.

There is no timer tick: every held fetch registers one ``asyncio.Event`` on each partition it
asked for, and :meth:`LongPoll.notify` (after a produce, and on a slave after replication
appended) sets the events of that partition. :meth:`LongPoll.close` answers every held fetch at
once when the node stops.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

from mqd.waiting import wait_event

T = TypeVar("T")
PartitionKey = tuple[str, int]


class LongPoll:
    """The partitions' waiting fetches, and the hold loop."""

    def __init__(self) -> None:
        self._waiters: dict[PartitionKey, set[asyncio.Event]] = defaultdict(set)
        self.closing = False

    def notify(self, topic: str, partition: int) -> None:
        """Wake every fetch held on this partition."""
        events = self._waiters.get((topic, partition))
        if events:
            for ev in events:
                ev.set()

    def close(self) -> None:
        """Answer every held fetch now, and hold no new one (the node is stopping)."""
        self.closing = True
        for events in self._waiters.values():
            for ev in events:
                ev.set()

    async def hold(
        self, keys: Iterable[PartitionKey], timeout: float, attempt: Callable[[], tuple[T, bool]]
    ) -> T:
        """Call ``attempt`` now and after every append to one of ``keys`` until it answers ready,
        ``timeout`` seconds pass or the poll closes; returns its last result.

        The result is used without an await after the last ``attempt``, so what it planned is
        still true when the caller reads it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        event = asyncio.Event()
        wanted = set(keys)
        for key in wanted:
            self._waiters[key].add(event)
        try:
            while True:
                result, ready = attempt()
                remaining = deadline - loop.time()
                if ready or remaining <= 0 or self.closing:
                    return result
                event.clear()
                await wait_event(event, remaining)
        finally:
            for key in wanted:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]
