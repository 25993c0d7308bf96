"""``averagely``: contiguous ranges (RocketMQ's AllocateMessageQueueAveragely)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def allocate_averagely(consumer_id: str, members: Sequence[str], partitions: Sequence[T]) -> list[T]:
    """Contiguous ranges; the first ``len(partitions) % len(members)`` members get one more."""
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
