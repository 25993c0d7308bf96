"""metrics.PartitionChildren: cached per-partition children of a labelled metric stay tied to the
series the registry exports, across removal and re-creation."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from mqd.metrics import PartitionChildren
from mqd.topic_partition import TopicPartition

TP = TopicPartition("events", 3)


def exported(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_children_are_made_once_and_removed_with_their_series() -> None:
    """The same child comes back for a partition; no series exists before the first set; after
    remove() the series is gone and the next get() makes a fresh child that is exported again (a
    removed child is never the one set)."""
    registry = CollectorRegistry()
    gauge = Gauge("t_lag", "test", ["topic", "partition"], registry=registry)
    children = PartitionChildren(gauge)
    assert 't_lag{partition="3",topic="events"}' not in exported(registry)
    first = children.get(TP)
    assert children.get(TP) is first
    first.set(5)
    assert 't_lag{partition="3",topic="events"} 5.0' in exported(registry)
    children.remove(TP)
    children.remove(TP)  # idempotent
    assert 't_lag{partition="3",topic="events"}' not in exported(registry)
    again = children.get(TP)
    assert again is not first
    again.set(7)
    assert 't_lag{partition="3",topic="events"} 7.0' in exported(registry)
