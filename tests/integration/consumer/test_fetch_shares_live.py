"""A fetch request's bytes go by what exists (mqd.consumer.fetch_shares), against a real node."""

from __future__ import annotations

from typing import Any

from support.consumer import collect, config, count_records, new_consumer, produce, records

from mqd.consumer import TopicPartition
from mqd.wire import format
from mqd.wire.client import BrokerClient


async def test_lone_backlog_takes_the_share_of_a_caught_up_partition(cluster_factory: Any) -> None:
    """Two partitions on one node, only the first with records: once the second is known to be
    caught up, the first takes the whole request (2 x partition_max_bytes, 4 batches) instead of
    its own share (2 batches), so 20 batches take 6 answers, not 10; every record once, in order."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    values = [[f"{b}:{i}".encode().ljust(8) for i in range(10)] for b in range(20)]
    size = len(format.encode_batch(values[0]))
    async with BrokerClient(request_timeout=5) as client:
        for batch in values:
            await produce(client, cluster, 0, batch)
        cfg = config(cluster, partition_max_bytes=2 * size, fetch_max_wait_ms=50)
        async with new_consumer(cfg, client=client) as consumer:
            got = await collect(consumer, lambda b: count_records(b) >= 200)
            requests = sum(consumer.status()["totals"]["requests_per_node"].values())
            tp = TopicPartition("events", 0)
            assert records(got)[tp] == list(enumerate(v for batch in values for v in batch))
            # 1 answer of 2 batches, then 5 of at most 4; one more request may be a long poll
            assert requests <= 7, requests
