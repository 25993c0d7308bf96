"""Process queues, flow control and small consumer helpers: pure logic, no broker (the
broker-backed flow-control checks are in test_consumer_fetch.py)."""

from __future__ import annotations

import asyncio

import pytest
from support.consumer import new_consumer

from mqd.config import ConsumerConfig
from mqd.consumer import (
    ByteBudget,
    ConsumerError,
    FetchedBatch,
    FlowLimits,
    NotAssignedError,
    SubscriptionState,
    TopicPartition,
)
from mqd.waiting import wait_event
from mqd.wire import format

TP = TopicPartition("events", 0)


def batch(tp: TopicPartition, first: int, count: int, size: int = 10, epoch: int = 1) -> FetchedBatch:
    raw = format.encode_batch([b"x" * size] * count, base_offset=first)
    info = format.read_header(raw)
    return FetchedBatch(tp, epoch, format.to_arrow(raw, info), first, first + count, info.length)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state(
    max_buffered_bytes: int = ConsumerConfig().max_buffered_bytes, **limits: int | float
) -> SubscriptionState:
    return SubscriptionState(FlowLimits(**limits), ByteBudget(max_buffered_bytes))  # type: ignore[arg-type]


def test_queue_counts_bytes_offsets_and_span() -> None:
    """A process queue tracks records, bytes, min/max offset and span as batches come and go."""
    s = state()
    ps = s.assign(TP, 0, "n")
    s.append(ps, batch(TP, 0, 5))
    s.append(ps, batch(TP, 5, 10))
    q = ps.queue
    assert (q.records, q.min_offset, q.max_offset, q.span) == (15, 0, 14, 14)
    assert q.nbytes == s.budget.buffered > 0 and s.buffered_records == 15
    assert ps.position == 15
    out = s.drain()
    assert [b.first_offset for b in out] == [0, 5]
    assert (q.records, q.nbytes, q.min_offset, s.budget.buffered, s.buffered_records) == (0, 0, None, 0, 0)


@pytest.mark.parametrize(
    ("limits", "count", "reason"),
    [
        ({"max_queued_records": 10}, 11, "records"),
        ({"max_queued_bytes": 100}, 1, "bytes"),
        ({"max_offset_span": 5}, 7, "span"),
    ],
)
def test_over_a_threshold_holds_until_drained(limits: dict[str, int], count: int, reason: str) -> None:
    """Over any threshold (the newest answer aside) the partition is held back and looked at again
    retry_s later while the queue stays full; a drain lifts the hold at once, not retry_s later."""
    s = state(retry_s=0.05, **limits)
    ps = s.assign(TP, 0, "n")
    s.append(ps, batch(TP, 0, count, size=200))
    now = 10.0
    assert ps.queue.hold(s.limits, now) is None  # one answer alone never holds
    s.append(ps, batch(TP, count, 1))
    assert ps.queue.hold(s.limits, now) == pytest.approx(now + 0.05)
    assert ps.queue.flow_reason == reason
    assert ps.queue.hold(s.limits, now + 0.06) == pytest.approx(now + 0.11)  # still full: still held
    s.drain()
    assert ps.queue.hold(s.limits, now + 0.07) is None  # drained: free at once
    assert ps.queue.held_reason(s.limits) is None


def test_under_thresholds_is_fetchable() -> None:
    """Exactly at a threshold is not over it (RocketMQ compares with >)."""
    s = state(max_queued_records=10, max_offset_span=9)
    ps = s.assign(TP, 0, "n")
    s.append(ps, batch(TP, 0, 10))
    assert ps.queue.hold(s.limits, 1.0) is None


def test_budget_counts_buffered_and_reserved_bytes() -> None:
    """The daemon-wide budget is reduced by buffered data and by fetches in flight."""
    s = state(max_buffered_bytes=10_000)
    ps = s.assign(TP, 0, "n")
    b = batch(TP, 0, 3)
    s.append(ps, b)
    s.budget.reserve(1000)
    assert s.budget.left() == 10_000 - b.nbytes - 1000


def test_drain_max_bytes_returns_at_least_one_batch_and_keeps_order() -> None:
    """drain(max_bytes) never returns nothing when data is there, keeps per-partition order and
    leaves the rest for the next call."""
    s = state()
    tps = [TopicPartition("events", i) for i in range(3)]
    for tp in tps:
        ps = s.assign(tp, 0, "n")
        for first in range(0, 30, 10):
            s.append(ps, batch(tp, first, 10, size=100))
    one = s.drain(max_bytes=1)
    assert len(one) == 1
    rest: list[FetchedBatch] = []
    for _ in range(20):
        got = s.drain(max_bytes=2500)
        if not got:
            break
        rest.extend(got)
    all_batches = one + rest
    assert len(all_batches) == 9 and s.budget.buffered == 0
    for tp in tps:
        assert [b.first_offset for b in all_batches if b.tp == tp] == [0, 10, 20]


def test_seek_bumps_epoch_and_drops_buffered_data() -> None:
    """seek discards buffered batches, sets the position, changes the assignment epoch, unparks."""
    s = state()
    ps = s.assign(TP, 0, "n")
    s.append(ps, batch(TP, 0, 5))
    setattr(ps, "parked", "x")  # noqa: B010 (mypy would narrow ps.parked to str for the rest)
    epoch = ps.epoch
    s.seek(TP, 3)
    assert (ps.position, ps.queue.records, s.budget.buffered, ps.parked) == (3, 0, 0, None)
    assert ps.epoch > epoch
    assert not s.data_ready.is_set()
    with pytest.raises(ValueError, match="offsets are integers"):
        s.seek(TP, -1)
    with pytest.raises(NotAssignedError, match="not assigned"):
        s.seek(TopicPartition("events", 9), 0)


def test_drop_marks_queue_dropped_and_frees_budget() -> None:
    """A revoked partition's queue is flagged dropped and its bytes leave the totals; a new
    assignment of the same partition gets a fresh assignment epoch."""
    s = state()
    ps = s.assign(TP, 0, "n")
    s.append(ps, batch(TP, 0, 5))
    old_epoch = ps.epoch
    assert s.drop(TP) is ps
    assert ps.queue.dropped and s.budget.buffered == 0 and s.buffered_records == 0
    again = s.assign(TP, 0, "n")
    assert again.epoch != old_epoch and not again.queue.dropped


def test_wakeups_name_the_pull_node() -> None:
    """Assign, resume and drain wake the fetcher of the partition's pull node."""
    s = state()
    woken: list[str | None] = []
    s.on_fetchable = woken.append
    ps = s.assign(TP, 0, "node-1")
    s.set_paused([TP], True)
    s.set_paused([TP], False)
    s.append(ps, batch(TP, 0, 1))
    s.drain()
    assert woken.count("node-1") >= 3


def test_update_config_applies_limits_and_rejects_unknown_strategy() -> None:
    """update_config swaps thresholds and the budget at once; an unknown allocation strategy is
    refused with a clear error and changes nothing (also at construction)."""
    cfg = ConsumerConfig(client_id="x", max_buffered_bytes=1000)
    consumer = new_consumer(cfg)
    assert consumer.status()["totals"]["budget_bytes"] == 1000
    consumer.update_config(cfg.model_copy(update={"max_buffered_bytes": 5000}))
    assert consumer.status()["totals"]["budget_bytes"] == 5000
    with pytest.raises(ConsumerError, match="unknown allocation strategy 'nope'"):
        consumer.update_config(cfg.model_copy(update={"allocation": "nope", "max_buffered_bytes": 1}))
    assert consumer.status()["totals"]["budget_bytes"] == 5000
    with pytest.raises(ConsumerError, match="averagely"):
        new_consumer(cfg.model_copy(update={"allocation": "nope"}))


def test_partition_arguments_are_checked() -> None:
    """pause/seek/mark_consumed take TopicPartition or (topic, partition); anything else fails with
    a clear TypeError; pausing a partition not owned is ignored (a rebalance may have revoked it)."""
    consumer = new_consumer(ConsumerConfig(client_id="x"))
    with pytest.raises(TypeError, match="expected a TopicPartition"):
        consumer.pause(["events/0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="expected a TopicPartition"):
        consumer.mark_consumed(("events", "0"), 1)  # type: ignore[arg-type]
    consumer.pause([("events", 0)])  # type: ignore[list-item]
    assert consumer.paused() == frozenset()
    with pytest.raises(NotAssignedError):
        consumer.seek(TopicPartition("events", 0), 5)


async def test_wait_event_never_swallows_a_cancel() -> None:
    """A loop waiting with wait_event() ends when cancelled just as its event is set (Python 3.11's
    wait_for() loses that cancel, which made stop() hang waiting for the loop)."""
    for _ in range(20):
        event = asyncio.Event()

        async def loop(ev: asyncio.Event = event) -> None:
            while True:
                await wait_event(ev, 10)
                ev.clear()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        event.set()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(2):
                await task
