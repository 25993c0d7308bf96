"""Prometheus metrics of the daemon (one registry per process, served by the admin endpoint).

Modules import the objects they update; the hot path updates counters per partition fetch result or
per batch, never per record.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

REGISTRY = CollectorRegistry(auto_describe=True)

records_fetched = Counter(
    "mqd_records_fetched", "Records received from brokers", ["topic", "partition"], registry=REGISTRY
)
bytes_fetched = Counter(
    "mqd_bytes_fetched", "Batch bytes received from brokers", ["topic", "partition"], registry=REGISTRY
)
fetch_requests = Counter("mqd_fetch_requests", "Fetch requests sent", ["node"], registry=REGISTRY)
fetch_errors = Counter("mqd_fetch_errors", "Failed fetch requests", ["node", "kind"], registry=REGISTRY)
fetch_latency = Histogram(
    "mqd_fetch_latency_seconds",
    "Fetch request round trip (includes long-poll wait)",
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
consumer_lag = Gauge(
    "mqd_consumer_lag", "Log end offset minus position", ["topic", "partition"], registry=REGISTRY
)
buffered_bytes = Gauge("mqd_buffered_bytes", "Bytes held in process queues", registry=REGISTRY)
rebalances = Counter("mqd_rebalances", "Rebalances that changed the assignment", registry=REGISTRY)
assigned_partitions = Gauge("mqd_assigned_partitions", "Partitions owned", registry=REGISTRY)
commit_latency = Histogram(
    "mqd_commit_latency_seconds",
    "Offset commit round trip",
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
commits = Counter("mqd_commits", "Offset commits", ["result"], registry=REGISTRY)
files_published = Counter("mqd_files_published", "Parquet files published", ["topic"], registry=REGISTRY)
records_published = Counter(
    "mqd_records_published", "Records in published files", ["topic"], registry=REGISTRY
)
bytes_published = Counter("mqd_bytes_published", "Parquet bytes published", ["topic"], registry=REGISTRY)
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
    "mqd_records_cut",
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
landing_errors = Counter("mqd_landing_errors", "Landing write failures", ["kind"], registry=REGISTRY)
event_time_ahead_records = Counter(
    "mqd_event_time_ahead_records",
    "Records landed in files stamped past landing.max_event_ahead (the watermark ignores them)",
    ["topic"],
    registry=REGISTRY,
)

# -- process (mqd.runner) ---------------------------------------------------------------------------
# Added by the ops work: process figures (RSS, CPU, fds) and the service's own life cycle.
ProcessCollector(registry=REGISTRY)
reloads = Counter("mqd_reloads", "Config reloads", ["result"], registry=REGISTRY)  # ok | refused
daemon_state = Gauge("mqd_daemon_state", "1 for the runner's current state", ["state"], registry=REGISTRY)
