"""The consumer engine's errors (both derive from mqd.errors.MqdError)."""

from __future__ import annotations

from mqd.errors import MqdError
from mqd.topic_partition import TopicPartition


class ConsumerError(MqdError):
    """A consumer-level failure. ``retriable`` says whether trying again later may succeed."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message, retriable=retriable)


class NotAssignedError(ConsumerError, KeyError):
    """An operation named a partition this consumer does not own."""

    def __init__(self, tp: TopicPartition) -> None:
        ConsumerError.__init__(self, f"partition {tp} is not assigned to this consumer", retriable=False)
        self.tp = tp

    def __str__(self) -> str:
        return str(self.args[0])
