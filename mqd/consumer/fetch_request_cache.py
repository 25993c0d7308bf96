"""The last fetch request of one node, reused while nothing in it changed.

An idle consumer sends the same request to each node round after round: the same partitions at the
same offsets under the same incarnations. Building it again (one sent record and one request per
partition, then the body's JSON) was most of an idle daemon's CPU at 1,000 partitions, so the node
fetcher keeps its last request and the source its encoded body; a round checks, without making any
object, that every chosen partition is still the one sent, at the same epoch, offset and
incarnation, and reuses both when it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from mqd.consumer.source import FetchRequest
from mqd.consumer.subscription_state import OwnedPartition


class SentLike(Protocol):
    """What a node fetcher records of each partition it sent."""

    @property
    def op(self) -> OwnedPartition: ...
    @property
    def epoch(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def incarnation(self) -> str | None: ...


S = TypeVar("S", bound=SentLike)


class RequestCache(Generic[S]):
    """One node's last request: its sent records and the source requests built from them."""

    __slots__ = ("part_max", "requests", "sent")

    def __init__(self) -> None:
        self.sent: list[S] = []
        self.requests: list[FetchRequest] = []
        self.part_max = -1

    def get(
        self, chosen: Sequence[OwnedPartition], part_max: int
    ) -> tuple[list[S], list[FetchRequest]] | None:
        """The last request when ``chosen`` is exactly what it asked for (same partitions in the same
        order, each at the epoch, position and incarnation sent, same per-partition limit)."""
        sent = self.sent
        if part_max != self.part_max or len(sent) != len(chosen):
            return None
        for s, op in zip(sent, chosen, strict=True):
            if (
                s.op is not op
                or s.epoch != op.epoch
                or s.offset != op.position
                or s.incarnation != op.incarnation
            ):
                return None
        return sent, self.requests

    def put(self, sent: list[S], requests: list[FetchRequest], part_max: int) -> None:
        self.sent, self.requests, self.part_max = sent, requests, part_max
