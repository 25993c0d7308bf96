"""mqd.testing.KafkaCluster: real Apache Kafka brokers (KRaft) on 127.0.0.1, with records produced by
a real client (confluent-kafka) and read back by an mqd daemon through the Kafka source."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from aiokafka.protocol import api as aiokafka_api
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce
from support.servers import serving

from mqd.process.daemon import Daemon
from mqd.testing import KafkaCluster
from mqd.waiting import wait_until, wait_until_sync

pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """One broker for the module; its log is printed at teardown when a test failed meanwhile."""
    with serving(request, KafkaCluster(tmp_path_factory.mktemp("kafka"))) as cluster:
        yield cluster


def test_one_broker_answers_as_kafka_4(kafka: KafkaCluster) -> None:
    """The broker is a Kafka 4 broker on 127.0.0.1: it leads what it hosts, and its ApiVersions
    answer has KIP-896's raised floors (no Fetch below v4, no ListOffsets v0; Produce v0-v2 were
    kept for old librdkafka clients)."""
    assert kafka.bootstrap == f"127.0.0.1:{kafka.brokers[0].port}"
    versions = kafka.api_versions()
    assert versions[1][0] == 4 and versions[2][0] == 1, versions
    kafka.create_topic("admin-check", 3)
    assert [kafka.leader("admin-check", p) for p in range(3)] == [0, 0, 0]
    assert kafka.leader("admin-check", 7) is None


def test_a_deleted_topic_is_gone_and_can_be_made_again(kafka: KafkaCluster) -> None:
    """delete_topic returns once the metadata no longer lists the topic, so the same name can be
    created again at once (Kafka refuses a name still marked for deletion)."""
    kafka.create_topic("recreated", 2)
    kafka.delete_topic("recreated")
    assert kafka.leader("recreated", 0) is None
    kafka.create_topic("recreated", 4)
    assert [kafka.leader("recreated", p) for p in range(4)] == [0, 0, 0, 0]


async def test_records_produced_to_kafka_land_exactly_once(kafka: KafkaCluster, tmp_path: Path) -> None:
    """3,000 records (keys, null values, headers) on 3 partitions, produced with librdkafka, land in
    Parquet through a burst daemon exactly once, in offset order, contents as produced."""
    await asyncio.to_thread(kafka.create_topic, "landed", 3)
    records: list[Produced] = [
        (i % 3, b"k%d" % i, None if i % 11 == 0 else b"v%d" % i, [("i", b"%d" % i)] if i % 5 == 0 else [])
        for i in range(3000)
    ]
    await asyncio.to_thread(produce, kafka.bootstrap, records, topic="landed", codec="lz4")
    config = kafka_daemon_config(kafka.bootstrap, tmp_path, consumer={"topics": ["landed"]})
    d = Daemon(config, burst=True)
    await asyncio.wait_for(d.run(), 60)
    assert d.state == "stopped" and d.stats["records_published"] == 3000
    got = landed_rows(tmp_path / "landing")
    for p in range(3):
        expected = [(k, v, h) for q, k, v, h in records if q == p]
        rows = sorted(got[p])
        assert [r[0] for r in rows] == list(range(1000)), f"partition {p}: offsets lost or duplicated"
        assert [(k, v, h) for _, k, v, h in rows] == expected, f"partition {p}: contents differ"


async def test_a_session_timeout_the_broker_refuses_is_one_clear_error(
    kafka: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka refuses a JoinGroup whose session timeout lies outside group.min/max.session.timeout.ms
    (here below the cluster's 500 ms floor; Kafka's own is 6 s, Tansu has none). The daemon says so
    as an error naming consumer.session_timeout and the broker's settings, in its log and its status,
    instead of retrying with a warning that only names the error code."""
    await asyncio.to_thread(kafka.create_topic, "short-session", 1)
    consumer = {
        "mode": "cluster",
        "group": "short-session",
        "session_timeout": 0.3,
        "heartbeat_interval": 0.1,
    }
    d = Daemon(kafka_daemon_config(kafka.bootstrap, tmp_path, topic="short-session", consumer=consumer))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:

        def refused() -> str | None:
            error = d.consumer.snapshot().errors.heartbeat or ""
            return error if "session" in error else None  # the first may be the coordinator's

        error = await wait_until(refused, 30, "the refused join in the status")
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert "consumer.session_timeout = 0.3s" in error and "group.min.session.timeout.ms" in error
    logged = [r for r in caplog.records if "consumer.session_timeout" in r.getMessage()]
    assert [r.levelname for r in logged] == ["ERROR"]


async def test_records_deleted_below_the_landed_position_follow_on_offset_reset(
    kafka: KafkaCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """0-49 land; 50-99 are produced and everything below 80 is deleted (DeleteRecords: the log start
    moves to 80). The restarted daemon's position 50 is below the log start, which Kafka answers
    OFFSET_OUT_OF_RANGE: the source looks the bounds up, the default policy follows the broker to
    80, with the reset counted and a warning naming from and to. (Tansu never answers out of range:
    this path is otherwise only tested on the scripted broker.)"""
    from confluent_kafka import TopicPartition as KafkaPartition

    await asyncio.to_thread(kafka.create_topic, "deleted", 1)
    await asyncio.to_thread(
        produce, kafka.bootstrap, [(0, None, b"a%d" % i, []) for i in range(50)], topic="deleted"
    )
    config = kafka_daemon_config(kafka.bootstrap, tmp_path, topic="deleted")
    await asyncio.wait_for(Daemon(config, burst=True).run(), 60)
    await asyncio.to_thread(
        produce, kafka.bootstrap, [(0, None, b"b%d" % i, []) for i in range(50)], topic="deleted"
    )
    for fut in kafka.admin().delete_records([KafkaPartition("deleted", 0, 80)]).values():
        await asyncio.to_thread(fut.result, 10)
    d = Daemon(config, burst=True)
    await asyncio.wait_for(d.run(), 60)
    assert d.consumer.snapshot().totals.offset_resets == 1 and d.stats["records_published"] == 20
    rows = sorted(landed_rows(tmp_path / "landing")[0])
    assert [r[0] for r in rows] == [*range(50), *range(80, 100)]
    moved = [r for r in caplog.records if r.getMessage().startswith("offset moved by broker")]
    assert (
        len(moved) == 1
        and "from_offset=50" in moved[0].getMessage()
        and "to_offset=80" in moved[0].getMessage()
    )


# Kafka's API keys mqd sends: Fetch, ListOffsets, Metadata, OffsetCommit, OffsetFetch, FindCoordinator,
# JoinGroup, Heartbeat, LeaveGroup, SyncGroup, ApiVersions, OffsetsForLeaderEpoch
SENT_APIS = {1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 23}


async def test_every_request_version_mqd_sends_is_one_kafka_4_serves(
    kafka: KafkaCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka 4 removed old request versions (KIP-896). A burst daemon (metadata, offsets, fetch), its
    restart on the same landing (the landed epoch validated: OffsetsForLeaderEpoch) and a group member
    (coordinator, join, sync, heartbeats, commits, leave) record every request version they pick:
    each is inside the range the broker's ApiVersions answers, for every API mqd uses."""
    sent: dict[int, set[int]] = {}
    prepare = aiokafka_api.Request.prepare

    def recording(self: Any, versions: dict[int, tuple[int, int]]) -> Any:
        struct = prepare(self, versions)
        sent.setdefault(self.API_KEY, set()).add(struct.API_VERSION)
        return struct

    monkeypatch.setattr(aiokafka_api.Request, "prepare", recording)
    await asyncio.to_thread(kafka.create_topic, "versions", 2)
    for run in range(2):
        records: list[Produced] = [(i % 2, None, b"%d-%d" % (run, i), []) for i in range(100)]
        await asyncio.to_thread(produce, kafka.bootstrap, records, topic="versions")
        config = kafka_daemon_config(kafka.bootstrap, tmp_path / "burst", topic="versions")
        await asyncio.wait_for(Daemon(config, burst=True).run(), 60)
    consumer = {"mode": "cluster", "group": "versions", "commit_interval": 0.1}
    d = Daemon(kafka_daemon_config(kafka.bootstrap, tmp_path / "group", topic="versions", consumer=consumer))
    stop = asyncio.Event()
    run_task = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 200, 30, "the group member landed all")
        await wait_until(lambda: {8, 12} <= set(sent), 30, "a commit and a heartbeat")
    finally:
        stop.set()
        await asyncio.wait_for(run_task, 30)
    served = await asyncio.to_thread(kafka.api_versions)
    assert SENT_APIS <= set(sent), f"not exercised: {sorted(SENT_APIS - set(sent))}"
    outside = {
        key: (sorted(versions), served.get(key))
        for key, versions in sent.items()
        if key not in served or not all(served[key][0] <= v <= served[key][1] for v in versions)
    }
    assert not outside, f"api key: (versions sent, broker's min-max): {outside}"


@pytest.mark.slow
async def test_leader_killed_and_restarted_under_a_running_daemon(tmp_path: Path) -> None:
    """Three brokers, a topic replicated three times (min.insync.replicas 2). The leader of its
    partition is SIGKILLed while a daemon reads: leadership moves to another broker, acks=all writes
    keep succeeding, and the killed broker restarts on its data and rejoins. Every record, before,
    during and after, lands exactly once."""
    cluster = KafkaCluster(tmp_path / "kafka", 3)
    await asyncio.to_thread(cluster.start)
    stop = asyncio.Event()
    run: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(cluster.create_topic, "replicated", 2, 3, {"min.insync.replicas": "2"})
        await asyncio.to_thread(
            produce,
            cluster.bootstrap,
            [(i % 2, None, b"a%d" % i, []) for i in range(1000)],
            topic="replicated",
        )
        config = kafka_daemon_config(
            cluster.bootstrap, tmp_path / "d", consumer={"topics": ["replicated"]}, max_age=0.2
        )
        d = Daemon(config)
        run = asyncio.create_task(d.run(stop.wait()))
        await wait_until(lambda: d.stats["records_published"] == 1000, 60, "the first 1000 landed")

        old = await asyncio.to_thread(cluster.leader, "replicated", 0)
        assert old is not None
        await asyncio.to_thread(cluster.kill_broker, old)

        async def moved() -> bool:
            now = await asyncio.to_thread(cluster.leader, "replicated", 0, 1.0)
            return now is not None and now != old

        await wait_until(moved, 30, "partition 0's leadership to move off the killed broker")
        await asyncio.to_thread(
            produce,
            cluster.bootstrap,
            [(i % 2, None, b"b%d" % i, []) for i in range(1000)],
            topic="replicated",
        )
        await wait_until(lambda: d.stats["records_published"] == 2000, 60, "the records written meanwhile")

        await asyncio.to_thread(cluster.start_broker, old)
        await asyncio.to_thread(
            produce,
            cluster.bootstrap,
            [(i % 2, None, b"c%d" % i, []) for i in range(1000)],
            topic="replicated",
        )
        await wait_until(lambda: d.stats["records_published"] == 3000, 60, "the records after the restart")
        # the restarted broker has caught up: every replica is in the ISR again
        for p in range(2):
            await asyncio.to_thread(
                wait_until_sync,
                lambda: cluster.in_sync_replicas("replicated", p, 2.0) == [0, 1, 2],  # noqa: B023
                30,
                f"all three replicas of partition {p} in sync",
            )
    except BaseException:
        print(cluster.dump_logs(), file=sys.stderr)
        raise
    finally:
        stop.set()
        if run is not None:
            await asyncio.wait_for(run, 30)
        await asyncio.to_thread(cluster.stop)
    got = landed_rows(tmp_path / "d" / "landing")
    for p in range(2):
        rows = sorted(got[p])
        assert [r[0] for r in rows] == list(range(1500)), f"partition {p}: offsets lost or duplicated"
        values = {r[2] for r in rows}
        assert values == {b"%s%d" % (x, i) for x in (b"a", b"b", b"c") for i in range(p, 1000, 2)}


@pytest.mark.slow
async def test_a_log_truncated_by_an_unclean_election_lands_as_a_new_incarnation(tmp_path: Path) -> None:
    """A real truncation: brokers 1 and 2 replicate a partition (broker 0 is the only controller, so
    the quorum stays up). a0-a9 land; broker 2 is killed and fenced out of the ISR; b10-b19 are
    written to broker 1 alone (acks=1) and land; broker 1 is killed and broker 2, restarted, is made
    leader by an unclean election: its log ends at 10 and t10-t14 follow in a new leader epoch. The
    restarted daemon checks its landed position's epoch (OffsetsForLeaderEpoch), finds the cut at 10
    and lands t10-t14 as a new incarnation beside b10-b19 (10 reused offsets counted, none lost,
    nothing cut)."""
    from confluent_kafka import ElectionType
    from confluent_kafka import TopicPartition as KafkaPartition
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    cluster = KafkaCluster(tmp_path / "kafka", 3, controllers=1)
    await asyncio.to_thread(cluster.start)
    config = kafka_daemon_config(cluster.bootstrap, tmp_path / "d", topic="cut")

    async def land() -> Daemon:
        d = Daemon(config, burst=True)
        await asyncio.wait_for(d.run(), 60)
        return d

    try:
        new = NewTopic("cut", 1, replica_assignment=[[1, 2]], config={"min.insync.replicas": "1"})
        for fut in cluster.admin().create_topics([new]).values():
            await asyncio.to_thread(fut.result, 30)
        await asyncio.to_thread(
            wait_until_sync, lambda: cluster.in_sync_replicas("cut", 0, 1.0) == [1, 2], 30, "both in sync"
        )
        await asyncio.to_thread(
            produce, cluster.bootstrap, [(0, None, b"a%d" % i, []) for i in range(10)], topic="cut"
        )
        assert (await land()).stats["records_published"] == 10

        # killed, not frozen: a frozen broker keeps its connections open, and the metadata calls
        # below that librdkafka sent to it timed out until the wait did (1 in 3 runs)
        await asyncio.to_thread(cluster.kill_broker, 2)
        await asyncio.to_thread(
            wait_until_sync,
            lambda: cluster.in_sync_replicas("cut", 0, 1.0) == [1],
            30,
            "broker 2 out of the ISR",
        )
        b_records: list[Produced] = [(0, None, b"b%d" % i, []) for i in range(10, 20)]
        await asyncio.to_thread(produce, cluster.bootstrap, b_records, topic="cut", acks="1")
        assert (await land()).stats["records_published"] == 10

        await asyncio.to_thread(cluster.kill_broker, 1)
        await asyncio.to_thread(cluster.start_broker, 2)
        await asyncio.to_thread(
            wait_until_sync, lambda: cluster.leader("cut", 0, 1.0) is None, 30, "no leader left"
        )
        election = cluster.admin().elect_leaders(ElectionType.UNCLEAN, [KafkaPartition("cut", 0)])
        await asyncio.to_thread(election.result, 30)
        await asyncio.to_thread(
            wait_until_sync, lambda: cluster.leader("cut", 0, 1.0) == 2, 30, "broker 2 leads"
        )
        await asyncio.to_thread(
            produce, cluster.bootstrap, [(0, None, b"t%d" % i, []) for i in range(10, 15)], topic="cut"
        )
        d = await land()
        totals = d.consumer.snapshot().totals
    except BaseException:
        print(cluster.dump_logs(), file=sys.stderr)
        raise
    finally:
        await asyncio.to_thread(cluster.stop)
    assert d.stats["records_published"] == 5 and d.stats["records_cut"] == 0
    assert (totals.incarnation_changes, totals.reused_offsets, totals.lost_offsets, totals.offset_resets) == (
        1,
        10,
        0,
        0,
    )
    rows = {
        (row["offset"], row["value"], row["incarnation"])
        for path in (tmp_path / "d" / "landing").rglob("part-*.parquet")
        for row in pq.read_table(path, columns=["offset", "value", "incarnation"]).to_pylist()
    }
    old = {inc for _o, v, inc in rows if not v.startswith(b"t")}
    cut = {inc for _o, v, inc in rows if v.startswith(b"t")}
    assert len(old) == 1 and len(cut) == 1 and old != cut
    assert sorted((o, v) for o, v, _inc in rows) == sorted(
        [(i, b"a%d" % i) for i in range(10)]
        + [(i, b"b%d" % i) for i in range(10, 20)]
        + [(i, b"t%d" % i) for i in range(10, 15)]
    )
