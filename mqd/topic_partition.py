"""TopicPartition: the name of one partition of one topic, shared by every layer.

Its own module (standard library only) so the consumer engine, its sources, the producer and the
broker's metadata can all name partitions without importing one another.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"
