"""Typed snapshots of the consumer's state, and the one function that turns them into status JSON.

Internal readers (the daemon's health and idle watermarks, the runner) read the frozen dataclasses;
JSON is produced only at the edge (the admin endpoint, ``mqd status --json``) by
:func:`consumer_status_json`, whose shape is the documented status JSON and does not change. Two
identifiers differ from their JSON keys: ``PartitionSnapshot.epoch`` is ``"generation"`` in an
assignment entry (the assignment epoch), ``ConsumerSnapshot.member_version`` is the top-level
``"generation"`` (the consumer group's member-list version); ``Totals.pinned_bodies`` is
``"pinned_answers"``.

Lag figures, as ``kafka-consumer-groups`` means them: ``log_end`` is refreshed by the log-end poller
on a timer whatever the partition's state (``log_end_age_s`` says how old it is; under Kafka's
``read_committed`` it is the last stable offset); ``landed`` is what the owner marked handled (the
daemon marks what it published, and commits only that). ``lag`` is the log end minus the landed
offset (the committed one when nothing is marked): records not landed yet, the figure a lag alert
wants. ``fetch_lag`` is the log end minus the fetch position: records not fetched yet, which is 0
while fetched records wait in buffers to land. ``time_lag_s`` is the age of the oldest record not
landed yet (0 when caught up); ``stuck`` is the poller's verdict (mqd.consumer.log_end_poller).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mqd.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    tp: TopicPartition
    epoch: int  # assignment epoch
    position: int
    committed: int | None
    marked: int | None
    log_start: int | None
    log_end: int | None
    pull_node: str | None
    paused: bool
    in_flight: bool
    flow_control: str | None  # the threshold holding it back now
    buffered_records: int
    buffered_bytes: int
    parked: str | None
    last_error: str | None
    incarnation: str | None = None  # of the position; None: not known yet
    incarnation_changes: int = 0  # since assigned
    reused_offsets: int = 0  # landed under an old incarnation, reused by a new one
    lost_offsets: int = 0  # reported lost for good by the source (DATA_LOST)
    landed: int | None = None  # next offset after what is landed (marked handled)
    landed_event_time_ms: int | None = None  # newest landed record's event time, since start
    log_end_age_s: float | None = None  # since the last log-end poll answer
    stalled_polls: int = 0  # polls in a row without landed progress while behind
    stuck: bool = False  # stalled for consumer.stuck_intervals polls while the log end grew
    last_error_age_s: float | None = None  # since last_error was last set
    # the partition's leader (mqd: the master) by the metadata; pull_node differs from it while a
    # replica serves the reads (the mqd broker's slave suggestion, Kafka's preferred read replica)
    leader: str | None = None
    # wall-clock ms at which the first record not landed yet entered the log, as the log-end poller
    # saw it (LagView.unlanded_since_ms); None: caught up, or not polled yet
    unlanded_since_ms: int | None = None

    @property
    def lag(self) -> int | None:
        """Records in the log not landed yet: the log end minus the landed offset, or minus the
        committed one when nothing is marked (None when neither is known, as Kafka's tools show)."""
        done = self.landed if self.landed is not None else self.committed
        return records_behind(self.log_end, done)

    @property
    def fetch_lag(self) -> int | None:
        """Records in the log not fetched yet (the log end minus the fetch position)."""
        return records_behind(self.log_end, self.position)

    @property
    def landed_lag(self) -> int | None:
        """The log end minus the landed offset (kept beside ``lag``, which falls back to committed)."""
        return records_behind(self.log_end, self.landed)

    def time_lag_s(self, now_ms: float) -> float | None:
        """The age of the oldest record not landed yet, in seconds: 0 when caught up, so an idle
        topic's time lag does not grow. Before the poller knows when that record arrived: now minus
        the newest landed record's event time (None when nothing landed since start)."""
        return unlanded_age_s(self.lag, self.unlanded_since_ms, self.landed_event_time_ms, now_ms)

    def at_log_end(self) -> bool:
        """Fetched up to the last known log end and nothing of it is buffered."""
        return self.log_end is not None and self.position >= self.log_end and not self.buffered_records


def records_behind(log_end: int | None, offset: int | None) -> int | None:
    """Records from ``offset`` to the log end (never negative: a log end polled before a fetch answer
    moved past it); None when either is unknown."""
    if log_end is None or offset is None:
        return None
    return max(0, log_end - offset)


def unlanded_age_s(
    lag: int | None, unlanded_since_ms: int | None, landed_event_time_ms: int | None, now_ms: float
) -> float | None:
    """See :meth:`PartitionSnapshot.time_lag_s`; a time in the future counts as 0, not negative."""
    if lag == 0:
        return 0.0
    since = unlanded_since_ms if unlanded_since_ms is not None else landed_event_time_ms
    if since is None:
        return None
    return round(max(0.0, now_ms - since) / 1000, 3)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    node_id: str
    requests: int
    errors: int
    in_flight: bool
    last_error: str | None
    backoff_s: float


@dataclass(frozen=True, slots=True)
class Totals:
    owned: int
    buffered_bytes: int
    buffered_records: int
    budget_bytes: int
    reserved_bytes: int
    pinned_bytes: int
    pinned_bodies: int
    rebalances: int
    offset_resets: int
    parked: tuple[str, ...]  # sorted "topic/partition"
    incarnation_changes: int = 0  # since start, all partitions (also those revoked since)
    reused_offsets: int = 0
    lost_offsets: int = 0
    stuck: tuple[str, ...] = ()  # sorted "topic/partition"
    # RSS above the idle baseline the charges do not cover (counted against the budget)
    memory_outside_bytes: int = 0
    budget_used_bytes: int = 0  # what the budget counts against budget_bytes (ByteBudget.used)


@dataclass(frozen=True, slots=True)
class Errors:
    metadata: str | None
    heartbeat: str | None
    offset_store: str | None
    rebalance: str | None

    def items(self) -> list[tuple[str, str | None]]:
        return [
            ("metadata", self.metadata),
            ("heartbeat", self.heartbeat),
            ("offset_store", self.offset_store),
            ("rebalance", self.rebalance),
        ]


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    member_id: str
    group: str
    mode: str
    member_version: int | None
    members: tuple[str, ...]
    coordinator: str | None
    allocation: str
    partitions: tuple[PartitionSnapshot, ...]  # sorted by partition
    totals: Totals
    nodes: tuple[NodeSnapshot, ...]  # sorted by node id
    errors: Errors


def consumer_status_json(snap: ConsumerSnapshot) -> dict[str, Any]:
    """The consumer section of the status JSON (the admin endpoint, ``mqd status --json``)."""
    nodes = {
        n.node_id: {
            "requests": n.requests,
            "errors": n.errors,
            "in_flight": n.in_flight,
            "last_error": n.last_error,
            "backoff_s": n.backoff_s,
        }
        for n in snap.nodes
    }
    t = snap.totals
    now_ms = time.time() * 1000
    return {
        "member_id": snap.member_id,
        "group": snap.group,
        "mode": snap.mode,
        "generation": snap.member_version,
        "members": list(snap.members),
        "coordinator": snap.coordinator,
        "allocation": snap.allocation,
        "assignment": {
            str(p.tp): {
                "topic": p.tp.topic,
                "partition": p.tp.partition,
                "generation": p.epoch,
                "position": p.position,
                "committed": p.committed,
                "marked": p.marked,
                "log_start": p.log_start,
                "log_end": p.log_end,
                "lag": p.lag,
                "fetch_lag": p.fetch_lag,
                "pull_node": p.pull_node,
                "leader": p.leader,
                "paused": p.paused,
                "in_flight": p.in_flight,
                "flow_control": p.flow_control,
                "buffered_records": p.buffered_records,
                "buffered_bytes": p.buffered_bytes,
                "parked": p.parked,
                "last_error": p.last_error,
                "last_error_age_s": p.last_error_age_s,
                "incarnation": p.incarnation,
                "incarnation_changes": p.incarnation_changes,
                "reused_offsets": p.reused_offsets,
                "lost_offsets": p.lost_offsets,
                "landed": p.landed,
                "landed_lag": p.landed_lag,
                "landed_event_time_ms": p.landed_event_time_ms,
                "time_lag_s": p.time_lag_s(now_ms),
                "unlanded_since_ms": p.unlanded_since_ms,
                "log_end_age_s": p.log_end_age_s,
                "stalled_polls": p.stalled_polls,
                "stuck": p.stuck,
            }
            for p in snap.partitions
        },
        "totals": {
            "owned": t.owned,
            "buffered_bytes": t.buffered_bytes,
            "buffered_records": t.buffered_records,
            "budget_bytes": t.budget_bytes,
            "reserved_bytes": t.reserved_bytes,
            "pinned_bytes": t.pinned_bytes,
            "pinned_answers": t.pinned_bodies,
            "requests_per_node": {n.node_id: n.requests for n in snap.nodes},
            "rebalances": t.rebalances,
            "offset_resets": t.offset_resets,
            "parked": list(t.parked),
            "incarnation_changes": t.incarnation_changes,
            "reused_offsets": t.reused_offsets,
            "lost_offsets": t.lost_offsets,
            "stuck": list(t.stuck),
            "memory_outside_bytes": t.memory_outside_bytes,
            "budget_used_bytes": t.budget_used_bytes,
        },
        "nodes": nodes,
        "errors": dict(snap.errors.items()),
    }
