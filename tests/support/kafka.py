"""Helpers for the Kafka source's tests: a daemon config reading a Tansu broker, producing numbered
records with a real client (confluent-kafka) in a given codec, and what landed per partition."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mqd.config import AdminConfig, ConsumerConfig, DaemonSection, LandingConfig, MqdConfig
from mqd.testing.tansu import Tansu
from support.consumer import FAST
from support.daemon import TEST_MAX_AGE_S

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
Headers = list[tuple[str, bytes | None]]
Produced = tuple[int, bytes | None, bytes | None, Headers]  # partition, key, value, headers
Landed = tuple[int, bytes | None, bytes | None, Headers]  # offset, key, value, headers


def kafka_daemon_config(
    bootstrap: str,
    root: Path,
    *,
    consumer: dict[str, Any] | None = None,
    landing_dir: Path | None = None,
    **landing: Any,
) -> MqdConfig:
    """A fast daemon reading ``bootstrap`` (broadcast unless ``consumer`` says otherwise), its state
    under ``root``, landing into ``landing_dir`` (default ``root/landing``)."""
    return MqdConfig(
        consumer=ConsumerConfig(
            **{
                **FAST,
                "source": "kafka",
                "mode": "broadcast",
                "consume_from": "first",
                "client_id": f"k-{time.monotonic_ns() % 10**6}",
                "bootstrap": [bootstrap],
                "topics": ["events"],
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
    """(partition, key, value, headers) records with confluent-kafka (librdkafka), every one acked."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 20,
            "batch.num.messages": 2000,
            "acks": "all",
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
