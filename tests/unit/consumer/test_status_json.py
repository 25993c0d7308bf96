"""The status JSON made at the edge from the typed snapshot has exactly the documented shape and
keys (the admin endpoint, ``mqd status --json`` and the chaos harness read it): the assignment
epoch is "generation" per partition, the member version the top-level "generation", pinned bodies
"pinned_answers"; the log incarnation fields (issue 12), the true-lag fields (issue 17) and
``fetch_lag`` / ``unlanded_since_ms`` (issue 31) are added keys, none renamed. Since issue 31 "lag" is
the log end minus the landed offset, as Kafka's tools mean it."""

from __future__ import annotations

from typing import Any

from support.consumer import new_consumer

from mqd.config import ConsumerConfig
from mqd.consumer.snapshot import (
    ConsumerSnapshot,
    Errors,
    NodeSnapshot,
    PartitionSnapshot,
    Totals,
    consumer_status_json,
)
from mqd.topic_partition import TopicPartition

TP = TopicPartition("events", 3)


def test_shape_and_values() -> None:
    """Every key and value of a filled snapshot, as the status JSON had them."""
    snap = ConsumerSnapshot(
        member_id="m1",
        group="g",
        mode="cluster",
        member_version=5,
        members=("m1", "m2"),
        coordinator="n1",
        allocation="averagely",
        partitions=(
            PartitionSnapshot(
                TP,
                9,
                40,
                30,
                35,
                0,
                100,
                "n1",
                False,
                True,
                "records",
                4,
                400,
                None,
                "x",
                "ab" * 16,
                1,
                6,
                2,
                landed=35,
                landed_event_time_ms=None,
                log_end_age_s=1.5,
                stalled_polls=3,
                stuck=True,
                last_error_age_s=4.5,
                leader="n0",
            ),
        ),
        totals=Totals(1, 400, 4, 1000, 200, 600, 2, 3, 1, (), 1, 6, 2, ("events/3",)),
        nodes=(NodeSnapshot("n1", 7, 1, True, "boom", 0.25),),
        errors=Errors("md", None, None, "rb"),
    )
    assert consumer_status_json(snap) == {
        "member_id": "m1",
        "group": "g",
        "mode": "cluster",
        "generation": 5,
        "members": ["m1", "m2"],
        "coordinator": "n1",
        "allocation": "averagely",
        "assignment": {
            "events/3": {
                "topic": "events",
                "partition": 3,
                "generation": 9,
                "position": 40,
                "committed": 30,
                "marked": 35,
                "log_start": 0,
                "log_end": 100,
                "lag": 65,
                "fetch_lag": 60,
                "pull_node": "n1",
                "leader": "n0",
                "paused": False,
                "in_flight": True,
                "flow_control": "records",
                "buffered_records": 4,
                "buffered_bytes": 400,
                "parked": None,
                "last_error": "x",
                "last_error_age_s": 4.5,
                "incarnation": "ab" * 16,
                "incarnation_changes": 1,
                "reused_offsets": 6,
                "lost_offsets": 2,
                "landed": 35,
                "landed_lag": 65,
                "landed_event_time_ms": None,
                "time_lag_s": None,
                "unlanded_since_ms": None,
                "log_end_age_s": 1.5,
                "stalled_polls": 3,
                "stuck": True,
            }
        },
        "totals": {
            "owned": 1,
            "buffered_bytes": 400,
            "buffered_records": 4,
            "budget_bytes": 1000,
            "reserved_bytes": 200,
            "pinned_bytes": 600,
            "pinned_answers": 2,
            "requests_per_node": {"n1": 7},
            "rebalances": 3,
            "offset_resets": 1,
            "parked": [],
            "incarnation_changes": 1,
            "reused_offsets": 6,
            "lost_offsets": 2,
            "stuck": ["events/3"],
            "memory_outside_bytes": 0,
            "budget_used_bytes": 0,
        },
        "nodes": {
            "n1": {"requests": 7, "errors": 1, "in_flight": True, "last_error": "boom", "backoff_s": 0.25}
        },
        "errors": {"metadata": "md", "heartbeat": None, "offset_store": None, "rebalance": "rb"},
    }


def test_broadcast_consumer_before_start() -> None:
    """A broadcast consumer names itself the only member, with no group version or coordinator."""
    out = new_consumer(ConsumerConfig(client_id="solo", mode="broadcast")).status()
    assert (out["members"], out["generation"], out["coordinator"], out["assignment"]) == (
        ["solo"],
        None,
        None,
        {},
    )
    assert out["totals"]["budget_bytes"] == ConsumerConfig().max_buffered_bytes


def snapshot(
    position: int, log_end: int | None, *, landed: int | None, committed: int | None = None, **kw: Any
) -> PartitionSnapshot:
    return PartitionSnapshot(
        TP, 1, position, committed, landed, 0, log_end, None, False, False, None, 0, 0, None, None,
        landed=landed, **kw,
    )  # fmt: skip


def test_lag_is_the_log_end_minus_landed_not_the_fetch_position() -> None:
    """Everything fetched, nothing landed: the lag is every record (the issue's "total lag 0" with 0
    of 100,000 landed), the fetch lag 0. Nothing marked: the committed offset counts, as in
    kafka-consumer-groups; neither known: no figure, not 0."""
    p = snapshot(100_000, 100_000, landed=0)
    assert (p.lag, p.fetch_lag, p.landed_lag) == (100_000, 0, 100_000)
    assert consumer_status_json(_one(p))["assignment"]["events/3"]["lag"] == 100_000
    assert snapshot(90, 100, landed=None, committed=40).lag == 60
    assert snapshot(90, 100, landed=None).lag is None
    assert snapshot(90, None, landed=50).lag is None  # no log end polled yet
    assert snapshot(120, 100, landed=110).lag == 0  # a log end older than the landing: not negative


def test_time_lag_is_the_age_of_the_oldest_record_not_landed() -> None:
    """0 when caught up however old the newest landed record is (an idle topic's time lag does not
    grow); behind, now minus when the first unlanded record entered the log; before the poller
    dated it, now minus the newest landed event time; a time in the future counts as 0."""
    idle = snapshot(500, 500, landed=500, landed_event_time_ms=10_000)
    assert idle.time_lag_s(10_000.0 + 3_600_000) == 0.0
    behind = snapshot(500, 510, landed=500, landed_event_time_ms=1_000, unlanded_since_ms=10_000)
    assert behind.time_lag_s(12_500.0) == 2.5
    assert behind.time_lag_s(9_000.0) == 0.0
    undated = snapshot(500, 510, landed=500, landed_event_time_ms=10_000)
    assert undated.time_lag_s(12_500.0) == 2.5
    assert snapshot(500, 510, landed=500).time_lag_s(12_500.0) is None
    assert snapshot(500, None, landed=None).time_lag_s(12_500.0) is None  # nothing known


def _one(p: PartitionSnapshot) -> ConsumerSnapshot:
    return ConsumerSnapshot(
        "m", "g", "broadcast", None, ("m",), None, "averagely", (p,),
        Totals(1, 0, 0, 0, 0, 0, 0, 0, 0, ()), (), Errors(None, None, None, None),
    )  # fmt: skip
