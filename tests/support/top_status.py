"""A status JSON made the daemon's way for `mqd top`'s tests: typed snapshots through
consumer_status_json, with the runner's and the admin endpoint's sections around it. ``busy()`` is
three partitions (fetching, paused behind with a fetch error, idle); tests/unit/operator/test_top_render.py
reads it as text, tests/integration/ops/test_top_keys.py draws it on a pseudo-terminal."""

from __future__ import annotations

import time
from typing import Any

from mqd.consumer.snapshot import (
    ConsumerSnapshot,
    Errors,
    NodeSnapshot,
    PartitionSnapshot,
    Totals,
    consumer_status_json,
)
from mqd.topic_partition import TopicPartition

NODE_A = "broker-a-0.eu-west-1.internal"
NODE_B = "broker-b-1.eu-west-1.internal"


def partition(
    p: int, position: int, log_end: int, *, landed: int | None = None, **kw: Any
) -> PartitionSnapshot:
    fields: dict[str, Any] = {
        "tp": TopicPartition("events", p),
        "epoch": 1,
        "position": position,
        "committed": landed,
        "marked": landed,
        "log_start": 0,
        "log_end": log_end,
        "pull_node": NODE_A if p % 2 == 0 else NODE_B,
        "paused": False,
        "in_flight": False,
        "flow_control": None,
        "buffered_records": 0,
        "buffered_bytes": 0,
        "parked": None,
        "last_error": None,
        "landed": landed,
        **kw,
    }
    return PartitionSnapshot(**fields)


def status(
    *parts: PartitionSnapshot, published: int = 1_234_567, cpu_s: float = 10.0, totals: Totals | None = None
) -> dict[str, Any]:
    snap = ConsumerSnapshot(
        member_id="host-1-4711",
        group="landing",
        mode="cluster",
        member_version=7,
        members=("host-1-4711",),
        coordinator=NODE_A,
        allocation="averagely",
        partitions=parts,
        totals=totals
        or Totals(len(parts), 8 << 20, 1000, 64 << 20, 0, 0, 0, 1, 0, (), budget_used_bytes=8 << 20),
        nodes=(NodeSnapshot(NODE_A, 10, 0, False, None, 0.0),),
        errors=Errors(None, None, None, None),
    )
    return {
        "state": "running",
        "health": {"status": "ok", "reasons": []},
        "consumer": consumer_status_json(snap),
        "stats": {"records_published": published, "bytes_published": 99 << 20, "files_published": 42},
        "runner": {"pid": 4711, "uptime_s": 3725.0},
        "process": {"version": "0.1.0", "pid": 4711, "rss_bytes": 84 << 20, "cpu_seconds": cpu_s},
    }


def busy() -> tuple[PartitionSnapshot, ...]:
    """Three partitions: one fetching, one paused behind with a fetch error and a time lag of about
    90 s (stamped now: the status JSON computes the time lag from the clock), one idle."""
    return (
        partition(0, 18_352_001, 18_352_100, landed=18_350_000),
        partition(
            1,
            1_200_000,
            1_218_352,
            landed=1_200_000,
            paused=True,
            last_error=f"{NODE_B}: timeout",
            last_error_age_s=12.0,
            landed_event_time_ms=int(time.time() * 1000) - 90_000,
        ),
        partition(2, 5, 5, landed=5),
    )
