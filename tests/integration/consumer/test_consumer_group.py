"""Group membership and rebalance with real brokers; broadcast mode with local offset files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.consumer import collect, config, count_records, new_consumer, produce_numbered, records

from mqd.consumer import Consumer, TopicPartition
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

PARTITIONS = 12
ALL = {TopicPartition("events", p) for p in range(PARTITIONS)}


def stable(consumers: list[Consumer]) -> bool:
    """Every member sees the same member list (all of them), and the assignments partition ALL."""
    ids = sorted(c.client_id for c in consumers)
    if any(c.status()["members"] != ids for c in consumers):
        return False
    owned = [c.assignment() for c in consumers]
    return sum(len(o) for o in owned) == PARTITIONS and set().union(*owned) == ALL


@pytest.mark.parametrize("allocation", ["averagely", "consistent-hash"])
async def test_members_join_and_leave_each_partition_owned_once(
    cluster_factory: Any, allocation: str
) -> None:
    """Three consumers join one by one, then two leave: at every stable point each partition is
    owned by exactly one member, and averagely balances them within one partition."""
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=2)
    async with BrokerClient(request_timeout=5) as client:
        running: list[Consumer] = []
        try:
            for _ in range(3):
                c = new_consumer(
                    config(cluster, allocation=allocation, rebalance_interval=1.0), client=client
                )
                await c.start()
                running.append(c)
                await wait_until(lambda: stable(running), timeout=10, what=f"{len(running)} members stable")
                if allocation == "averagely":
                    sizes = [len(c.assignment()) for c in running]
                    assert max(sizes) - min(sizes) <= 1
            for _ in range(2):
                await running.pop(0).stop()  # leaves the group: the others rebalance at once
                await wait_until(lambda: stable(running), timeout=10, what=f"{len(running)} members stable")
            assert running[0].assignment() == ALL
        finally:
            for c in running:
                await c.stop()


async def test_handover_resumes_from_committed_offsets(cluster_factory: Any) -> None:
    """A member that joins takes over partitions at the offsets the previous owner committed:
    records produced before and after the handover are each delivered once across the group."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    tps = {TopicPartition("events", p) for p in range(4)}
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, range(4), 20)
        first = new_consumer(config(cluster), client=client, auto_mark=True)
        second = new_consumer(config(cluster), client=client, auto_mark=True)
        try:
            await first.start()
            got = await collect(first, lambda b: count_records(b) >= 80)
            await first.commit()
            await second.start()
            await wait_until(lambda: stable_pair(first, second, tps), 10.0, what="two members stable")
            await produce_numbered(client, cluster, range(4), 5, start=20)
            later = []
            for _ in range(100):
                later += first.fetched_batches() + second.fetched_batches()
                if count_records(later) >= 20:
                    break
                await first.wait_for_data(0.1)
            by_tp = records(got + later)
            for tp in tps:
                assert by_tp[tp] == [(i, f"{tp.partition}:{i}".encode()) for i in range(25)]
        finally:
            await first.stop()
            await second.stop()


def stable_pair(a: Consumer, b: Consumer, tps: set[TopicPartition]) -> bool:
    return (
        len(a.status()["members"]) == 2
        and a.assignment() | b.assignment() == tps
        and not (a.assignment() & b.assignment())
    )


async def test_broadcast_every_member_reads_everything_and_offsets_survive(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """Broadcast mode: two consumers each own every partition and read every record; offsets kept
    in each one's local file bring a restarted consumer back exactly where it stopped."""
    cluster = cluster_factory(topics={"events": 4}, groups=2)
    tps = {TopicPartition("events", p) for p in range(4)}
    files = [tmp_path / "a" / "offsets.json", tmp_path / "b" / "offsets.json"]
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, range(4), 10)
        cfgs = [
            config(cluster, mode="broadcast", offset_file=f, client_id=f"b{i}") for i, f in enumerate(files)
        ]
        for cfg in cfgs:
            async with new_consumer(cfg, client=client, auto_mark=True) as c:
                assert c.assignment() == tps
                got = await collect(c, lambda b: count_records(b) >= 40)
                assert count_records(got) == 40
        assert all(f.exists() for f in files)
        await produce_numbered(client, cluster, range(4), 3, start=10)
        async with new_consumer(cfgs[0], client=client, auto_mark=True) as c:
            assert c.positions() == {tp: 10 for tp in tps}
            got = await collect(c, lambda b: count_records(b) >= 12)
            by_tp = records(got)
            for tp in tps:
                assert by_tp[tp] == [(i, f"{tp.partition}:{i}".encode()) for i in range(10, 13)]
