"""A node fetcher with nothing in flight looks again after IDLE_RECHECK_S even if no wake-up comes
(mqd/consumer/fetcher.py): a partition made fetchable without waking its fetcher is fetched within
about a second, not never, and the lost wake-up is counted and logged.

The fetcher runs for real on the loop; the source is the mqd broker's with ``fetch`` replaced by a
long poll that records each request. The partition is resumed by clearing its flag directly, which
is what a wake-up lost anywhere in the daemon looks like to the fetcher."""

from __future__ import annotations

import asyncio
from typing import Any

from support.fetch_answers import LAYOUT, TP

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState
from mqd.consumer.fetcher import IDLE_RECHECK_S, FetchManager
from mqd.consumer.source import FetchRequest
from mqd.consumer.subscription_state import OwnedPartition
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.waiting import wait_until
from mqd.wire.metadata import ClusterMetadata


class LongPollSource(MqdBrokerSource):
    """Every fetch is written down and then long-polls until the test ends (cancelled at stop)."""

    def __init__(self, config: ConsumerConfig) -> None:
        super().__init__(config)
        self.metadata.current = ClusterMetadata.parse(LAYOUT)
        self.sent: list[int] = []

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Any:
        self.sent.extend(r.offset for r in requests)
        return asyncio.Event().wait()


async def _paused_partition() -> tuple[LongPollSource, FetchManager, OwnedPartition]:
    """A running fetch manager whose one partition is paused, past its fetcher's first round."""
    config = ConsumerConfig(bootstrap=["http://127.0.0.1:1"])
    source = LongPollSource(config)
    state = SubscriptionState(
        FlowLimits(max_queued_records=10**6, max_offset_span=10**6), ByteBudget(config.max_buffered_bytes)
    )
    manager = FetchManager(config=config, source=source, state=state, jitter=0.0)
    op = state.assign(TP, 0, "m")
    op.paused = True
    manager.start()
    await wait_until(lambda: "m" in manager.fetchers, 5, "the node's fetcher")
    await asyncio.sleep(0)  # its first round: nothing fetchable
    return source, manager, op


def _lost() -> float:
    return metrics.REGISTRY.get_sample_value("mqd_fetch_wakeups_lost_total", {"node": "m"}) or 0.0


async def test_a_partition_made_fetchable_without_a_wake_up_is_fetched_by_the_idle_recheck() -> None:
    """Paused, the partition is not fetched; its flag cleared with no wake-up, the fetcher's idle
    re-check sends it within a few seconds (before: never), and counts one lost wake-up."""
    lost_before = _lost()
    source, manager, op = await _paused_partition()
    try:
        assert source.sent == []
        op.paused = False  # no wake-up: what a lost one looks like
        await wait_until(lambda: source.sent == [0], 4 * IDLE_RECHECK_S + 2, "the idle re-check's fetch")
        assert manager.fetchers["m"].wakeups_lost == 1
        assert _lost() == lost_before + 1
    finally:
        await manager.stop()


async def test_a_woken_fetcher_counts_no_lost_wake_up() -> None:
    """The same resume announced by a wake-up is fetched at once and counts nothing."""
    source, manager, op = await _paused_partition()
    try:
        op.paused = False
        manager.wake("m")
        await wait_until(lambda: source.sent == [0], 2, "the woken fetch")
        assert manager.fetchers["m"].wakeups_lost == 0
    finally:
        await manager.stop()
