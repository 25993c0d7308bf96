"""Start positions and illegal offsets against real brokers: consume_from, the offset store, the
start_position hook and every on_offset_reset policy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.consumer import (
    collect,
    config,
    count_records,
    master_url,
    new_consumer,
    produce,
    produce_numbered,
    records,
)

from mqd import metrics
from mqd.consumer import TopicPartition
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

P0, P1, P2 = (TopicPartition("events", p) for p in range(3))


def resets(tp: TopicPartition, status: str) -> float:
    labels = {"topic": tp.topic, "partition": str(tp.partition), "status": status}
    return metrics.REGISTRY.get_sample_value("mqd_offset_resets_total", labels) or 0.0


@pytest.fixture
async def retained(cluster_factory: Any) -> Any:
    """One group, 3 partitions: P0 holds offsets 0..19, P1 is empty, P2 lost its head to retention
    (log start > 0)."""
    cluster = cluster_factory(
        topics={"events": 3},
        groups=1,
        node_settings={
            "storage": {"segment_bytes": 4096, "retention_bytes": 4096, "retention_check_interval_ms": 100}
        },
    )
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, [0], 20, per_batch=10)
        for _ in range(30):
            await produce(client, cluster, 2, [b"v" * 100] * 10)
        url = master_url(cluster, 2)

        async def log_start() -> int:
            rows = await client.list_offsets(url, [{"topic": "events", "partition": 2, "spec": "earliest"}])
            return int(rows[0]["offset"])

        # retention runs every 100 ms: wait until the log start is past 0 and stays put
        seen: list[int] = []
        for _ in range(100):
            seen.append(await log_start())
            if len(seen) >= 4 and seen[-1] > 0 and len(set(seen[-4:])) == 1:
                break
            await asyncio.sleep(0.1)
        lo = seen[-1]
        assert lo > 0 and len(set(seen[-4:])) == 1, f"retention did not settle: {seen}"
        yield cluster, client, lo, 300


@pytest.mark.parametrize("policy", ["broker", "earliest", "latest", "fail"])
async def test_illegal_offsets_follow_policy(retained: Any, policy: str) -> None:
    """OVERFLOW_BADLY (P0 at 100), NO_MESSAGE_IN_QUEUE at offset 5 (empty P1) and OFFSET_TOO_SMALL
    (P2 at 0, below the log start): each policy moves (or parks) exactly as documented, every
    illegal offset is counted, and no record is skipped or replayed silently."""
    cluster, client, lo, hi = retained
    starts = {P0: 100, P1: 5, P2: 0}

    async def hook(tp: TopicPartition) -> int | None:
        return starts.get(tp)

    illegal = {P0: "OFFSET_OVERFLOW_BADLY", P1: "NO_MESSAGE_IN_QUEUE", P2: "OFFSET_TOO_SMALL"}
    counted = {tp: resets(tp, status) for tp, status in illegal.items()}
    cfg = config(cluster, on_offset_reset=policy)
    async with new_consumer(cfg, client=client, start_position=hook) as consumer:
        if policy == "fail":
            await wait_until(lambda: len(consumer.status()["totals"]["parked"]) == 3, 10.0, what="parked")
            assert consumer.positions() == starts
            assert consumer.fetched_batches() == []
            assert "OFFSET_OVERFLOW_BADLY" in consumer.status()["assignment"]["events/0"]["parked"]
        else:
            expected = {P0: 20, P1: 0, P2: hi}
            await wait_until(lambda: consumer.positions() == expected, 10.0, what=f"positions {expected}")
            got = records(consumer.fetched_batches())
            if policy == "latest":
                assert got == {}
            else:
                assert [o for o, _ in got[P0]] == list(range(20))
                assert [o for o, _ in got[P2]] == list(range(lo, hi))
        for tp, status in illegal.items():
            assert resets(tp, status) == counted[tp] + 1, (tp, status)

        if policy == "fail":
            consumer.seek(P0, 0)  # an explicit seek releases a parked partition
            after_seek = await collect(consumer, lambda b: count_records(b) >= 20)
            assert [o for o, _ in records(after_seek)[P0]] == list(range(20))
        elif policy in ("broker", "earliest"):
            # OVERFLOW_BADLY with log start > 0: the broker says log end, earliest says log start
            before = resets(P2, "OFFSET_OVERFLOW_BADLY")
            consumer.seek(P2, 10**6)
            await wait_until(lambda: resets(P2, "OFFSET_OVERFLOW_BADLY") > before, 10.0, what="reset")
            if policy == "broker":
                await wait_until(lambda: consumer.positions()[P2] == hi, 10.0)
                assert consumer.fetched_batches() == []
            else:
                again = await collect(consumer, lambda b: count_records(b) >= hi - lo)
                assert [o for o, _ in records(again)[P2]] == list(range(lo, hi))


async def test_consume_from_and_offset_store_precedence(cluster_factory: Any) -> None:
    """A fresh group starts at consume_from (first / timestamp / last); a group with a committed
    offset starts there whatever consume_from says; the start_position hook beats both."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    tp = TopicPartition("events", 0)
    async with BrokerClient(request_timeout=5) as client:
        await produce(client, cluster, 0, [b"old"] * 10, timestamp=1_000_000)
        await produce(client, cluster, 0, [b"new"] * 10, timestamp=2_000_000)

        async with new_consumer(config(cluster, group="first", consume_from="first"), client=client) as c:
            assert c.positions() == {tp: 0}
        ts_cfg = config(cluster, group="ts", consume_from="timestamp", consume_timestamp_ms=1_500_000)
        async with new_consumer(ts_cfg, client=client) as c:
            assert c.positions() == {tp: 10}
            got = await collect(c, lambda b: count_records(b) >= 10)
            assert {v for _, v in records(got)[tp]} == {b"new"}
        last = config(cluster, group="last", consume_from="last")
        async with new_consumer(last, client=client, auto_mark=True) as c:
            assert c.positions() == {tp: 20}
            await produce(client, cluster, 0, [b"x"])
            got = await collect(c, lambda b: count_records(b) >= 1)
            assert records(got)[tp] == [(20, b"x")]
        # stop() committed 21: the same group resumes there, not at the log end
        await produce(client, cluster, 0, [b"y"])
        async with new_consumer(last.model_copy(update={"client_id": "other"}), client=client) as c:
            assert c.positions() == {tp: 21}

        async def hook(_: TopicPartition) -> int:
            return 3

        async with new_consumer(
            last.model_copy(update={"client_id": "h"}), client=client, start_position=hook
        ) as c:
            assert c.positions() == {tp: 3}
            # offset 3 is inside the first stored batch (0..9): the records before it are cut
            cut = await collect(c, lambda b: count_records(b) >= 19)
            assert [o for o, _ in records(cut)[tp]] == list(range(3, 22))
