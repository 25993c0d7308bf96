"""RequestCache: a node's last fetch request is reused only while every partition in it is still
the one sent, at the same epoch, offset and incarnation, with the same per-partition limit."""

from __future__ import annotations

from dataclasses import dataclass

from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetch_request_cache import RequestCache
from mqd.consumer.source import FetchRequest
from mqd.consumer.subscription_state import OwnedPartition


@dataclass(slots=True)
class Sent:
    op: OwnedPartition
    epoch: int
    offset: int
    incarnation: str | None = None


def build(cache: RequestCache[Sent], chosen: list[OwnedPartition], part_max: int) -> list[Sent]:
    sent = [Sent(op, op.epoch, op.position, op.incarnation) for op in chosen]
    cache.put(sent, [FetchRequest(s.op.tp, s.offset, part_max, s.incarnation) for s in sent], part_max)
    return sent


def test_reused_while_unchanged_rebuilt_on_any_change() -> None:
    """Same partitions, epochs, positions, incarnations and limit: the very same lists come back.
    Another limit, order, partition set, a seek (epoch), a new position or incarnation: no reuse."""
    state = SubscriptionState(FlowLimits(), ByteBudget(1 << 20))
    a = state.assign(TopicPartition("events", 0), 5, "m", "a" * 32)
    b = state.assign(TopicPartition("events", 1), 9, "m")
    cache: RequestCache[Sent] = RequestCache()
    assert cache.get([a, b], 1024) is None
    sent = build(cache, [a, b], 1024)
    hit = cache.get([a, b], 1024)
    assert hit is not None and hit[0] is sent and hit[1] is cache.requests
    assert cache.get([a, b], 2048) is None
    assert cache.get([b, a], 1024) is None
    assert cache.get([a], 1024) is None
    b.position = 10
    assert cache.get([a, b], 1024) is None
    b.position = 9
    b.incarnation = "b" * 32
    assert cache.get([a, b], 1024) is None
    b.incarnation = None
    assert cache.get([a, b], 1024) is not None
    state.seek(a.tp, 5)  # same offset, new epoch: an answer to the old request must not apply
    assert cache.get([a, b], 1024) is None
