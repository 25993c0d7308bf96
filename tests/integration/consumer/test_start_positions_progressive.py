"""A partition whose start position takes long does not hold back the partitions assigned with it.

The chaos run's ``lock_freeze`` found it: a new owner took over a partition whose landing lock a
frozen daemon held together with two free ones, and the round waited for the slow partition's lock
bound before assigning any of them. Now each partition is assigned as soon as its start position is
known; the slow one follows when its answer comes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from support.consumer import config, new_consumer
from support.harness import Cluster

from mqd.consumer import StartPosition, TopicPartition
from mqd.consumer.rebalance import GATHER_ANSWERS_S
from mqd.waiting import wait_until

P0, P1, P2 = (TopicPartition("events", p) for p in range(3))


async def test_fast_start_positions_are_assigned_while_a_slow_one_waits(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """The hook for partition 0 blocks until released; partitions 1 and 2 answer at once and are
    assigned (and fetchable) while it blocks; partition 0 is assigned once its answer comes."""
    cluster = cluster_factory(topics={"events": 3}, groups=1)
    release = asyncio.Event()

    async def hook(tp: TopicPartition) -> StartPosition | None:
        if tp == P0:
            await release.wait()  # a landing lock held by a frozen process
        return StartPosition(0)

    consumer = new_consumer(config(cluster, consume_from="first"), start_position=hook)
    start = asyncio.create_task(consumer.start())
    try:
        await wait_until(
            lambda: {P1, P2} <= set(consumer.assignment()), 20, "partitions 1 and 2 assigned while 0 waits"
        )
        assert P0 not in consumer.assignment()
        release.set()
        await asyncio.wait_for(start, 30)
        await wait_until(lambda: P0 in consumer.assignment(), 20, "partition 0 assigned once its answer came")
    finally:
        release.set()
        if not start.done():
            start.cancel()
        await consumer.stop()


class _Assignments:
    """The listener: each round's newly assigned partitions, in order."""

    def __init__(self) -> None:
        self.rounds: list[set[TopicPartition]] = []

    def on_partitions_assigned(self, tps: set[TopicPartition]) -> None:
        self.rounds.append(set(tps))

    def on_partitions_revoked(self, tps: set[TopicPartition]) -> None:
        pass


async def test_answers_that_follow_the_first_closely_are_assigned_with_it(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Partition 0's answer comes first, partitions 1 and 2 answer a fifth of ``GATHER_ANSWERS_S``
    later (a timer on the same loop, due before the gathering's own): the three are assigned in
    one round, so they share one offset lookup and the first fetch, instead of partition 0 first
    and the others after its first answers were decoded."""
    cluster = cluster_factory(topics={"events": 3}, groups=1)
    later = asyncio.Event()

    async def hook(tp: TopicPartition) -> StartPosition | None:
        if tp == P0:
            asyncio.get_running_loop().call_later(GATHER_ANSWERS_S / 5, later.set)
        else:
            await later.wait()
        return StartPosition(0)

    seen = _Assignments()
    consumer = new_consumer(config(cluster, consume_from="first"), start_position=hook, listener=seen)
    try:
        await asyncio.wait_for(consumer.start(), 30)
        await wait_until(lambda: {P0, P1, P2} <= set(consumer.assignment()), 20, "all three assigned")
        assert seen.rounds == [{P0, P1, P2}]
    finally:
        await consumer.stop()
