"""Daemons sharing a Kafka topic through Kafka's consumer-group protocol (Tansu and Apache Kafka as
the coordinator, mqd's allocation strategy as the assignor): joining and leaving under load lose and duplicate
nothing in their shared landing directory; static membership keeps a restarted member's share."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from support.consumer import new_consumer
from support.kafka import Broker, Produced, is_kafka, kafka_daemon_config, landed_rows, produce

from mqd.consumer import Consumer
from mqd.process.daemon import Daemon
from mqd.sources.kafka.group import KafkaGroup
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")

PARTITIONS = 6


def group_daemon(
    broker: Broker, topic: str, root: Path, landing: Path, name: str, **kafka: str | bool
) -> Daemon:
    consumer = {"mode": "cluster", "group": f"landing-{topic}", "client_id": name, "kafka": kafka}
    return Daemon(
        kafka_daemon_config(
            broker.bootstrap, root / name, topic=topic, consumer=consumer, landing_dir=landing, max_age=0.3
        )
    )


async def test_two_daemons_join_and_leave_under_load_exactly_once(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """A lands alone, B joins while records keep coming (the group splits the partitions), B leaves
    (A takes them all back): every produced record lands exactly once, offsets contiguous."""
    broker.create_topic(topic, PARTITIONS)
    landing = tmp_path / "landing"
    chunks: list[list[Produced]] = [
        [(i % PARTITIONS, None, b"%d" % i, []) for i in range(c * 5000, (c + 1) * 5000)] for c in range(6)
    ]
    a = group_daemon(broker, topic, tmp_path, landing, "a")
    b = group_daemon(broker, topic, tmp_path, landing, "b")
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    run_a = asyncio.create_task(a.run(stop_a.wait()))
    try:
        await asyncio.to_thread(produce, broker.bootstrap, chunks[0], topic=topic)
        run_b = asyncio.create_task(b.run(stop_b.wait()))
        await asyncio.to_thread(produce, broker.bootstrap, chunks[1], topic=topic)
        await wait_until(
            lambda: (
                0 < len(b.consumer.assignment()) < PARTITIONS and len(a.consumer.assignment()) < PARTITIONS
            ),
            30,
            "the group split the partitions between a and b",
        )
        for chunk in chunks[2:4]:
            await asyncio.to_thread(produce, broker.bootstrap, chunk, topic=topic)
        stop_b.set()
        await asyncio.wait_for(run_b, 30)
        for chunk in chunks[4:]:
            await asyncio.to_thread(produce, broker.bootstrap, chunk, topic=topic)
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


async def test_group_instance_id_keeps_a_restarted_members_share(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """static_membership makes a member static (KIP-345): stopped, it does not leave, so the member
    that stayed keeps its generation and its partitions through heartbeats while the other is away
    (a leave would have re-formed the group around it alone) and never holds more than its share;
    restarted with another client id (another member id, sorting elsewhere), the static member gets
    the same partitions back, since the strategy runs over the instance ids."""
    broker.create_topic(topic, 4)

    def member(client_id: str, instance: str) -> Consumer:
        cfg = kafka_daemon_config(
            broker.bootstrap,
            tmp_path / client_id,
            topic=topic,
            consumer={
                "mode": "cluster",
                "group": f"g-{topic}",
                "client_id": client_id,
                "heartbeat_interval": "0.5s",
                "kafka": {"group_instance_id": instance, "static_membership": True},
            },
        ).consumer
        return new_consumer(cfg)

    zeta, alpha = member("a-first", "zeta"), member("b-second", "alpha")
    await zeta.start()
    await alpha.start()
    most_alpha_held = 0
    watching = True

    async def watch_alpha() -> None:
        nonlocal most_alpha_held
        while watching:
            most_alpha_held = max(most_alpha_held, len(alpha.assignment()))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_alpha())
    try:
        await wait_until(lambda: len(zeta.assignment()) == len(alpha.assignment()) == 2, 30, "split")
        before = (zeta.assignment(), alpha.assignment())
        assert {tp.partition for tp in before[1]} == {0, 1}  # "alpha" sorts first, whatever the ids
        generation = alpha.snapshot().member_version
        await zeta.stop()
        stopped = time.monotonic()
        group = alpha._membership  # its heartbeat clock: no public view needed elsewhere
        assert isinstance(group, KafkaGroup)
        await wait_until(
            lambda: (group.last_success or 0) > stopped + 1.5, 30, "alpha heartbeats on without zeta"
        )
        assert alpha.snapshot().member_version == generation and alpha.assignment() == before[1]
        zeta = member("c-restarted", "zeta")  # its member id now sorts after alpha's
        await zeta.start()
        await wait_until(lambda: len(zeta.assignment()) == len(alpha.assignment()) == 2, 30, "rejoined")
        assert (zeta.assignment(), alpha.assignment()) == before
        assert most_alpha_held == 2
    finally:
        watching = False
        await watcher
        await zeta.stop()
        await alpha.stop()


async def test_two_daemons_with_one_instance_id_still_land_exactly_once(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """A misconfiguration: a second live static daemon with the first one's group_instance_id. Apache
    Kafka gives the instance id to the newcomer; the first one's next heartbeat (v1: it names no
    instance id) is answered UNKNOWN_MEMBER_ID, and its rejoin under its old member id
    FENCED_INSTANCE_ID: it owns nothing from then on and its heartbeat error names the instance id,
    while the newcomer owns every partition. (Rejoining as a new member instead took the instance id
    back, and the two replaced each other for good.) Tansu cannot fence: it hands the second the
    first one's member id, so both own every partition and both fetch and publish the same records.
    Either way the landing's conditional publication keeps every record exactly once."""
    broker.create_topic(topic, PARTITIONS)
    landing = tmp_path / "landing"
    records: list[Produced] = [(i % PARTITIONS, None, b"%d" % i, []) for i in range(12_000)]
    twins = [
        group_daemon(broker, topic, tmp_path, landing, name, group_instance_id="same", static_membership=True)
        for name in ("a", "b")
    ]
    stops = [asyncio.Event(), asyncio.Event()]
    runs: list[asyncio.Task[None]] = []

    def fenced(d: Daemon) -> bool:
        group = d.consumer._membership  # the fenced flag: no public view needed elsewhere
        return isinstance(group, KafkaGroup) and group.fenced

    def owned() -> list[int]:
        return [len(d.consumer.assignment()) for d in twins]

    try:
        runs.append(asyncio.create_task(twins[0].run(stops[0].wait())))
        await wait_until(lambda: owned()[0] == PARTITIONS, 60, "a owns every partition")
        runs.append(asyncio.create_task(twins[1].run(stops[1].wait())))
        if is_kafka(broker):
            await wait_until(
                lambda: owned() == [0, PARTITIONS] and fenced(twins[0]), 60, "a fenced, b owning everything"
            )
            assert "'same'" in str(twins[0].consumer.snapshot().errors.heartbeat)
        else:
            await wait_until(lambda: owned() == [PARTITIONS, PARTITIONS], 60, "both own every partition")
        await asyncio.to_thread(produce, broker.bootstrap, records, topic=topic)
        await wait_until(
            lambda: sum(len(r) for r in landed_rows(landing).values()) >= len(records),
            60,
            "everything landed",
        )
        if is_kafka(broker):
            assert owned() == [0, PARTITIONS] and fenced(twins[0]), "the fenced twin came back"
    finally:
        for s in stops:
            s.set()
        for run in runs:
            await asyncio.wait_for(run, 30)
    got = landed_rows(landing)
    for p in range(PARTITIONS):
        offsets = sorted(r[0] for r in got[p])
        assert offsets == list(range(len(records) // PARTITIONS)), f"partition {p}: lost or duplicated"


async def test_sticky_moves_only_what_a_member_change_must(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """With ``allocation = "sticky"`` each member names what it owns when the group re-forms: a third
    member joining takes one partition from each of the other two and nothing moves between them;
    when it leaves, they take back its two and keep their own."""
    broker.create_topic(topic, 6)

    def member(name: str) -> Consumer:
        cfg = kafka_daemon_config(
            broker.bootstrap,
            tmp_path / name,
            topic=topic,
            consumer={
                "mode": "cluster",
                "group": f"sticky-{topic}",
                "client_id": name,
                "allocation": "sticky",
            },
        ).consumer
        return new_consumer(cfg)

    a, b, c = member("a"), member("b"), member("c")
    await a.start()
    await b.start()
    try:
        await wait_until(lambda: len(a.assignment()) == len(b.assignment()) == 3, 30, "a and b split 6")
        a1, b1 = a.assignment(), b.assignment()
        # status names each partition's leader from Kafka's metadata (Tansu: one node, read there)
        leaders = [(p.leader, p.pull_node) for p in a.snapshot().partitions]
        assert len(leaders) == 3 and all(lead is not None and lead == node for lead, node in leaders)
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
