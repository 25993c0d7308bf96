"""Where a Kafka partition without a landed or committed position starts: ``consume_from =
"timestamp"`` asks the broker (ListOffsets by timestamp) for the first record at or after the
time, on a real broker (Tansu and Apache Kafka on 127.0.0.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.kafka import Broker, kafka_daemon_config, landed_rows

from mqd.process.daemon import Daemon
from mqd.testing.tansu import Tansu

pytest.importorskip("confluent_kafka")

BASE_MS = 1_700_000_000_000


async def test_consume_from_a_timestamp_starts_at_the_first_record_at_or_after_it(
    broker: Broker, topic: str, tmp_path: Path
) -> None:
    """Record i (of 100, on 2 partitions) has timestamp BASE + i s. Started from BASE + 50 s, a burst
    daemon lands records 50-99, offsets 25-49 of each partition; started from a time after the last
    record, it lands nothing (the partitions start at their log end)."""
    if isinstance(broker, Tansu):
        pytest.skip("Tansu 0.6 answers ListOffsets by timestamp with the log start, whatever the time")
    from confluent_kafka import Producer

    broker.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(100):
        producer.produce(topic, b"%d" % i, partition=i % 2, timestamp=BASE_MS + i * 1000)
    assert producer.flush(30) == 0

    def run_from(ms: int, root: Path) -> Daemon:
        consumer = {"consume_from": "timestamp", "consume_timestamp_ms": ms}
        return Daemon(kafka_daemon_config(broker.bootstrap, root, topic=topic, consumer=consumer), burst=True)

    d = run_from(BASE_MS + 50_000, tmp_path / "middle")
    await d.run()
    got = landed_rows(tmp_path / "middle" / "landing")
    for p in (0, 1):
        rows = sorted(got[p])
        assert [r[0] for r in rows] == list(range(25, 50)), f"partition {p}"
        assert [r[2] for r in rows] == [b"%d" % i for i in range(50 + p, 100, 2)]
    d = run_from(BASE_MS + 500_000, tmp_path / "future")
    await d.run()
    assert d.stats["records_published"] == 0
