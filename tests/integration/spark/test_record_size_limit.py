"""One record-size limit end to end (issue 12, case 8), on real broker processes: the broker
answers 413 record_too_large, the producer refuses before sending, and the daemon's consumer
parks the partition holding such a record instead of landing a file Spark cannot read."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.consumer import collect, config, new_consumer, produce, records
from support.harness import Cluster

from mqd.config import DEFAULT_MAX_RECORD_BYTES
from mqd.consumer import TopicPartition
from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.producer import Producer

MiB = 1024 * 1024
BIG = DEFAULT_MAX_RECORD_BYTES + 1


async def test_broker_refuses_a_record_above_the_default_limit_with_413(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """With default limits the broker accepts a record of exactly max_record_bytes (key + value +
    headers) and answers 413 record_too_large, naming the record and the limit, for one byte more,
    writing nothing of that request; the 64 MiB request limit alone accepted it before."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    url = cluster.url(cluster.master(0))
    async with BrokerClient(request_timeout=30) as client:
        key, header = b"k" * 10, ("h", b"x" * 20)
        fits = fmt.encode_batch(
            [b"a", b"v" * (DEFAULT_MAX_RECORD_BYTES - 31)], keys=[None, key], headers=[[], [header]]
        )
        assert (await client.produce(url, "events", 0, fits)).count == 2
        over = fmt.encode_batch(
            [b"a", b"v" * (DEFAULT_MAX_RECORD_BYTES - 30)], keys=[None, key], headers=[[], [header]]
        )
        with pytest.raises(BrokerError) as err:
            await client.produce(url, "events", 0, over)
        assert (err.value.status, err.value.code, err.value.retriable) == (413, "record_too_large", False)
        assert "record 1 of the request" in str(err.value) and str(DEFAULT_MAX_RECORD_BYTES) in str(err.value)
        assert err.value.body["size"] == DEFAULT_MAX_RECORD_BYTES + 1
        assert (await client.produce(url, "events", 0, fmt.encode_batch([b"next"]))).base_offset == 2


@pytest.fixture
def roomy_cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    """A broker whose own limit is above the default, so only the client side or the daemon's
    limit can refuse a record."""
    return cluster_factory(
        topics={"events": 2}, groups=1, node_settings={"limits": {"max_record_bytes": 64 * MiB}}
    )


async def test_producer_refuses_a_too_large_record_before_sending(roomy_cluster: Cluster) -> None:
    """The producer's default limit is the broker's default: a larger record raises
    record_too_large without a request (the broker, which would take it, holds nothing), and a
    smaller one in the same call pattern is sent."""
    async with Producer(roomy_cluster.bootstrap) as producer:
        with pytest.raises(BrokerError) as err:
            await producer.send_batch("events", 0, [b"small", b"x" * BIG])
        assert (err.value.status, err.value.code, err.value.retriable) == (413, "record_too_large", False)
        assert "events/0: record 1 of the request" in str(err.value)
        assert (await producer.send_batch("events", 0, [b"small"])).base_offset == 0


async def test_daemon_parks_the_partition_of_a_too_large_record(roomy_cluster: Cluster) -> None:
    """A record above consumer.max_record_bytes (written by a broker configured with a larger
    limit) parks its partition at that record's batch, with the offset, size and limit in the
    status; records before it are fetched, the other partition keeps flowing."""
    tp, healthy = TopicPartition("events", 0), TopicPartition("events", 1)
    async with BrokerClient(request_timeout=30) as client:
        await produce(client, roomy_cluster, 0, [b"first"])
        big = await produce(client, roomy_cluster, 0, [b"x" * 300_000])
        await produce(client, roomy_cluster, 0, [b"after"])
        await produce(client, roomy_cluster, 1, [b"other"])
        cfg = config(roomy_cluster, max_record_bytes=200_000)
        async with new_consumer(cfg, client=client) as consumer:
            got = await collect(
                consumer, lambda b: any(x.tp == healthy for x in b) and any(x.tp == tp for x in b)
            )
            await wait_until(lambda: consumer.status()["assignment"][str(tp)]["parked"], 10.0, what="parked")
            parked = consumer.status()["assignment"][str(tp)]["parked"]
            assert f"events/0 record at offset {big.base_offset} is 300000 bytes" in parked
            assert "200000" in parked
            assert consumer.positions()[tp] == big.base_offset
            assert records(got)[tp] == [(0, b"first")]
            assert records(got)[healthy] == [(0, b"other")]
