"""The producer: partitioner, token bucket, argument checks, and routing against real brokers."""

from __future__ import annotations

import asyncio
import importlib.util
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.harness import Cluster

from mqd import records
from mqd.operator.produce_command import produce_cli
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.metadata import TopicPartition
from mqd.wire.producer import Producer, TokenBucket, _parse_metadata, key_partition, synthetic_values

needs_broker = pytest.mark.skipif(
    importlib.util.find_spec("mqd.broker.server") is None, reason="mqd.broker.server not written yet"
)


# -- pure logic ---------------------------------------------------------------------------------


@given(key=st.binary(max_size=64), n=st.integers(min_value=1, max_value=4096))
def test_key_partition_is_crc32_mod_n(key: bytes, n: int) -> None:
    """A key maps to crc32(key) % n, always a valid partition (same rule in every process)."""
    p = key_partition(key, n)
    assert p == zlib.crc32(key) % n
    assert 0 <= p < n


def test_key_partition_rejects_no_partitions() -> None:
    """Zero partitions is a clear error, not a ZeroDivisionError."""
    with pytest.raises(ValueError, match="partitions"):
        key_partition(b"k", 0)


@settings(max_examples=200)
@given(
    rate=st.floats(min_value=1.0, max_value=1e6),
    burst_factor=st.floats(min_value=0.01, max_value=2.0),
    steps=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=0.5), st.integers(min_value=0, max_value=50_000)),
        min_size=1,
        max_size=40,
    ),
)
def test_token_bucket_never_exceeds_rate_plus_burst(
    rate: float, burst_factor: float, steps: list[tuple[float, int]]
) -> None:
    """Whatever the request pattern, by the time a caller may use its tokens, the total used since
    the start is at most burst + rate * elapsed: the bucket enforces the configured rate."""
    burst = rate * burst_factor
    now = 0.0
    bucket = TokenBucket(rate, burst, now=now)
    used = 0
    for gap, n in steps:
        now += gap
        delay = bucket.reserve(n, now)
        assert delay >= 0
        used += n
        usable_at = now + delay
        assert used <= burst + rate * usable_at + 1e-6 * max(1.0, used)
        now = usable_at  # a well-behaved caller waits before asking again


def test_token_bucket_no_wait_within_burst() -> None:
    """Requests inside the burst are granted at once; the next one waits exactly for its debt."""
    bucket = TokenBucket(1000.0, burst=100.0, now=0.0)
    assert bucket.reserve(60, 0.0) == 0.0
    assert bucket.reserve(40, 0.0) == 0.0
    assert bucket.reserve(50, 0.0) == pytest.approx(0.05)
    # 0.05 s later the debt is paid: the bucket is empty, not negative
    assert bucket.reserve(0, 0.05) == 0.0


def test_token_bucket_rejects_bad_rate() -> None:
    """A zero or negative rate is refused at construction."""
    with pytest.raises(ValueError):
        TokenBucket(0)
    with pytest.raises(ValueError):
        TokenBucket(10, burst=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bootstrap": []}, "at least one"),
        ({"bootstrap": " , "}, "at least one"),
        ({"bootstrap": "127.0.0.1:9400"}, "http"),
        ({"bootstrap": "http://127.0.0.1:1", "acks": "one"}, "acks"),
        ({"bootstrap": "http://127.0.0.1:1", "retry_timeout": -1}, "retry_timeout"),
    ],
)
def test_producer_rejects_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    """Bad bootstrap lists, acks values and retry budgets fail at construction with a clear message."""
    with pytest.raises(ValueError, match=match):
        Producer(**kwargs)


def test_metadata_parsing_rejects_malformed_answers() -> None:
    """A metadata answer without the expected shape is a BrokerError, not a KeyError."""
    with pytest.raises(BrokerError, match="malformed metadata"):
        _parse_metadata({"groups": []})
    with pytest.raises(BrokerError, match="partitions are not"):
        _parse_metadata(
            {
                "groups": [{"name": "g", "nodes": [{"id": "n", "url": "http://h:1", "role": "master"}]}],
                "topics": [{"name": "t", "partitions": [{"partition": 1, "group": "g", "master": "n"}]}],
            }
        )


def test_metadata_routes_to_master() -> None:
    """A partition routes to its group's master URL, with the answering node's liveness view."""
    meta = _parse_metadata(
        {
            "groups": [
                {
                    "name": "broker-a",
                    "nodes": [
                        {"id": "a0", "url": "http://h:1", "role": "master", "alive": False},
                        {"id": "a1", "url": "http://h:2", "role": "slave", "alive": True},
                    ],
                }
            ],
            "topics": [{"name": "t", "partitions": [{"partition": 0, "group": "broker-a", "master": "a0"}]}],
        }
    )
    assert meta.master_url(TopicPartition("t", 0)) == ("http://h:1", False)


def test_synthetic_values_encode_and_decode() -> None:
    """Synthetic values have the asked count and size and survive a batch round trip unchanged."""
    values = synthetic_values(257, 100, 7)
    assert len(values) == 257
    assert pc.binary_length(values).to_numpy().tolist() == [100] * 257
    buf = fmt.encode_batch(values)
    (info,) = fmt.validate(buf)
    assert fmt.to_arrow(buf, info).column("value").equals(values)


async def test_produce_table_rejects_bad_columns() -> None:
    """A table without 'value', or with unknown columns, is refused before anything is sent."""
    producer = Producer("http://127.0.0.1:1")
    with pytest.raises(fmt.BatchError, match="'value'"):
        await producer.produce_table("t", 0, pa.table({"v": [b"x"]}))
    with pytest.raises(fmt.BatchError, match="unexpected"):
        await producer.produce_table("t", 0, pa.table({"value": [b"x"], "extra": [1]}))


def test_produce_cli_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """Bad command-line values give exit code 2 and name the flag."""
    code = produce_cli("http://127.0.0.1:1", "t", -1, 100, 0, 0, 0, "master", None)
    assert code == 2
    err = capsys.readouterr().err
    assert "--count" in err and "--batch" in err


def test_produce_cli_reports_unreachable_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """No broker answering is exit code 1 with an error line, not a traceback."""
    from support.harness import free_port

    code = produce_cli(f"http://127.0.0.1:{free_port()}", "t", 10, 10, 0, 0, 10, "master", None)
    assert code == 1
    assert "no broker answered" in capsys.readouterr().err


# -- against real brokers -----------------------------------------------------------------------


async def _read_all(client: BrokerClient, url: str, topic: str, partition: int) -> pa.Table:
    """Every record of one partition, fetched from ``url`` (bounded number of rounds)."""
    batches: list[pa.RecordBatch] = []
    offset = 0
    for _ in range(1000):
        answer = await client.fetch(
            url,
            [{"topic": topic, "partition": partition, "offset": offset, "max_bytes": 1 << 22}],
            max_wait_ms=0,
        )
        (part,) = answer.partitions
        if not len(part.data):
            break
        for info in fmt.scan(part.data):
            batches.append(fmt.to_arrow(bytes(part.data), info, start_offset=offset))
        offset = part.next_offset
    else:
        raise AssertionError("partition did not drain in 1000 fetches")
    return pa.Table.from_batches(batches, schema=records.RECORD_SCHEMA)


@needs_broker
async def test_send_batch_routes_each_partition_to_its_master(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """Bootstrapped from one group's master, the producer writes each partition on its own group's
    master; records come back with the keys, values and timestamps sent, at dense offsets."""
    cluster = cluster_factory(topics={"events": 4}, groups=2)
    async with Producer(cluster.url(cluster.master(1))) as producer:
        assert producer.partitions_for("events") == 4
        for p in range(4):
            r1 = await producer.send_batch(
                "events", p, [b"a%d" % p, b"b"], keys=[b"k", None], timestamps=[5, 6]
            )
            r2 = await producer.send_batch("events", p, [b"c"])
            assert (r1.base_offset, r1.count, r2.base_offset, r2.max_offset) == (0, 2, 2, 3)
    for p in range(4):
        master = cluster.master(cluster.broker_group_of(p))
        table = await _read_all(client, cluster.url(master), "events", p)
        assert table.column("offset").to_pylist() == [0, 1, 2]
        assert table.column("value").to_pylist() == [b"a%d" % p, b"b", b"c"]
        assert table.column("key").to_pylist()[:2] == [b"k", None]
        assert table.column("timestamp").cast(pa.int64()).to_pylist()[:2] == [5, 6]


@needs_broker
async def test_send_partitions_by_key_hash(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """send() puts every keyed record on crc32(key) % n, keeping per-key order; unkeyed calls
    go round-robin, one partition per call."""
    cluster = cluster_factory(topics={"events": 3})
    keys = [b"user-%d" % (i % 7) for i in range(70)]
    values = [b"v%d" % i for i in range(70)]
    async with Producer(cluster.bootstrap) as producer:
        results = await producer.send("events", values, keys=keys)
        assert sum(r.count for r in results) == 70
        unkeyed = [await producer.send("events", [b"x"]) for _ in range(3)]
    assert sorted(r[0].partition for r in unkeyed) == [0, 1, 2]
    for p in range(3):
        table = await _read_all(client, cluster.bootstrap, "events", p)
        got = [
            (k, v)
            for k, v in zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
            if k is not None
        ]
        want = [(k, v) for k, v in zip(keys, values, strict=True) if zlib.crc32(k) % 3 == p]
        assert got == want


@needs_broker
async def test_produce_table_sends_all_records_in_order(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """produce_table cuts a 25,000-record table into batches and lands every record in order."""
    cluster = cluster_factory(topics={"events": 1})
    values = synthetic_values(25_000, 20, 1)
    ts = pa.array(np.arange(25_000, dtype=np.int64) + 1_700_000_000_000)
    table = pa.table({"value": values, "timestamp": ts})
    async with Producer(cluster.bootstrap) as producer:
        results = await producer.produce_table("events", 0, table, batch_records=10_000)
    assert sum(r.count for r in results) == 25_000
    got = await _read_all(client, cluster.bootstrap, "events", 0)
    assert got.num_rows == 25_000
    assert got.column("value").combine_chunks().equals(values)
    assert got.column("timestamp").cast(pa.int64()).combine_chunks().equals(ts)


@needs_broker
async def test_unknown_topic_and_partition_are_clear_errors(cluster_factory: Callable[..., Cluster]) -> None:
    """Producing to a topic or partition the cluster does not have fails at once, not retriable."""
    cluster = cluster_factory(topics={"events": 2})
    async with Producer(cluster.bootstrap) as producer:
        with pytest.raises(BrokerError) as info:
            await producer.send_batch("nope", 0, [b"x"])
        assert info.value.code == "unknown_topic" and not info.value.retriable
        with pytest.raises(BrokerError) as info:
            await producer.send_batch("events", 2, [b"x"])
        assert info.value.code == "unknown_partition" and not info.value.retriable


@needs_broker
async def test_master_down_is_master_unavailable_then_recovers(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Bootstrapped from a slave, the producer finds the master; with the master killed, a produce
    fails after the bounded retry with a retriable master_unavailable error; once the master is back
    the same producer writes again."""
    cluster = cluster_factory(topics={"events": 1}, slaves=1)
    async with Producer(
        [cluster.url(cluster.slaves(0)[0]), cluster.bootstrap], retry_timeout=0.5
    ) as producer:
        await producer.send_batch("events", 0, [b"before"])
        cluster.kill(cluster.master(0))
        with pytest.raises(BrokerError) as info:
            await producer.send_batch("events", 0, [b"lost"])
        assert info.value.code == "master_unavailable"
        assert info.value.retriable
        cluster.start_node(cluster.master(0))
        result = await producer.send_batch("events", 0, [b"after"])
        assert result.base_offset == 1


@needs_broker
async def test_acks_all_waits_for_the_slave(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """With acks=all the answer comes after the slave holds the records: the slave serves them at once."""
    cluster = cluster_factory(topics={"events": 1}, slaves=1)
    async with Producer(cluster.bootstrap, acks="all") as producer:
        result = await producer.send_batch("events", 0, [b"r1", b"r2"])
    assert result.max_offset == 2
    table = await _read_all(client, cluster.url(cluster.slaves(0)[0]), "events", 0)
    assert table.column("value").to_pylist() == [b"r1", b"r2"]


@needs_broker
async def test_produce_cli_writes_count_records(
    cluster_factory: Callable[..., Cluster], client: BrokerClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mqd produce` with keys and a rate limit writes exactly --count records and prints a summary."""
    cluster = cluster_factory(topics={"events": 3})
    loop = asyncio.get_running_loop()
    code = await loop.run_in_executor(
        None, lambda: produce_cli(cluster.bootstrap, "events", 3000, 50, 50_000, 5, 500, "master", None)
    )
    assert code == 0
    assert "produced 3000 records" in capsys.readouterr().out
    ends = await client.list_offsets(
        cluster.bootstrap, [{"topic": "events", "partition": p, "spec": "latest"} for p in range(3)]
    )
    assert sum(e["offset"] for e in ends) == 3000


@needs_broker
async def test_stale_route_gets_421_and_is_refreshed(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """With metadata that names the slave as master (stale, as after a failover), the slave's
    421 not_master makes the producer reload the layout and write on the real master."""
    cluster = cluster_factory(topics={"events": 1}, slaves=1)
    raw = await client.metadata(cluster.bootstrap)
    for t in raw["topics"]:
        for p in t["partitions"]:
            p["master"] = cluster.slaves(0)[0]
    async with Producer(cluster.bootstrap) as producer:
        producer._meta = _parse_metadata(raw)  # stale routing, the rest is real
        result = await producer.send_batch("events", 0, [b"rerouted"])
        routed, _ = producer._require_meta().master_url(TopicPartition("events", 0))
        assert routed == cluster.url(cluster.master(0))
    assert result.base_offset == 0
    table = await _read_all(client, cluster.url(cluster.master(0)), "events", 0)
    assert table.column("value").to_pylist() == [b"rerouted"]
