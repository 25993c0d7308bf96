"""The consumer against real brokers: node-grouped fetching, pause/revoke races, flow control."""

from __future__ import annotations

import asyncio
from typing import Any

from support.consumer import (
    collect,
    config,
    count_records,
    new_consumer,
    produce,
    produce_numbered,
    records,
    stats,
)

from mqd import metrics
from mqd.consumer import TopicPartition
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient


def metric(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_reads_all_once_with_one_request_per_node(cluster_factory: Any) -> None:
    """16 partitions on 3 groups: every record arrives exactly once and in order; every fetch to a
    node carries all of that node's partitions (one request per node per round) and no node ever
    sees two fetches of ours in flight at once."""
    cluster = cluster_factory(topics={"events": 16}, groups=3)
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, range(16), 30, per_batch=10)
        cfg = config(cluster)
        async with new_consumer(cfg, client=client) as consumer:
            assert len(consumer.assignment()) == 16
            got = await collect(consumer, lambda b: count_records(b) >= 16 * 30)
            by_tp = records(got)
            for p in range(16):
                assert by_tp[TopicPartition("events", p)] == [(i, f"{p}:{i}".encode()) for i in range(30)]
            # a few more rounds while caught up (long polls answered by new data)
            await produce_numbered(client, cluster, [0, 1, 2], 5, start=30)
            more = await collect(consumer, lambda b: count_records(b) >= 15)
            assert count_records(more) == 15
            await wait_until(consumer.caught_up, 10.0, what="caught up")
            # freeze the counts: paused partitions are not fetched, so once the last long poll is
            # answered both sides have seen the same requests
            consumer.pause(consumer.assignment())
            await wait_until(
                lambda: not any(a["in_flight"] for a in consumer.status()["assignment"].values()),
                10.0,
                what="no fetch in flight",
            )
            requests = consumer.status()["totals"]["requests_per_node"]
            for g in range(3):
                node = cluster.master(g)
                s = stats(cluster, node)
                partitions_of_node = len([p for p in range(16) if p % 3 == g])
                assert s["clients"][cfg.client_id]["fetch"] == requests[node] > 1
                assert s["fetch_partitions"] == requests[node] * partitions_of_node
                assert s["inflight_fetch_max_per_client"][cfg.client_id] == 1


async def test_pause_drops_in_flight_answer_and_keeps_position(cluster_factory: Any) -> None:
    """pause() while a long-polling fetch is in flight: the answer that brings new data is dropped,
    the position stays; after resume() the same records arrive once."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    tp = TopicPartition("events", 0)
    async with BrokerClient(request_timeout=5) as client:
        async with new_consumer(config(cluster, fetch_max_wait_ms=2000), client=client) as consumer:
            await wait_until(
                lambda: consumer.status()["assignment"][str(tp)]["in_flight"], 10.0, what="in flight"
            )
            before = metric("mqd_stale_responses_total", reason="paused")
            consumer.pause([tp])
            assert consumer.paused() == {tp}
            await produce(client, cluster, 0, [b"a", b"b", b"c"])
            await wait_until(lambda: metric("mqd_stale_responses_total", reason="paused") > before, 10.0)
            assert consumer.positions()[tp] == 0
            assert consumer.fetched_batches() == []
            consumer.resume([tp])
            got = await collect(consumer, lambda b: count_records(b) >= 3)
            assert records(got)[tp] == [(0, b"a"), (1, b"b"), (2, b"c")]
            assert consumer.positions()[tp] == 3


async def test_revoked_partition_drops_in_flight_answer_and_commits(cluster_factory: Any) -> None:
    """A rebalance that removes a partition while its fetch is in flight: the late answer is
    dropped (not buffered, not delivered) and the partition's marked offset is committed at once
    on revoke (commit_interval is far away)."""
    cluster = cluster_factory(topics={"events": 1, "other": 1}, groups=1)
    other = TopicPartition("other", 0)
    async with BrokerClient(request_timeout=5) as client:
        await produce(client, cluster, 0, [b"x1", b"x2"], topic="other")
        cfg = config(cluster, topics=["events", "other"], fetch_max_wait_ms=5000, commit_interval=600)
        async with new_consumer(cfg, client=client, auto_mark=True) as consumer:
            got = await collect(consumer, lambda b: count_records(b) >= 2)
            assert records(got)[other] == [(0, b"x1"), (1, b"x2")]
            await wait_until(lambda: consumer.status()["assignment"][str(other)]["in_flight"], 10.0)
            node = consumer.status()["assignment"][str(other)]["pull_node"]
            before = metric("mqd_stale_responses_total", reason="revoked")
            consumer.update_config(cfg.model_copy(update={"topics": ["events"]}))
            await wait_until(lambda: other not in consumer.assignment(), 10.0, what="revoke")
            assert consumer.status()["nodes"][node]["in_flight"]  # the old fetch is still out
            committed = await client.committed(cluster.bootstrap, cfg.group, [])
            assert {"topic": "other", "partition": 0, "offset": 2} in committed
            await produce(client, cluster, 0, [b"late"], topic="other")
            await wait_until(lambda: metric("mqd_stale_responses_total", reason="revoked") > before, 10.0)
            assert all(b.tp != other for b in consumer.fetched_batches())
            assert consumer.status()["totals"]["buffered_records"] == 0


async def test_flow_control_holds_partition_until_drained(cluster_factory: Any) -> None:
    """Over max_queued_records the partition is not fetched again until it drains; draining
    resumes fetching and every record still arrives once, in order."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    tp = TopicPartition("events", 0)
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, [0], 600, per_batch=10)
        cfg = config(cluster, max_queued_records=100, partition_max_bytes=2048, fetch_max_wait_ms=100)
        async with new_consumer(cfg, client=client) as consumer:

            def settled_hold() -> bool:
                # a fetch sent before the hold may still answer after it (CI: 170 records buffered,
                # then 220 with no request sent in between): the hold is judged once none is out
                part = consumer.status()["assignment"][str(tp)]
                return bool(part["flow_control"] == "records" and not part["in_flight"])

            await wait_until(settled_hold, 10.0, what="hold, no fetch in flight")
            held = consumer.status()
            buffered = held["totals"]["buffered_records"]
            assert 100 < buffered < 600
            # while held, no fetch goes out and nothing more is buffered
            requests = held["totals"]["requests_per_node"]
            await asyncio.sleep(0.3)
            assert consumer.status()["totals"]["requests_per_node"] == requests
            assert consumer.status()["totals"]["buffered_records"] == buffered
            got = await collect(consumer, lambda b: count_records(b) >= 600)
            assert records(got)[tp] == [(i, f"0:{i}".encode()) for i in range(600)]
            assert metric("mqd_flow_control_events_total", reason="records") > 0


async def test_drained_hot_partition_is_fetched_again_without_waiting_the_retry(cluster_factory: Any) -> None:
    """A hot partition held by flow control is fetched again as soon as it is drained: with a
    retry interval of 10 minutes, draining 600 records through many holds still finishes in
    seconds, so the drain (not the retry timer) lifted each hold. One answer alone (here larger
    than max_queued_records) does not hold the partition: it is fetched again before the drain."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    tp = TopicPartition("events", 0)
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, [0], 600, per_batch=10)
        cfg = config(
            cluster,
            max_queued_records=5,
            partition_max_bytes=2048,
            fetch_max_wait_ms=100,
            flow_control_retry_ms=600_000,
        )
        async with new_consumer(cfg, client=client) as consumer:
            await wait_until(
                lambda: consumer.status()["assignment"][str(tp)]["flow_control"] == "records",
                10.0,
                what="hold",
            )
            held = consumer.status()["totals"]["buffered_records"]
            assert held > 5  # two answers buffered: the first (over the threshold) did not hold
            got = await collect(consumer, lambda b: count_records(b) >= 600, timeout=20.0)
            assert records(got)[tp] == [(i, f"0:{i}".encode()) for i in range(600)]


async def test_buffered_bytes_never_exceed_budget(cluster_factory: Any) -> None:
    """With a small daemon-wide budget and no draining, buffered bytes rise to the budget and never
    above it; once drained, everything arrives."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    budget = 6000
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, range(4), 200, per_batch=10)
        cfg = config(cluster, max_buffered_bytes=budget, fetch_max_wait_ms=100)
        async with new_consumer(cfg, client=client) as consumer:
            peak = 0
            for _ in range(50):  # sample for ~0.5 s while nobody drains
                peak = max(peak, consumer.status()["totals"]["buffered_bytes"])
                assert peak <= budget
                await asyncio.sleep(0.01)
            assert peak > budget // 2
            got: list[Any] = []
            for _ in range(500):
                assert consumer.status()["totals"]["buffered_bytes"] <= budget
                got.extend(consumer.fetched_batches(max_bytes=1000))
                if count_records(got) >= 800:
                    break
                await consumer.wait_for_data(0.2)
            by_tp = records(got)
            for p in range(4):
                assert by_tp[TopicPartition("events", p)] == [(i, f"{p}:{i}".encode()) for i in range(200)]


async def test_corrupt_batch_parks_only_its_partition(cluster_factory: Any) -> None:
    """A stored batch damaged on the broker's disk (CRC mismatch) is retried with backoff, then
    its partition is parked at the bad batch and reported; other partitions keep flowing, and a
    seek past the damage releases it."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    tp, healthy = TopicPartition("events", 0), TopicPartition("events", 1)
    async with BrokerClient(request_timeout=5) as client:
        await produce(client, cluster, 0, [b"first"])
        bad = await produce(client, cluster, 0, [b"CORRUPT-ME"])
        after = await produce(client, cluster, 0, [b"after"])
        node = cluster.master(0)
        segments = list((cluster.nodes[node].data_dir / "logs" / "events-0").glob("*.log"))
        assert len(segments) == 1
        raw = bytearray(segments[0].read_bytes())
        at = raw.index(b"CORRUPT-ME")
        raw[at] ^= 0xFF
        segments[0].write_bytes(bytes(raw))
        async with new_consumer(config(cluster, check_crc=True), client=client) as consumer:
            await wait_until(lambda: consumer.status()["assignment"][str(tp)]["parked"], 10.0, what="parked")
            status = consumer.status()["assignment"][str(tp)]
            assert "CRC mismatch" in status["parked"]
            assert consumer.positions()[tp] == bad.base_offset
            await produce(client, cluster, 1, [b"other"])
            got = await collect(consumer, lambda b: any(x.tp == healthy for x in b))
            assert records(got)[tp] == [(0, b"first")]
            consumer.seek(tp, after.base_offset)
            got = await collect(consumer, lambda b: count_records(b) >= 1)
            assert records(got)[tp] == [(after.base_offset, b"after")]


async def test_a_partition_parked_on_corrupt_data_resumes_once_the_data_is_repaired(
    cluster_factory: Any,
) -> None:
    """A partition parked on undecodable data is probed again (error_backoff_max_ms) without a seek:
    once the stored batch is repaired, its records land from the parked offset on, none skipped."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    tp = TopicPartition("events", 0)
    async with BrokerClient(request_timeout=5) as client:
        await produce(client, cluster, 0, [b"first"])
        bad = await produce(client, cluster, 0, [b"CORRUPT-ME"])
        segment = next((cluster.nodes[cluster.master(0)].data_dir / "logs" / "events-0").glob("*.log"))
        intact = segment.read_bytes()
        raw = bytearray(intact)
        raw[raw.index(b"CORRUPT-ME")] ^= 0xFF
        segment.write_bytes(bytes(raw))
        cfg = config(cluster, check_crc=True, error_backoff_max_ms=300)
        async with new_consumer(cfg, client=client) as consumer:
            await wait_until(lambda: consumer.status()["assignment"][str(tp)]["parked"], 10.0, what="parked")
            segment.write_bytes(intact)
            got = await collect(consumer, lambda b: any(x.next_offset > bad.base_offset for x in b))
            assert (bad.base_offset, b"CORRUPT-ME") in records(got)[tp]
            assert consumer.status()["assignment"][str(tp)]["parked"] is None
