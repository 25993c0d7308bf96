"""A partition routed to a node does not wait for that node's long poll (decision 073; the
fetcher's ``_cut_poll``).

One request is in flight per node. Before: when a slave suggested the master for a partition with
a backlog while the master held a long poll over its caught-up partitions, the partition waited
for that poll to end (up to ``fetch_max_wait_ms``, 500 ms): in a burst of the ``hot`` bench shape,
the hot partition went back to its master near the end and stood still for ~190 ms, the machine
idle. The fetchers run for real on the loop; the source answers only when the test says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from support.fetch_answers import batches, layout
from support.held_source import HeldSource

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager
from mqd.waiting import wait_until
from mqd.wire.protocol import Status

HOT = TopicPartition("events", 0)  # read from the slave, behind
QUIET = TopicPartition("events", 1)  # read from the master, at its log end
LAYOUT = layout(partitions=2)


def _hot_asked_of_the_master(source: HeldSource) -> Callable[[], bool]:
    return lambda: source.asked[-1][0] == "m" and HOT in source.asked[-1][1]


def _cuts(node: str) -> float:
    return metrics.REGISTRY.get_sample_value("mqd_fetch_polls_cut_total", {"node": node}) or 0.0


async def _slave_suggests_the_master(
    cuts_long_polls: bool,
) -> tuple[HeldSource, FetchManager, asyncio.Future[Any]]:
    """The master long-polls QUIET; the slave answers HOT's fetch with records and suggests the
    master. Returns once HOT is routed to the master and out of the slave's request, with the
    master's poll as it was sent."""
    config = ConsumerConfig(bootstrap=["http://127.0.0.1:1"])
    source = HeldSource(config, LAYOUT)
    source.cuts_long_polls = cuts_long_polls
    state = SubscriptionState(FlowLimits(), ByteBudget(config.max_buffered_bytes))
    manager = FetchManager(config=config, source=source, state=state, jitter=0.0)
    state.assign(QUIET, 500, "m").log_end = 500
    hot = state.assign(HOT, 500, "s")
    hot.log_end = 10_000
    manager.start()
    await wait_until(lambda: {"m", "s"} <= set(source.pending), 5, "the master's poll and the slave's fetch")
    poll = source.pending["m"]
    assert source.asked[-2:] in ([("m", [QUIET]), ("s", [HOT])], [("s", [HOT]), ("m", [QUIET])])
    source.answer("s", HOT, Status.FOUND, 600, 10_000, batches((500, 100)), suggest="m")
    await wait_until(lambda: hot.pull_node == "m", 5, "HOT routed to the master")
    # the slave had been asked for HOT's next records before that answer was handled (fetch
    # ahead); its answer ends HOT's time there
    await wait_until(lambda: "s" in source.pending, 5, "the slave's fetch ahead")
    source.answer("s", HOT, Status.FOUND, 700, 10_000, batches((600, 100)))
    await wait_until(lambda: "s" not in source.pending and hot.position == 700, 5, "the slave's answer")
    return source, manager, poll


async def test_a_partition_with_a_backlog_routed_to_a_node_cuts_its_long_poll() -> None:
    """The master's poll is cancelled at once and its next request holds both partitions, HOT
    from where the slave's answer left it. Before, nothing was sent to the master until its poll
    ended (here: never, the test does not answer it)."""
    cuts = _cuts("m")
    source, manager, poll = await _slave_suggests_the_master(cuts_long_polls=True)
    try:
        await wait_until(_hot_asked_of_the_master(source), 5, "HOT asked of the master")
        assert poll.cancelled()
        assert sorted(source.asked[-1][1]) == [HOT, QUIET]
        assert manager.state.partitions[HOT].position == 700
        assert _cuts("m") == cuts + 1
    finally:
        await manager.stop()


async def test_a_source_that_cannot_cut_a_poll_keeps_it() -> None:
    """A Kafka broker answers a connection's requests in order, so the Kafka source says it cannot
    cut a poll: the master's poll stays, and HOT goes in its next request once the poll ends."""
    cuts = _cuts("m")
    source, manager, poll = await _slave_suggests_the_master(cuts_long_polls=False)
    try:
        for _ in range(50):  # let every callback and woken fetcher run; none may touch the poll
            await asyncio.sleep(0)
        assert not poll.done() and source.pending["m"] is poll
        source.answer_caught_up("m", QUIET, 500)
        await wait_until(_hot_asked_of_the_master(source), 5, "HOT asked of the master")
        assert _cuts("m") == cuts
    finally:
        await manager.stop()
