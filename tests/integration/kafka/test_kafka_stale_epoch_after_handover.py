"""A partition handed back to a daemon that read it before, after a leader change (found by
``make chaos SOURCE=kafka`` seed 152326, issue 28): 14,620 records landed twice.

Real Apache Kafka, three brokers, two daemons in one consumer group sharing one landing. Daemon A
reads both partitions in leader epoch 0, then B joins and takes one of them. The leader of both is
SIGKILLed: epoch 1. The records after that land, the handed-over partition by B. B leaves: A gets its
partition back, at the landing's position (landed by B in epoch 1, which the landing keeps). A must
go on from there: the log was never truncated, so nothing may land twice.

What the chaos run showed (d1, partition 2): "kafka log truncated" with leader_epoch 0,
diverged_at 2120 (where epoch 0 ends), position 4540, found by OffsetsForLeaderEpoch, then "log
incarnation changed ... fetching them again as new records": 2,420 records landed again under a new
incarnation, though the landing's head said leader_epoch 1. The source's per-partition epochs
(log_incarnation.LogIncarnations) outlive the revocation, so ``landed()`` does not adopt the landed
record's epoch (it only does with no epochs seen) and ``epoch_at(position)`` answers the epoch of
the daemon's own last fetch, long before the position.

Reproduced here before the fix (two runs, 21 s each): the handed-back partition (0 in one run, 1 in
the other) had 400 rows for 300 offsets, offsets 100-199 twice, after "kafka log truncated" leader_epoch=0,
diverged_at=100, position=200, found by OffsetsForLeaderEpoch.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce

from mqd.process.daemon import Daemon
from mqd.testing import KafkaCluster
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")

T = "handover"


def _batch(tag: str, n: int) -> list[Produced]:
    return [(i % 2, None, b"%s%d" % (tag.encode(), i), []) for i in range(n)]


@pytest.mark.slow
async def test_a_partition_handed_back_after_a_leader_change_lands_nothing_twice(tmp_path: Path) -> None:
    """The handed-back partition goes on from the landing's position in the landed record's epoch:
    every offset of both partitions lands once (it landed 100 of 300 twice before the fix)."""
    cluster = KafkaCluster(tmp_path / "kafka", 3)
    await asyncio.to_thread(cluster.start)
    landing = tmp_path / "landing"
    consumer = {"mode": "cluster", "group": "handover"}
    a = Daemon(kafka_daemon_config(cluster.bootstrap, tmp_path / "a", topic=T, consumer=consumer,
                                   landing_dir=landing, max_age=0.2))  # fmt: skip
    b = Daemon(kafka_daemon_config(cluster.bootstrap, tmp_path / "b", topic=T, consumer=consumer,
                                   landing_dir=landing, max_age=0.2))  # fmt: skip
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a: asyncio.Task[None] | None = None
    run_b: asyncio.Task[None] | None = None
    per_partition = 0  # records produced to each partition

    def landed() -> int:
        return sum(len(rows) for rows in landed_rows(landing).values())

    def all_landed() -> bool:
        return landed() >= 2 * per_partition

    def one_each() -> bool:
        return len(a.consumer.snapshot().partitions) == 1 and len(b.consumer.snapshot().partitions) == 1

    try:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        new = NewTopic(T, 2, replica_assignment=[[0, 1, 2], [0, 1, 2]], config={"min.insync.replicas": "2"})
        for fut in cluster.admin().create_topics([new]).values():
            await asyncio.to_thread(fut.result, 30)
        await asyncio.to_thread(produce, cluster.bootstrap, _batch("a", 200), topic=T)
        run_a = asyncio.create_task(a.run(stop_a.wait()))
        per_partition = 100
        await wait_until(all_landed, 60, "A landed both partitions in epoch 0")

        run_b = asyncio.create_task(b.run(stop_b.wait()))
        await wait_until(one_each, 60, "one partition each")
        assert await asyncio.to_thread(cluster.leader, T, 0) == 0
        await asyncio.to_thread(cluster.kill_broker, 0)

        async def moved() -> bool:
            leaders = [await asyncio.to_thread(cluster.leader, T, p, 1.0) for p in (0, 1)]
            return all(x not in (None, 0) for x in leaders)

        await wait_until(moved, 30, "both partitions led off broker 0 (leader epoch 1)")
        # the kill may move the group's coordinator and re-form the group, more than once: A may
        # hold both partitions while B re-joins (CI runs under load landed every epoch-1 record by A
        # alone, once even after a wait for one partition each). So epoch-1 records go on being
        # produced, 20 at a time, until B has landed some of them: the hand-over this test is about.
        await wait_until(one_each, 60, "one partition each again")
        rounds = 0
        while b.stats["records_published"] == 0 and rounds < 30:
            rounds += 1
            await asyncio.to_thread(produce, cluster.bootstrap, _batch("b", 20), topic=T)
            per_partition += 10
            await wait_until(all_landed, 60, "the epoch-1 records landed")
        assert b.stats["records_published"] > 0, f"B landed no epoch-1 record in {rounds} rounds"

        stop_b.set()  # B leaves: A gets B's partition back at the landing's position
        await asyncio.wait_for(run_b, 30)
        run_b = None
        await wait_until(lambda: len(a.consumer.snapshot().partitions) == 2, 60, "A owns both again")
        await asyncio.to_thread(produce, cluster.bootstrap, _batch("c", 200), topic=T)
        per_partition += 100
        await wait_until(all_landed, 60, "the records after the handover")
        await asyncio.sleep(2)  # anything landing twice lands now
        totals = a.consumer.snapshot().totals
    except BaseException:
        print(cluster.dump_logs(), file=sys.stderr)
        raise
    finally:
        stop_a.set()
        stop_b.set()
        for run in (run_a, run_b):
            if run is not None:
                await asyncio.wait_for(run, 30)
        await asyncio.to_thread(cluster.stop)
    got = landed_rows(landing)
    for p in range(2):
        offsets = sorted(r[0] for r in got[p])
        assert offsets == list(range(per_partition)), (
            f"partition {p}: {len(offsets)} rows for {per_partition} offsets, "
            f"{len(offsets) - len(set(offsets))} landed twice"
        )
    assert (totals.incarnation_changes, totals.reused_offsets) == (0, 0)
