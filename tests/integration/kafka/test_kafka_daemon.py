"""The daemon reading a real Kafka-protocol broker (Tansu and Apache Kafka, processes on 127.0.0.1)
through the Kafka source: records produced with a real client (confluent-kafka) in every codec, with
headers and null keys/values, land in Parquet exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.kafka import CODECS, Broker, Headers, Produced, kafka_daemon_config, landed_rows, produce

from mqd.process.daemon import Daemon
from mqd.testing.tansu import Tansu
from mqd.waiting import wait_until

pytest.importorskip("confluent_kafka")


def numbered(partitions: int, total: int) -> list[Produced]:
    """Record i goes to partition i % partitions: key "k<i>" (none for every 7th), value "<p>:<i>"
    (none for every 11th), headers on every 3rd (an empty and a null header value among them)."""
    out: list[Produced] = []
    for i in range(total):
        p = i % partitions
        key = None if i % 7 == 0 else b"k%d" % i
        value = None if i % 11 == 0 else b"%d:%d" % (p, i)
        headers: Headers = [("i", b"%d" % i), ("empty", b""), ("null", None)] if i % 3 == 0 else []
        out.append((p, key, value, headers))
    return out


async def test_100k_records_over_12_partitions_land_exactly_once(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """100,000 records on 12 partitions, a fifth in each codec (none, gzip, snappy, lz4, zstd) ->
    burst daemon (broadcast mode) -> Parquet: every record exactly once, in offset order per
    partition, keys/values/headers (and their nulls) as produced."""
    broker.create_topic(topic, 12)
    records = numbered(12, 100_000)
    fifth = len(records) // 5
    for c, codec in enumerate(CODECS):
        produce(broker.bootstrap, records[c * fifth : (c + 1) * fifth], codec=codec, topic=topic)
    d = Daemon(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic, max_records=20_000), burst=True)
    await asyncio.wait_for(d.run(), 120)
    assert d.state == "stopped" and d.stats["records_published"] == 100_000
    got = landed_rows(tmp_path / "landing")
    for p in range(12):
        expected = [(k, v, h) for q, k, v, h in records if q == p]
        rows = sorted(got[p])
        assert [r[0] for r in rows] == list(range(len(expected))), (
            f"partition {p}: offsets lost or duplicated"
        )
        assert [(k, v, [(hk, hv) for hk, hv in h]) for _, k, v, h in rows] == [
            (k, v, list(h)) for k, v, h in expected
        ], f"partition {p}: contents differ"


async def test_transactions_land_committed_records_only(broker: Broker, topic: str, tmp_path: Path) -> None:
    """A transactional producer (confluent-kafka) commits, aborts, commits: the daemon lands the
    committed records once, skips the transaction markers, and its burst ends at the log end.
    Apache Kafka keeps the aborted records in the log, so there the Fetch answer's aborted-transaction
    list is what drops them; Tansu keeps none (its list is also tested against the scripted broker in
    test_kafka_fake_broker.py)."""
    from confluent_kafka import Producer

    broker.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"mqd-test-{topic}"})
    producer.init_transactions(15)
    for run, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        for i in range(10):
            producer.produce(topic, b"%d:%d" % (run, i), partition=i % 2)
        if commit:
            producer.commit_transaction(15)
        else:
            producer.abort_transaction(15)
    d = Daemon(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic), burst=True)
    await asyncio.wait_for(d.run(), 60)
    got = landed_rows(tmp_path / "landing")
    values = sorted(v for p in (0, 1) for _, _, v, _ in got[p] if v is not None)
    assert values == sorted(b"%d:%d" % (run, i) for run in (0, 2) for i in range(10))
    assert d.stats["records_published"] == 20


async def test_broker_killed_and_restarted_mid_stream(
    broker: Broker, topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tansu is SIGKILLed under a running daemon and started again on the same port with empty
    memory storage. The daemon keeps running through the outage (fetch errors counted, backoff);
    the recreated topic has a new topic id, so each partition's log is a new incarnation (diverged
    at 0, the 500 offsets landed from the old log counted as reused): the new log's records all land
    as new records beside the old ones, none cut, none reset; its status lists the Kafka broker as a
    node, and an error line names both incarnations."""
    if not isinstance(broker, Tansu):
        pytest.skip(
            "Apache Kafka keeps its log across a restart: the lost memory storage this test needs is "
            "Tansu's (Kafka's recreated topic: test_kafka_incarnation_tansu.py; its restarts: "
            "test_kafka_cluster.py)"
        )
    tansu = broker
    broker.create_topic(topic, 2)
    produce(broker.bootstrap, [(i % 2, None, b"old-%d" % i, []) for i in range(1000)], topic=topic)
    d = Daemon(kafka_daemon_config(broker.bootstrap, tmp_path, topic=topic, max_age=0.2))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] == 1000, 30, "the first 1000 landed")
        before = d.consumer.incarnations()
        tansu.kill()
        await wait_until(lambda: any(n.errors for n in d.consumer.snapshot().nodes), 30, "fetch errors")
        assert d.state == "running"
        tansu.start()
        broker.create_topic(topic, 2)
        new: list[Produced] = [(i % 2, None, b"new-%d" % i, []) for i in range(1600)]
        produce(broker.bootstrap, new[:400], topic=topic)  # 200 per partition: below the landed 500
        await wait_until(
            lambda: d.consumer.snapshot().totals.incarnation_changes >= 2,
            60,
            "a new incarnation per partition",
        )
        produce(broker.bootstrap, new[400:], topic=topic)
        await wait_until(lambda: d.stats["records_published"] == 2600, 60, "all the new records landed")
        status = d.status()
        assert d.state == "running" and status["consumer"]["nodes"], status
        snaps = {p.tp.partition: p for p in d.consumer.snapshot().partitions}
        for tp, old in before.items():
            snap = snaps[tp.partition]
            assert old is not None and snap.incarnation not in (None, old)
            assert snap.reused_offsets == 500
            named = [
                r for r in caplog.records if old in r.getMessage() and str(snap.incarnation) in r.getMessage()
            ]
            assert any(r.levelname == "ERROR" for r in named), f"no error names {old} and {snap.incarnation}"
        assert d.consumer.snapshot().totals.offset_resets == 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    got = landed_rows(tmp_path / "landing")
    for p in (0, 1):
        old_rows = [r for r in got[p] if r[2] is not None and r[2].startswith(b"old-")]
        new_rows = [r for r in got[p] if r[2] is not None and r[2].startswith(b"new-")]
        assert sorted(r[0] for r in old_rows) == list(range(500)), f"partition {p}: old log"
        assert sorted(r[0] for r in new_rows) == list(range(800)), f"partition {p}: new log"
        assert {r[2] for r in new_rows} == {b"new-%d" % i for i in range(p, 1600, 2)}
