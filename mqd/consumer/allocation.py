"""Partition allocation strategies (RocketMQ's AllocateMessageQueueStrategy).

A strategy is a pure function ``(consumer_id, members, partitions) -> owned partitions``. Every
member calls it with the same sorted member list and the same sorted partition list, so every member
computes the same global allocation without talking to the others: each partition is owned by
exactly one member. A consumer that is not in ``members`` gets nothing.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mqd.consumer.errors import ConsumerError

T = TypeVar("T")

# (consumer_id, sorted members, sorted partitions) -> the partitions consumer_id owns
Strategy = Callable[[str, Sequence[str], Sequence[T]], list[T]]

_STRATEGIES: dict[str, Strategy[Any]] = {}


def register_strategy(name: str, fn: Strategy[Any]) -> None:
    """Make ``fn`` available as ``consumer.allocation = name`` (replaces an earlier one)."""
    if not name:
        raise ValueError("a strategy needs a name")
    _STRATEGIES[name] = fn


def get_strategy(name: str) -> Strategy[Any]:
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ConsumerError(
            f"unknown allocation strategy {name!r}; known: {', '.join(sorted(_STRATEGIES))}"
        ) from None


def strategy_names() -> list[str]:
    return sorted(_STRATEGIES)


def allocate_averagely(consumer_id: str, members: Sequence[str], partitions: Sequence[T]) -> list[T]:
    """Contiguous ranges; the first ``len(partitions) % len(members)`` members get one more
    (AllocateMessageQueueAveragely)."""
    if consumer_id not in members or not partitions:
        return []
    index = members.index(consumer_id)
    n, m = len(partitions), len(members)
    mod = n % m
    if n <= m:
        size = 1
    else:
        size = n // m + 1 if mod > 0 and index < mod else n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n - start)
    return [partitions[(start + i) % n] for i in range(max(0, count))]


def allocate_averagely_by_circle(
    consumer_id: str, members: Sequence[str], partitions: Sequence[T]
) -> list[T]:
    """Round robin: member i owns partitions i, i + m, i + 2m, ... (AllocateMessageQueueAveragelyByCircle)."""
    if consumer_id not in members:
        return []
    index = members.index(consumer_id)
    return list(partitions[index :: len(members)])


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:8], "big")


def make_consistent_hash(virtual_nodes: int = 10) -> Strategy[Any]:
    """Each member sits on a ring at ``virtual_nodes`` points; a partition goes to the next point
    clockwise of its own hash (AllocateMessageQueueConsistentHash). Adding or removing a member
    moves only the partitions next to its points."""
    if virtual_nodes < 1:
        raise ValueError("virtual_nodes must be >= 1")

    def allocate(consumer_id: str, members: Sequence[str], partitions: Sequence[T]) -> list[T]:
        if consumer_id not in members:
            return []
        ring = sorted((_hash(f"{member}-{i}"), member) for member in members for i in range(virtual_nodes))
        points = [h for h, _ in ring]
        out = []
        for p in partitions:
            at = bisect.bisect_left(points, _hash(str(p))) % len(ring)
            if ring[at][1] == consumer_id:
                out.append(p)
        return out

    return allocate


allocate_consistent_hash = make_consistent_hash()

register_strategy("averagely", allocate_averagely)
register_strategy("averagely-by-circle", allocate_averagely_by_circle)
register_strategy("consistent-hash", allocate_consistent_hash)
