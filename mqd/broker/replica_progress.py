"""``acks=all`` on a master: how far each slave has replicated, and waiting until all live ones have.

A slave's replica fetch names, per partition, the offset it wants next: its log end, which is how
far it has come. A produce with ``acks=all`` waits until every live slave's end is past the batch;
a slave going down shrinks the set it waits for (:meth:`ReplicaProgress.wake_all` on a liveness
change). The pull suggestion reads the same ends to pick a slave that is near the head.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from mqd.config import NodeSpec
from mqd.waiting import wait_event

PartitionKey = tuple[str, int]


class ReplicaProgress:
    """Per partition, the next offset each slave asked for; and the acks=all waiters."""

    def __init__(self, live_slaves: Callable[[], Sequence[NodeSpec]]) -> None:
        self._live_slaves = live_slaves
        self._ends: dict[PartitionKey, dict[str, int]] = defaultdict(dict)
        self._waiters: dict[PartitionKey, set[asyncio.Event]] = defaultdict(set)

    def record(self, slave: str, topic: str, partition: int, offset: int) -> None:
        """A replica fetch from ``slave`` asked for ``offset``: its log end."""
        key = (topic, partition)
        ends = self._ends[key]
        if ends.get(slave) != offset:  # may go down after a slave truncated
            ends[slave] = offset
            for ev in self._waiters.get(key, ()):
                ev.set()

    def live_slave_ends(self, topic: str, partition: int) -> Iterator[tuple[str, int]]:
        """The live slaves in layout order with their log end (-1: not asked yet); lazy, so a
        caller that stops early reads nothing more."""
        ends = self._ends.get((topic, partition), {})
        for slave in self._live_slaves():
            yield slave.id, ends.get(slave.id, -1)

    def wake_all(self) -> None:
        """Re-check every waiting produce (a slave went down or came back)."""
        for events in self._waiters.values():
            for ev in events:
                ev.set()

    async def wait_replicated(self, topic: str, partition: int, needed: int, timeout: float) -> bool:
        """Wait until every live slave's end is at least ``needed``; False after ``timeout`` s."""
        key = (topic, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ev = asyncio.Event()
        self._waiters[key].add(ev)
        try:
            while True:
                ends = self._ends.get(key, {})
                if all(ends.get(s.id, -1) >= needed for s in self._live_slaves()):
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                ev.clear()
                await wait_event(ev, remaining)
        finally:
            self._waiters[key].discard(ev)
            if not self._waiters[key]:
                del self._waiters[key]
