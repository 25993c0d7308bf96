"""``averagely-by-circle``: round robin (RocketMQ's AllocateMessageQueueAveragelyByCircle)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def allocate_averagely_by_circle(
    consumer_id: str, members: Sequence[str], partitions: Sequence[T]
) -> list[T]:
    """Member i owns partitions i, i + m, i + 2m, ..."""
    if consumer_id not in members:
        return []
    index = members.index(consumer_id)
    return list(partitions[index :: len(members)])
