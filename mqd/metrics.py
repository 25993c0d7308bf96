"""Prometheus metrics of the daemon (one registry per process, served by the admin endpoint).

Modules import the objects they update; the hot path updates counters per partition fetch result or
per batch, never per record.

Names follow the Prometheus conventions: the unit ends the name, before the ``_total`` the client
adds to counters (``mqd_fetched_bytes_total``); no ``*_created`` series (they double every counter
and histogram and no dashboard reads them); ``mqd_build_info{version}`` is 1. The per-partition
offset gauges (committed, landed, log end, lag, time lag, freshness) are set by the log-end poller
(mqd.consumer.log_end_poller) on its timer, whatever the partition's state; the fetch lag also by
each fetch answer.
"""

from __future__ import annotations

import contextlib
from typing import Any

# from their submodules: in the mqd command the package's __init__ (its HTTP servers, push gateway)
# is not run (mqd/package_without_init.py)
from prometheus_client.metrics import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from mqd import __version__

# process-wide: also for the registries embedders make
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry(auto_describe=True)

build_info = Gauge(
    "mqd_build_info", "Always 1; the labels say which mqd runs", ["version"], registry=REGISTRY
)
build_info.labels(__version__).set(1)

records_fetched = Counter(
    "mqd_fetched_records", "Records received from brokers", ["topic", "partition"], registry=REGISTRY
)
bytes_fetched = Counter(
    "mqd_fetched_bytes", "Batch bytes received from brokers", ["topic", "partition"], registry=REGISTRY
)
fetch_requests = Counter("mqd_fetch_requests", "Fetch requests sent", ["node"], registry=REGISTRY)
fetch_errors = Counter("mqd_fetch_errors", "Failed fetch requests", ["node", "kind"], registry=REGISTRY)
fetch_wakeups_lost = Counter(
    "mqd_fetch_wakeups_lost",
    "Fetches sent by a fetcher's idle re-check that no wake-up had announced (a bug: see the log)",
    ["node"],
    registry=REGISTRY,
)
fetch_polls_cut = Counter(
    "mqd_fetch_polls_cut",
    "Long polls ended early because a partition with a backlog was routed to their node meanwhile",
    ["node"],
    registry=REGISTRY,
)
fetch_flow_polls = Counter(
    "mqd_fetch_flow_polls",
    "Long polls that asked the broker to wait for flow_min_bytes while records were flowing",
    ["node"],
    registry=REGISTRY,
)
fetch_duration = Histogram(
    "mqd_fetch_duration_seconds",
    "Fetch request round trip, including the broker's long-poll wait (up to fetch_max_wait_ms)",
    ["node"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
# The wire does not say how long the broker held the request, so latency is the round trip beyond
# the requested max wait (0 when the answer came earlier: data arrived, or the wait was cut short)
fetch_latency = Histogram(
    "mqd_fetch_latency_seconds",
    "Fetch round trip beyond the requested long-poll wait (the broker does not report its wait)",
    ["node"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
fetch_partitions = Histogram(
    "mqd_fetch_partitions",
    "Partitions per fetch request",
    ["node"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024),
    registry=REGISTRY,
)
fetch_partitions_unchanged = Counter(
    "mqd_fetch_partitions_unchanged",
    "Partitions a fetch answer left out: nothing new at the offset asked for (changes_only)",
    ["node"],
    registry=REGISTRY,
)
flow_control_events = Counter(
    "mqd_flow_control_events", "Times a partition was held back", ["reason"], registry=REGISTRY
)
offset_resets = Counter(
    "mqd_offset_resets",
    "Illegal offsets moved by broker answer or policy",
    ["topic", "partition", "status"],
    registry=REGISTRY,
)
stale_responses = Counter(
    "mqd_stale_responses", "Partition results dropped by the response callback", ["reason"], registry=REGISTRY
)
# lag as kafka-consumer-groups means it (kafka_consumergroup_lag): records not committed, which in
# mqd is not landed; the fetch position's figure is 0 while fetched records wait to land
consumer_lag = Gauge(
    "mqd_consumer_lag",
    "Records not landed yet: log end offset (last stable under read_committed) minus the landed "
    "offset, polled on a timer whatever the partition's state",
    ["topic", "partition"],
    registry=REGISTRY,
)
consumer_fetch_lag = Gauge(
    "mqd_consumer_fetch_lag",
    "Records not fetched yet: log end offset minus the fetch position (fetched records may still "
    "wait to land: see mqd_consumer_lag)",
    ["topic", "partition"],
    registry=REGISTRY,
)
consumer_time_lag = Gauge(
    "mqd_consumer_time_lag_seconds",
    "Age of the oldest record not landed yet (since the log-end poller saw it in the log), 0 when caught up",
    ["topic", "partition"],
    registry=REGISTRY,
)
log_end_offset = Gauge(
    "mqd_log_end_offset",
    "The source's log end offset, asked on a timer whatever the partition's state",
    ["topic", "partition"],
    registry=REGISTRY,
)
committed_offset = Gauge(
    "mqd_committed_offset", "Offset committed to the group's store", ["topic", "partition"], registry=REGISTRY
)
landed_offset = Gauge(
    "mqd_landed_offset",
    "Next offset after what is landed (the daemon marks what it published)",
    ["topic", "partition"],
    registry=REGISTRY,
)
landing_freshness = Gauge(
    "mqd_landing_freshness_seconds",
    "Now minus the event time of the newest landed record (set once something landed since start)",
    ["topic", "partition"],
    registry=REGISTRY,
)
stuck_partitions = Gauge(
    "mqd_stuck_partitions",
    "Partitions with no landed progress for consumer.stuck_intervals polls while their log end grew",
    registry=REGISTRY,
)
log_end_poll_errors = Counter(
    "mqd_log_end_poll_errors", "Failed log-end lookups (per node and poll)", ["node"], registry=REGISTRY
)
buffered_bytes = Gauge("mqd_buffered_bytes", "Bytes held in process queues", registry=REGISTRY)
memory_outside_budget = Gauge(
    "mqd_memory_outside_budget_bytes",
    "RSS above the idle baseline that the byte budget's charges do not cover, counted against it",
    registry=REGISTRY,
)
memory_outside_capped = Counter(
    "mqd_memory_outside_capped",
    "Budget readings where memory outside its charges was over half of max_buffered_bytes",
    registry=REGISTRY,
)
rebalances = Counter("mqd_rebalances", "Rebalances that changed the assignment", registry=REGISTRY)
assigned_partitions = Gauge("mqd_assigned_partitions", "Partitions owned", registry=REGISTRY)
commit_latency = Histogram(
    "mqd_commit_latency_seconds",
    "Offset commit round trip",
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
commits = Counter("mqd_commits", "Offset commits", ["result"], registry=REGISTRY)
files_published = Counter("mqd_published_files", "Parquet files published", ["topic"], registry=REGISTRY)
records_published = Counter(
    "mqd_published_records", "Records in published files", ["topic"], registry=REGISTRY
)
bytes_published = Counter("mqd_published_bytes", "Parquet bytes published", ["topic"], registry=REGISTRY)
publish_conflicts = Counter(
    "mqd_publish_conflicts",
    "Publications lost to another owner (batch dropped, re-seek)",
    ["topic"],
    registry=REGISTRY,
)
publish_latency = Histogram(
    "mqd_publish_latency_seconds",
    "Encode + write + fsync + link of one file",
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
records_cut = Counter(
    "mqd_cut_records",
    "Records cut on arrival: at or below the landed (or buffered) end of their log incarnation",
    ["topic"],
    registry=REGISTRY,
)
incarnation_changes = Counter(
    "mqd_incarnation_changes",
    "Partition logs found replaced or truncated (a new log incarnation)",
    ["topic", "partition"],
    registry=REGISTRY,
)
reused_offsets = Counter(
    "mqd_reused_offsets",
    "Offsets landed under an old incarnation that a new incarnation of the log holds other records at",
    ["topic", "partition"],
    registry=REGISTRY,
)
lost_offsets = Counter(
    "mqd_lost_offsets",
    "Offsets in fenced holes the broker reported as lost (DATA_LOST), skipped after a log line",
    ["topic", "partition"],
    registry=REGISTRY,
)
start_position_retries = Counter(
    "mqd_start_position_retries",
    "Start positions of new partitions not resolved (landing lock held past its bound, state "
    "unreadable); the others are assigned, these retried in the next rebalance round",
    registry=REGISTRY,
)
landing_lock_timeouts = Counter(
    "mqd_landing_lock_timeouts",
    "Landing writes given up because a partition's lock stayed held past its bound (a frozen "
    "holder?); retried later",
    ["operation"],
    registry=REGISTRY,
)
landing_errors = Counter("mqd_landing_errors", "Landing write failures", ["kind"], registry=REGISTRY)
landing_chain_broken = Counter(
    "mqd_landing_chain_broken",
    "Partitions stopped on a broken claim chain (a claim deleted, overwritten or unreadable)",
    ["topic"],
    registry=REGISTRY,
)
event_time_ahead_records = Counter(
    "mqd_event_time_ahead_records",
    "Records landed in files stamped past landing.max_event_ahead (the watermark ignores them)",
    ["topic"],
    registry=REGISTRY,
)
# landing.table = "delta" (mqd/landing/table_committer.py)
landing_table_commits = Counter(
    "mqd_landing_table_commits", "Commits to the landing's Delta table that landed", registry=REGISTRY
)
landing_table_files = Counter(
    "mqd_landing_table_files", "Landed files added to the landing's Delta table", registry=REGISTRY
)
landing_table_commits_dropped = Counter(
    "mqd_landing_table_commits_dropped",
    "Landing table commits refused as stale: another committer added those partitions' files first",
    registry=REGISTRY,
)
landing_table_errors = Counter(
    "mqd_landing_table_errors", "Landing table rounds that failed (retried next round)", registry=REGISTRY
)
landing_table_files_gone = Counter(
    "mqd_landing_table_files_gone",
    "Published files not added to the landing table: deleted before any commit of their partition",
    registry=REGISTRY,
)
landing_table_files_removed = Counter(
    "mqd_landing_table_files_removed",
    "Files the lifecycle removed from the landing table (dataChange=false) before deleting them",
    registry=REGISTRY,
)
landing_table_commit_latency = Histogram(
    "mqd_landing_table_commit_seconds",
    "Duration of one landing table commit (all partitions' files of a round)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)


class PartitionChildren:
    """The per-partition children of one metric labelled ``[topic, partition]``, made once.

    ``labels()`` validates and converts its labels and takes the metric's lock on every call; the
    log-end poller sets seven such gauges for every owned partition each interval. A child is made
    on first use (a series appears only once it is set, as before), and :meth:`remove` drops the
    series and the cached child together, so a removed child is never set again.
    """

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, int], Any] = {}

    def get(self, tp: tuple[str, int]) -> Any:
        child = self._children.get(tp)
        if child is None:
            child = self._children[tp] = self._metric.labels(tp[0], str(tp[1]))
        return child

    def remove(self, tp: tuple[str, int]) -> None:
        self._children.pop(tp, None)
        with contextlib.suppress(KeyError):
            self._metric.remove(tp[0], str(tp[1]))


# the log-end poller's gauges (mqd.consumer.log_end_poller), by partition
committed_offset_of = PartitionChildren(committed_offset)
landed_offset_of = PartitionChildren(landed_offset)
log_end_offset_of = PartitionChildren(log_end_offset)
consumer_lag_of = PartitionChildren(consumer_lag)
consumer_fetch_lag_of = PartitionChildren(consumer_fetch_lag)
consumer_time_lag_of = PartitionChildren(consumer_time_lag)
landing_freshness_of = PartitionChildren(landing_freshness)

# -- process (mqd.process.runner) -------------------------------------------------------------------
# Added by the ops work: process figures (RSS, CPU, fds) and the service's own life cycle.
ProcessCollector(registry=REGISTRY)
reloads = Counter("mqd_reloads", "Config reloads", ["result"], registry=REGISTRY)  # ok | refused
daemon_state = Gauge("mqd_daemon_state", "1 for the runner's current state", ["state"], registry=REGISTRY)
