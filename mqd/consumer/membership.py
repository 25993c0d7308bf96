"""Membership: the engine's view of "my assignment and its member version".

Chosen once when the Consumer is built (aiokafka's pattern): cluster mode takes the consumer-group
membership the source builds (mqd.consumer.source.Source.consumer_group), broadcast mode takes
:class:`Broadcast`, a membership without a group that owns every subscribed partition. Nothing else
in the engine asks whether there is a group.
"""

from __future__ import annotations

from collections.abc import Sequence

from mqd.consumer.source import Assignment, GroupSettings, Membership
from mqd.topic_partition import TopicPartition

__all__ = ["Broadcast", "Membership"]


class Broadcast:
    """No group: this member is alone and owns every partition (mqd.consumer.source.Membership)."""

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assignment(self, partitions: Sequence[TopicPartition]) -> Assignment:
        return Assignment(frozenset(partitions), None, ())

    def update(self, settings: GroupSettings) -> None:
        return None

    @property
    def members(self) -> tuple[str, ...]:
        return (self.member_id,)

    @property
    def member_version(self) -> int | None:
        return None

    @property
    def coordinator(self) -> str | None:
        return None

    @property
    def last_error(self) -> str | None:
        return None
