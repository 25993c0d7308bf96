"""``consistent-hash``: a hash ring (RocketMQ's AllocateMessageQueueConsistentHash)."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def stable_hash(key: str) -> int:
    """64 bits of MD5: the same on every member and every Python (``hash()`` is salted per process)."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:8], "big")


def make_consistent_hash(virtual_nodes: int = 10) -> Callable[[str, Sequence[str], Sequence[Any]], list[Any]]:
    """Each member sits on a ring at ``virtual_nodes`` points; a partition goes to the next point
    clockwise of its own hash. Adding or removing a member moves only the partitions next to its
    points, but the shares are not balanced."""
    if virtual_nodes < 1:
        raise ValueError("virtual_nodes must be >= 1")

    def allocate(consumer_id: str, members: Sequence[str], partitions: Sequence[T]) -> list[T]:
        if consumer_id not in members:
            return []
        ring = sorted(
            (stable_hash(f"{member}-{i}"), member) for member in members for i in range(virtual_nodes)
        )
        points = [h for h, _ in ring]
        out = []
        for p in partitions:
            at = bisect.bisect_left(points, stable_hash(str(p))) % len(ring)
            if ring[at][1] == consumer_id:
                out.append(p)
        return out

    return allocate


allocate_consistent_hash = make_consistent_hash()
