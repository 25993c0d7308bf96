"""Incremental fetch sessions (KIP-227) against real Apache Kafka (one KRaft broker,
:class:`mqd.testing.KafkaCluster`), through a running daemon: the broker grants a session, the
requests after the first are incremental and list only the partitions whose position moved, every
record lands once, and a broker restart (the connection drops, the session with it) falls back to a
full request and a new session without losing or repeating a record. With
``consumer.kafka.fetch_sessions = false`` the same traffic lands once with no session at all.

What the session sent is read from the source's per-node :class:`FetchSession` (its counters, the
ids granted and its ``history`` of requests): the wire is Kafka's, the observation is the client's.
The scripted-broker tests (test_kafka_fetch_session.py) cover pause/forget and an explicit
FETCH_SESSION_ID_NOT_FOUND; Tansu grants no session (id 0), so only Apache Kafka is run here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce
from support.servers import serving

from mqd.process.daemon import Daemon
from mqd.sources.kafka.fetch_session import NO_SESSION_EPOCH, FetchSession
from mqd.sources.kafka.source import KafkaSource
from mqd.testing.kafka_cluster import KafkaCluster
from mqd.topic_partition import TopicPartition
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")

PARTITIONS = 6
NODE = "0"  # the one broker's node id


@pytest.fixture(scope="module")
def module_kafka(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaCluster]:
    """One Apache Kafka broker for the module; its log is printed when a test failed."""
    with serving(request, KafkaCluster(tmp_path_factory.mktemp("kafka"))) as cluster:
        yield cluster


@pytest.fixture
def kafka(module_kafka: KafkaCluster) -> KafkaCluster:
    """The module's broker, running (a failed test may have left it stopped)."""
    if not module_kafka.brokers[0].running:
        module_kafka.start_broker(0)
    return module_kafka


def session_of(d: Daemon) -> FetchSession:
    source = cast(KafkaSource, d.consumer._source)
    return source.sessions[NODE]


def published(d: Daemon, n: int) -> Callable[[], bool]:
    return lambda: d.stats["records_published"] == n


def records(tag: str, count: int, partitions: tuple[int, ...] = tuple(range(PARTITIONS))) -> list[Produced]:
    """``count`` records spread round-robin over ``partitions``, values ``<tag>-<i>``."""
    return [(partitions[i % len(partitions)], None, b"%s-%d" % (tag.encode(), i), []) for i in range(count)]


def assert_landed_once(landing: Path, produced: list[Produced]) -> None:
    """Every produced record landed exactly once, per partition in produce order at offsets 0..n-1."""
    got = landed_rows(landing)
    for p in range(PARTITIONS):
        want = [v for q, _k, v, _h in produced if q == p]
        rows = sorted(got[p])
        assert [o for o, *_ in rows] == list(range(len(want))), f"partition {p}: lost or duplicated"
        assert [v for _o, _k, v, _h in rows] == want, f"partition {p}: contents differ"


async def test_sessions_off_land_the_same_records_with_full_requests_only(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    """``consumer.kafka.fetch_sessions = false``: every request is full and asks for no session
    (id 0, epoch -1, all 6 partitions listed), the session id stays 0, nothing is ever granted, and
    the same 700 records (spread, then partition 2 alone) land exactly once."""
    topic = "sessions-off"
    await asyncio.to_thread(kafka.create_topic, topic, PARTITIONS)
    produced = records("a", 300)
    await asyncio.to_thread(produce, kafka.bootstrap, produced, topic=topic)
    config = kafka_daemon_config(
        kafka.bootstrap, tmp_path, topic=topic, consumer={"kafka": {"fetch_sessions": False}}, max_age=0.2
    )
    d = Daemon(config)
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 300, 30, "the first 300 landed")
        for wave in range(4):
            more: list[Produced] = [(2, None, b"p2-%d-%d" % (wave, i), []) for i in range(25)]
            await asyncio.to_thread(produce, kafka.bootstrap, more, topic=topic)
            produced += more
        more = records("b", 300)
        await asyncio.to_thread(produce, kafka.bootstrap, more, topic=topic)
        produced += more
        total = len(produced)
        await wait_until(lambda: d.stats["records_published"] == total, 30, "everything landed")
        session = session_of(d)
        assert session.session_id == 0 and not session.granted and session.incremental_requests == 0
        assert session.full_requests >= 3 and session.resets == 0
        assert all(
            (h.session_id, h.epoch, h.full, h.listed) == (0, NO_SESSION_EPOCH, True, h.wanted)
            for h in session.history
        ), list(session.history)
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert_landed_once(tmp_path / "landing", produced)


async def test_a_granted_session_lists_only_what_changed_and_survives_a_broker_restart(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    """Apache Kafka grants the daemon's first full request a session (non-zero id); the requests
    after it carry that id with epochs 1, 2, 3... While records arrive on partition 2 only, each
    incremental request fetches all 6 partitions but lists at most partition 2 (the idle five stay
    in the broker's session), forgets nothing, and does list partition 2 after each move. The broker
    is then restarted mid-stream: the dropped connection resets the session, the next request is
    full (id 0, epoch 0, every partition it fetches listed) and the restarted broker grants a new
    id. 1,000 records in four rounds land exactly once. (Last in the module: after the restart the
    cluster's cached admin client failed the next test's CreateTopics.)"""
    topic = "sessions-on"
    await asyncio.to_thread(kafka.create_topic, topic, PARTITIONS)
    produced = records("a", 300)
    await asyncio.to_thread(produce, kafka.bootstrap, produced, topic=topic)
    d = Daemon(kafka_daemon_config(kafka.bootstrap, tmp_path, topic=topic, max_age=0.2))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 300, 30, "the first 300 landed")
        session = session_of(d)
        await wait_until(lambda: session.incremental_requests >= 3, 10, "incremental requests")
        sid = session.session_id
        assert sid != 0 and list(session.granted) == [sid] and session.resets == 0
        first = session.history[0] if session.full_requests == 1 else None
        if first is not None:  # still in the history: the session's first request lists all it fetches
            assert (first.session_id, first.epoch, first.full, first.listed) == (0, 0, True, first.wanted)
        # idle: the requests list nothing (a partition's max_bytes also changes once, from its share
        # of a catch-up request to the idle share, which lists it once more)
        await wait_until(
            lambda: len(session.history) >= 2 and all(h.listed == 0 for h in list(session.history)[-2:]),
            10,
            "two incremental requests listing nothing",
        )
        epoch_before = session.epoch

        tp2 = TopicPartition(topic, 2)
        for wave in range(4):
            more: list[Produced] = [(2, None, b"p2-%d-%d" % (wave, i), []) for i in range(25)]
            await asyncio.to_thread(produce, kafka.bootstrap, more, topic=topic)
            produced += more
            await wait_until(published(d, len(produced)), 20, f"wave {wave} landed")
        assert session.session_id == sid and session.resets == 0
        sent = [h for h in session.history if h.session_id == sid and h.epoch >= epoch_before]
        assert sent, "no request of the session in its history"
        assert [h.epoch for h in sent] == list(range(sent[0].epoch, sent[0].epoch + len(sent))), sent
        assert all(not h.full and h.wanted == PARTITIONS and h.forgotten == 0 for h in sent), sent
        assert all(set(h.changed) <= {tp2} for h in sent), [h.changed for h in sent if set(h.changed) - {tp2}]
        assert sum(1 for h in sent if h.changed == (tp2,)) >= 4, "partition 2 not listed after its moves"
        assert sum(1 for h in sent if not h.changed) >= 1, "no request with nothing changed"

        # a restart mid-stream: records before, during the outage's aftermath and after
        before = records("b", 300)
        await asyncio.to_thread(produce, kafka.bootstrap, before, topic=topic)
        produced += before
        full_before = session.full_requests
        await asyncio.to_thread(kafka.restart_broker, 0)
        after = records("c", 300)
        await asyncio.to_thread(produce, kafka.bootstrap, after, topic=topic)
        produced += after
        total = len(produced)
        await wait_until(
            lambda: d.stats["records_published"] == total, 60, "everything landed after the restart"
        )
        session = session_of(d)  # the same node's session object, reset in place
        await wait_until(lambda: session.session_id not in (0, sid), 10, "a new session granted")
        assert session.resets >= 1 and session.full_requests > full_before
        assert list(session.granted)[:1] == [sid] and session.granted[-1] == session.session_id
        # the full requests (the last of them asked the restarted broker for the new session) list
        # every partition they fetch (one may be out of a request while its epoch is checked)
        full = [h for h in session.history if h.full]
        assert full and all((h.session_id, h.epoch, h.listed) == (0, 0, h.wanted) for h in full), full
        assert any(h.session_id == session.session_id for h in session.history)
        assert d.consumer.snapshot().totals.offset_resets == 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert d.stats["records_published"] == len(produced)
    assert_landed_once(tmp_path / "landing", produced)
