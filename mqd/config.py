"""Typed, frozen configuration for broker nodes and the daemon, loaded from TOML.

Every model rejects unknown keys; a bad file raises ConfigError naming the file, the key path and
what is allowed. ``MQD_<SECTION>__<KEY>`` environment variables override daemon keys (containers,
secrets): ``MQD_CONSUMER__GROUP=g`` sets ``consumer.group``; numbers, booleans and lists take TOML
syntax (``MQD_CONSUMER__TOPICS='["a", "b"]'``); any other ``MQD_`` variable that is not one of
NOT_OVERRIDES is an error (a misspelt override must not be ignored). Files are validated strictly:
``"100"`` is not a number.

The loader is the one edge that refuses what ``mqd run`` or the broker would refuse later (issue 13):
inf/NaN floats, integers past 64 bits, empty paths, broker URLs that are not http(s) with a host,
tokens with whitespace or control characters, topic names outside mqd.topic_name's rule. So
``mqd config check`` (and ``mqd run`` itself) exit 2 on them, before anything starts, instead of a
crash with exit 1 later that systemd would restart in a loop.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import tomllib
import unicodedata
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self, TypeVar, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    FiniteFloat,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mqd import units
from mqd.errors import MqdError
from mqd.lazy_import import lazy_import
from mqd.topic_name import check_topic_name
from mqd.topic_pattern import check_topic_entry
from mqd.units import Bytes, Millis, Seconds, jvm_memory

if TYPE_CHECKING:
    import difflib
else:
    difflib = lazy_import("difflib")  # "did you mean" of an error message: not on `mqd run`'s path

MiB = 1024 * 1024
# the one record-size limit's default (broker, producer, landing): measured, see mqd/record_size.py
DEFAULT_MAX_RECORD_BYTES = 16 * MiB
# the strategies of mqd.consumer.allocation
BUILTIN_ALLOCATIONS = ("averagely", "averagely-by-circle", "consistent-hash", "sticky")


class ConfigError(MqdError):
    """A config file is missing, unreadable or invalid. Not retriable: fix the file."""

    retriable = False


INT64_MAX = 2**63 - 1  # TOML's integer range, and the broker's largest integer in a request
MAX_SESSION_TIMEOUT_S = 3600  # the broker refuses a heartbeat's session_timeout_ms above 3_600_000
# the chars that would end or split the URL path segment a consumer group name is sent in
_URL_PATH_SPECIALS = frozenset("/?#%")


def _non_empty_path(value: Any) -> Any:
    # Path("") is Path("."): an empty value would silently mean the config file's folder
    if isinstance(value, str) and not value.strip():
        raise ValueError("a path may not be empty")
    return value


def _landing_dir(value: Any) -> Any:
    """A path, or an ``s3://bucket/prefix`` URI kept as text (as a Path it would lose a slash)."""
    if isinstance(value, str) and "://" in value:
        if not value.startswith("s3://"):
            raise ValueError("landing.dir is a path or an s3://bucket/prefix URI")
        if not value[5:].split("/", 1)[0]:
            raise ValueError("an s3:// landing needs a bucket: s3://bucket/prefix")
        return value
    return _non_empty_path(value)


def _table_dir(value: Any) -> Any:
    """A path, or an ``s3://bucket/path`` URI kept as text: the job writes it through S3A."""
    if isinstance(value, str) and "://" in value:
        if not value.startswith("s3://"):
            raise ValueError(
                f"{value.split('://', 1)[0]}:// cannot be written: a table is a path or an "
                "s3://bucket/path URI (S3A, with [spark.s3])"
            )
        if not value[5:].split("/", 1)[0] or not value[5:].split("/", 1)[1:]:
            raise ValueError("an s3:// table needs a bucket and a path: s3://bucket/path")
        return value.rstrip("/")
    return _non_empty_path(value)


def _landing_dir_type(value: Path | str) -> Path | str:
    # validation picks str for any text (it matches exactly): only a URI stays one
    return value if isinstance(value, Path) or value.startswith("s3://") else Path(value)


def _endpoint_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("an S3 endpoint is an http:// or https:// URL with a host")
    return value


def _bad_chars(value: str) -> list[str]:
    """Whitespace and control (or other non-printing) characters, as shown in messages."""
    return [repr(c) for c in value if c.isspace() or unicodedata.category(c).startswith("C")]


def _token(value: str) -> str:
    # a newline in a token splits the Authorization header; a space makes it a different scheme
    bad = _bad_chars(value)
    if bad:
        raise ValueError(
            f"a token may not contain whitespace or control characters ({', '.join(sorted(set(bad)))})"
        )
    return value


def _http_url(value: str) -> str:
    """An http:// or https:// URL with a host (and a valid port, if any): what the client can call."""
    if _bad_chars(value):
        raise ValueError("a URL may not contain whitespace or control characters")
    if "://" not in value:
        raise ValueError(
            "mqd broker addresses are http:// URLs; for a Kafka cluster set consumer.source = 'kafka'"
        )
    try:
        parts = urllib.parse.urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"a broker URL starts with http:// or https://, got {parts.scheme}://")
    if not parts.hostname:
        raise ValueError("a broker URL needs a host (http://HOST:PORT)")
    if parts.query or parts.fragment:
        raise ValueError("a broker URL has no query or fragment (http://HOST:PORT)")
    # the client appends /v1/...: "http://host:9400/" would call //v1/... and get 404s
    return value.rstrip("/")


def _bootstrap_address(value: str, info: ValidationInfo) -> str:
    """The source decides the form (consumer.source, validated before bootstrap): an http(s) URL
    for mqd, HOST:PORT for Kafka. An invalid source is reported on its own."""
    source = info.data.get("source")
    if source == "kafka":
        return _host_port(value)
    return _http_url(value) if source == "mqd" else value


def _host_port(value: str) -> str:
    """HOST:PORT (a Kafka bootstrap server; [v6]:PORT for IPv6)."""
    if "://" in value:
        raise ValueError(f"a Kafka bootstrap server is HOST:PORT, not a URL (got {value!r})")
    if "," in value:  # Kafka's bootstrap.servers is one string; here each server is an entry
        servers = ", ".join(f'"{v.strip()}"' for v in value.split(",") if v.strip())
        raise ValueError(f"one server per entry: bootstrap = [{servers}]")
    host, sep, port = value.rpartition(":")
    if _bad_chars(value) or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a Kafka bootstrap server is HOST:PORT with a port in 1..65535 (got {value!r})")
    return value


_CONSUME_FROM_ALIASES = {"earliest": "first", "latest": "last"}


def _consume_from_alias(value: Any) -> Any:
    return _CONSUME_FROM_ALIASES.get(value, value) if isinstance(value, str) else value


def _spark_seconds(value: Any) -> Any:
    # a bare number is seconds, as for every float-seconds key; Spark reads "N seconds"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value} seconds"
    return value


ConsumeFrom = Annotated[Literal["last", "first", "timestamp"], BeforeValidator(_consume_from_alias)]

# every float field takes a finite type (mqd.units.Seconds is one): inf and NaN pass a plain float
# and then overflow where the daemon turns seconds into milliseconds (OverflowError at `mqd run`,
# exit 1 instead of 2)
Float = FiniteFloat
ConfigPath = Annotated[Path, BeforeValidator(_non_empty_path)]
# str: an s3:// URI. str first: validation of text picks the first member that takes it
LandingDir = Annotated[str | Path, BeforeValidator(_landing_dir), AfterValidator(_landing_dir_type)]
TableDir = Annotated[str | Path, BeforeValidator(_table_dir), AfterValidator(_landing_dir_type)]
Token = Annotated[str, AfterValidator(_token)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
BootstrapAddress = Annotated[str, AfterValidator(_bootstrap_address)]
TopicName = Annotated[str, AfterValidator(check_topic_name)]
TopicEntry = Annotated[str, AfterValidator(check_topic_entry)]  # a name or a "re:" pattern


class _Model(BaseModel):
    # defer_build: a model's validator is built when it first validates, so `mqd run` builds only
    # the daemon's (the broker's models stay unbuilt; a few ms of its start-up, issue 16)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, defer_build=True)

    @field_validator("*", mode="after")
    @classmethod
    def _usable_value(cls, value: Any) -> Any:
        # the OS refuses such a path later, with a ValueError far from the config file
        if isinstance(value, Path) and "\0" in str(value):
            raise ValueError("a path may not contain a NUL character")
        # the same for any text: a host, an id or a schema with NUL fails far from the file
        if isinstance(value, str) and "\0" in value:
            raise ValueError("text here may not contain a NUL character")
        # TOML takes integers of any size; past 64 bits they overflow a float or the broker refuses them
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX <= value <= INT64_MAX:
            raise ValueError(f"an integer here must be within +-{INT64_MAX}")
        return value


# ---------------------------------------------------------------------------------------------
# broker cluster


class NodeSpec(_Model):
    id: str = Field(min_length=1)
    url: HttpUrl
    role: Literal["master", "slave"]


class BrokerGroupSpec(_Model):
    name: str = Field(min_length=1)
    nodes: list[NodeSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_master(self) -> Self:
        masters = [n for n in self.nodes if n.role == "master"]
        if len(masters) != 1:
            raise ValueError(f"group {self.name!r} needs exactly one master, has {len(masters)}")
        return self

    @property
    def master(self) -> NodeSpec:
        return next(n for n in self.nodes if n.role == "master")

    @property
    def slaves(self) -> list[NodeSpec]:
        return [n for n in self.nodes if n.role == "slave"]


class TopicSpec(_Model):
    name: TopicName
    partitions: int = Field(ge=1, le=4096)
    # partition i lives on groups[i % len(groups)]; empty means every group, in cluster order
    groups: list[str] = Field(default_factory=list)


class ClusterConfig(_Model):
    groups: list[BrokerGroupSpec] = Field(min_length=1)
    topics: list[TopicSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        ids = [n.id for g in self.groups for n in g.nodes]
        if len(ids) != len(set(ids)):
            raise ValueError("node ids must be unique across the cluster")
        names = {g.name for g in self.groups}
        for t in self.topics:
            for g in t.groups:
                if g not in names:
                    raise ValueError(f"topic {t.name!r} names unknown group {g!r}")
        return self

    def broker_group_of(self, topic: str, partition: int) -> BrokerGroupSpec | None:
        t = next((t for t in self.topics if t.name == topic), None)
        if t is None or not 0 <= partition < t.partitions:
            return None
        names = t.groups or [g.name for g in self.groups]
        name = names[partition % len(names)]
        return next(g for g in self.groups if g.name == name)

    def node(self, node_id: str) -> tuple[BrokerGroupSpec, NodeSpec] | None:
        for g in self.groups:
            for n in g.nodes:
                if n.id == node_id:
                    return g, n
        return None


class StorageConfig(_Model):
    segment_bytes: Bytes = Field(default=256 * MiB, ge=4096)
    retention_bytes: Bytes = Field(default=-1, ge=-1)  # per partition; -1 keeps everything
    retention_ms: Millis = Field(default=-1, ge=-1)  # by newest timestamp of a segment; -1 keeps
    fsync: Literal["always", "interval", "never"] = "interval"
    fsync_interval_ms: Millis = Field(default=1000, ge=1)
    retention_check_interval_ms: Millis = Field(default=60_000, ge=100)
    # the background CRC scrub of closed segments (broker/scrub.py) reads at most this many bytes a
    # second per node, so it never starves fetches: 1 MiB/s checks 3.6 GB an hour; 0 turns it off
    scrub_bytes_per_second: Bytes = Field(default=1 * MiB, ge=0)


class BrokerLimits(_Model):
    max_request_bytes: Bytes = Field(default=64 * MiB, ge=1024)
    # largest record (key + value + headers) accepted, 413 record_too_large above (mqd/record_size.py)
    max_record_bytes: Bytes = Field(default=DEFAULT_MAX_RECORD_BYTES, ge=1)
    max_fetch_bytes: Bytes = Field(default=64 * MiB, ge=1024)
    max_wait_ms: Millis = Field(default=30_000, ge=0)
    max_partitions_per_fetch: int = Field(default=10_000, ge=1)
    # a body not received whole this long after its headers is cut with 408 (one fd per stalled
    # sender otherwise lasts forever); 64 MiB takes ~5 s at 100 Mbit/s
    body_timeout_ms: Millis = Field(default=10_000, ge=100, le=3_600_000)
    # fetches held at once on the node (each holds a task, a socket and its buffers); above it 429
    max_long_polls: int = Field(default=1000, ge=1)
    # a request's headers not received whole this long after the connection opened (or their first
    # byte on a kept-alive one) are cut with 408: a slow sender would hold its fd until keep-alive
    header_timeout_ms: Millis = Field(default=20_000, ge=100, le=3_600_000)


class BrokerConfig(_Model):
    """One node: which node of the cluster it is, where its data lives, how it behaves."""

    node_id: str
    cluster_file: ConfigPath  # relative to the node's config file
    data_dir: ConfigPath
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)  # default: the port of the node's url
    offset_check_in_slave: bool = False
    slave_suggest_lag_bytes: Bytes = Field(default=64 * MiB, ge=0)  # RocketMQ's "40% of RAM"
    session_timeout_ms: Millis = Field(default=10_000, ge=100)
    liveness_interval_ms: Millis = Field(default=1000, ge=50)
    liveness_timeout_ms: Millis = Field(default=3000, ge=100)
    replica_wait_ms: Millis = Field(default=1000, ge=0)  # replica long-poll
    acks_all_timeout_ms: Millis = Field(default=10_000, ge=1)
    auth_token: Token | None = Field(default=None, repr=False)
    tls_cert: ConfigPath | None = None
    tls_key: ConfigPath | None = None
    tls_ca_file: ConfigPath | None = None  # CA bundle to verify peers' certificates (default: system store)
    # this node's replica credentials (`mqd broker-credentials`): required in a group of 2+ nodes
    replica_credentials: ConfigPath | None = None
    log_level: str = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    storage: StorageConfig = Field(default_factory=StorageConfig)
    limits: BrokerLimits = Field(default_factory=BrokerLimits)

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        # the node's logging setup takes any level name the logging module knows (case-insensitive)
        if not isinstance(logging.getLevelName(value.upper()), int):
            raise ValueError(f"unknown log level {value!r}; allowed: debug, info, warning, error")
        return value


# ---------------------------------------------------------------------------------------------
# daemon


class KafkaConfig(_Model):
    """``[consumer.kafka]``: how to reach a Kafka-protocol cluster (consumer.source = "kafka")."""

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = Field(default=None, repr=False)  # better: MQD_CONSUMER__KAFKA__SASL_PASSWORD
    tls_ca_file: ConfigPath | None = None  # CA bundle for the brokers' certificates (default: system store)
    tls_cert_file: ConfigPath | None = None  # client certificate (mutual TLS)
    tls_key_file: ConfigPath | None = None
    tls_check_hostname: bool = True
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    client_id: str = Field(default="", max_length=1024)  # default: consumer.client_id's
    # the member's stable name: the strategy hands a restarted daemon the same share; "" = its member id
    group_instance_id: str = Field(default="", max_length=249)
    # KIP-345 with group_instance_id: a stop does not leave, so a restart within session_timeout does
    # not re-form the group (off by default: Tansu 0.6 can keep a stopped static member for good)
    static_membership: bool = False
    # incremental fetch sessions (KIP-227, Fetch v7+) where the broker grants one; false: full requests
    fetch_sessions: bool = True
    # KIP-392 (Kafka's client.rack): sent as Fetch's rack_id, so a leader with a rack-aware replica
    # selector can name a same-rack follower to read from; "" = read from leaders only
    client_rack: str = Field(default="", max_length=255)
    # "classic": JoinGroup/SyncGroup with an mqd allocation strategy run by the elected leader;
    # "consumer": KIP-848's ConsumerGroupHeartbeat, the broker assigns (Kafka 4.0+)
    group_protocol: Literal["classic", "consumer"] = "classic"
    # with group_protocol = "consumer": the broker's assignor by its name ("uniform", "range");
    # "" = the broker's default (group.consumer.assignors' first)
    remote_assignor: str = Field(default="", max_length=255)

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if self.security_protocol.startswith("SASL_") and (
            self.sasl_username is None or self.sasl_password is None
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_username and sasl_password"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (mutual TLS)")
        if self.static_membership and not self.group_instance_id:
            raise ValueError("static_membership needs a group_instance_id (the member's static name)")
        if self.remote_assignor and self.group_protocol != "consumer":
            raise ValueError(
                'remote_assignor names the broker\'s assignor: it needs group_protocol = "consumer"'
            )
        return self


class ConsumerConfig(_Model):
    source: Literal["mqd", "kafka"] = "mqd"  # the queue: mqd brokers, or a Kafka-protocol cluster
    group: str = Field(default="mqd", min_length=1, max_length=255)  # the broker's limit
    client_id: str = Field(default="", max_length=1024)  # default: hostname-pid
    # mqd: http(s) URLs of broker nodes; kafka: HOST:PORT bootstrap servers
    bootstrap: list[BootstrapAddress] = Field(default_factory=lambda: ["http://127.0.0.1:9400"], min_length=1)
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    # names, or "re:<regex>" patterns matched against whole topic names (mqd/topic_pattern.py)
    topics: list[TopicEntry] = Field(default_factory=lambda: ["events"], min_length=1)
    mode: Literal["cluster", "broadcast"] = "cluster"
    # Kafka's words are aliases: earliest = first, latest = last (auto.offset.reset's habit)
    consume_from: ConsumeFrom = "first"
    consume_timestamp_ms: int | None = None  # for consume_from = "timestamp"
    allocation: str = "averagely"
    on_offset_reset: Literal["broker", "earliest", "latest", "fail"] = "broker"
    rebalance_interval: Seconds = Field(default=20.0, gt=0)
    heartbeat_interval: Seconds = Field(default=3.0, gt=0)
    session_timeout: Seconds = Field(default=10.0, gt=0, le=MAX_SESSION_TIMEOUT_S)
    metadata_refresh_interval: Seconds = Field(default=30.0, gt=0)
    commit_interval: Seconds = Field(default=5.0, gt=0)
    # the log end of every owned partition is asked this often, whatever its state (true lag)
    log_end_interval: Seconds = Field(default=5.0, gt=0)
    # stuck: no landed progress for this many log-end polls while the log end grew
    stuck_intervals: int = Field(default=3, ge=1)
    max_queued_records: int = Field(default=1000, ge=1)
    max_queued_bytes: Bytes = Field(default=100 * MiB, ge=1)
    max_offset_span: int = Field(default=2000, ge=1)
    flow_control_retry_ms: Millis = Field(default=50, ge=1)
    # daemon-wide budget; the daemon charges whole fetch answers until published and counts its
    # RSS above idle beyond them (consumer/memory_gauge.py): the bound on the process's growth
    max_buffered_bytes: Bytes = Field(default=80 * MiB, ge=1)
    fetch_max_wait_ms: Millis = Field(default=500, ge=0)
    fetch_min_bytes: Bytes = Field(default=1, ge=0)
    # records flowing (the node's last answer held records, every partition of the next request at
    # its log end): that long poll asks the broker to wait up to flow_wait_ms for flow_min_bytes,
    # so a steady rate comes in fewer, fuller answers (decision 078: half the daemon's CPU at 50k
    # records/s); the landing counts the age of its records from the poll's send, so max_age still
    # bounds their latency. 0 turns it off; never longer than fetch_max_wait_ms, and the daemon
    # keeps it at most a tenth of landing.max_age
    flow_wait_ms: Millis = Field(default=100, ge=0)
    flow_min_bytes: Bytes = Field(default=1 * MiB, ge=1)
    fetch_max_bytes: Bytes = Field(default=32 * MiB, ge=1)
    partition_max_bytes: Bytes = Field(default=4 * MiB, ge=1)
    request_timeout: Seconds = Field(default=30.0, gt=0)
    error_backoff_ms: Millis = Field(default=100, ge=1)
    error_backoff_max_ms: Millis = Field(default=5000, ge=1)
    check_crc: bool = True
    # a fetched record larger than this (key + value + headers) parks its partition instead of
    # landing a file the Spark job cannot read; the same limit as the broker's (mqd/record_size.py)
    max_record_bytes: Bytes = Field(default=DEFAULT_MAX_RECORD_BYTES, ge=1)
    offset_file: ConfigPath = Path("state/offsets.json")  # broadcast mode
    auth_token: Token | None = Field(default=None, repr=False)
    tls_ca_file: ConfigPath | None = None  # CA bundle to verify brokers' certificates (default: system store)

    @model_validator(mode="after")
    def _timestamp_needs_time(self) -> Self:
        if self.consume_from == "timestamp" and self.consume_timestamp_ms is None:
            raise ValueError('consume_from = "timestamp" needs consume_timestamp_ms')
        if self.error_backoff_max_ms < self.error_backoff_ms:
            raise ValueError("error_backoff_max_ms must be >= error_backoff_ms")
        if self.kafka.group_protocol == "consumer" and self.source != "kafka":
            raise ValueError(
                'kafka.group_protocol = "consumer" is a Kafka group protocol: it needs source = "kafka"'
            )
        if self.kafka.group_protocol == "consumer" and "allocation" in self.model_fields_set:
            raise ValueError(
                "allocation is an mqd strategy run by the group's leader, and under kafka.group_protocol "
                '= "consumer" (KIP-848) the broker assigns partitions: leave allocation out and name '
                "the broker's assignor in kafka.remote_assignor instead"
            )
        return self

    @field_validator("group")
    @classmethod
    def _group_fits_a_url_path(cls, value: str) -> str:
        # the group is a path segment of the broker's URLs (/v1/groups/<group>/...)
        if value in (".", "..") or _bad_chars(value) or _URL_PATH_SPECIALS.intersection(value):
            raise ValueError(
                "a consumer group name may not be '.' or '..' nor contain whitespace, "
                "control characters or / ? # %"
            )
        return value

    @field_validator("allocation")
    @classmethod
    def _known_allocation(cls, value: str) -> str:
        names = set(BUILTIN_ALLOCATIONS)
        # strategies registered by embedding code count too; importing the consumer here would make
        # every CLI call pay for pyarrow and aiohttp, so only look if it is loaded already
        loaded = sys.modules.get("mqd.consumer.allocation")
        if loaded is not None:
            names.update(loaded.strategy_names())
        if value not in names:
            raise ValueError(f"unknown allocation strategy {value!r}; allowed: {', '.join(sorted(names))}")
        return value

    @property
    def effective_client_id(self) -> str:
        return self.client_id or f"{socket.gethostname()}-{os.getpid()}"


class LandingS3Config(_Model):
    """For an ``s3://`` landing.dir: an S3-compatible store (credentials: the AWS variables)."""

    endpoint_url: Annotated[str, AfterValidator(_endpoint_url)] | None = None  # None: AWS S3
    region: str | None = None  # None: from the AWS profile or AWS_REGION


def _archive_dir(value: str) -> str:
    if not value.startswith("_") or ".." in value.split("/"):
        raise ValueError(
            "landing.lifecycle.archive_dir is a folder of the landing starting with '_' (Spark skips it)"
        )
    return value.strip("/")


class LandingLifecycleConfig(_Model):
    """Deleting landed files every Spark query has committed (mqd/landing/lifecycle.py)."""

    # seconds between the daemon's cleans; 0: the daemon does not clean (``mqd landing clean`` does)
    interval: Seconds = Field(default=0.0, ge=0)
    # move committed files under this landing folder instead of deleting them
    archive_dir: Annotated[str, AfterValidator(_archive_dir)] | None = None
    # DATA LOSS: also delete files older than this that not every query has committed (0: never)
    retention: Seconds = Field(default=0.0, ge=0)


class LandingDeltaConfig(_Model):
    """``[landing.delta]``: the landing's Delta table (landing.table = "delta",
    mqd/landing/table_committer.py, mqd/landing/delta_log.py)."""

    # a commit at most this often (all owned partitions' new files in one), or sooner once
    # commit_files files were published
    commit_interval: Seconds = Field(default=5.0, gt=0)
    commit_files: int = Field(default=1000, ge=1)
    # a log checkpoint every this many commits (delta.checkpointInterval): what a reader replays
    checkpoint_interval: int = Field(default=100, ge=1)
    # log entries older than this expire at a checkpoint (delta.logRetentionDuration): a Delta
    # streaming reader of the table may stop this long. Short by default: every read of a local
    # log lists each entry kept (~24 us each, per round; at a commit every 5 s 1 h keeps ~800), and
    # each checkpoint kept lists every file (decision 059, bench/landing_table_log.py)
    log_retention: Seconds = Field(default=3600.0, ge=3600)


class LandingConfig(_Model):
    dir: LandingDir = Path("landing")  # a folder, or s3://bucket/prefix (object storage, issue 15)
    # large files by default (issue 15): size cuts first, max_age a latency bound. Row groups are
    # streamed into the open file (issue 16), so max_bytes costs disk, not memory; max_records is
    # high enough that bytes cut first for records above ~40 B
    max_records: int = Field(default=5_000_000, ge=1)
    max_bytes: Bytes = Field(default=128 * MiB, ge=1)
    max_age: Seconds = Field(default=60.0, gt=0)
    compression: Literal["snappy", "zstd", "gzip", "lz4", "none"] = "snappy"
    disk_retry_interval: Seconds = Field(default=1.0, gt=0)
    # seconds an event time may be ahead of the publishing wall clock and still move the partition's
    # watermark (mqd/landing/watermark.py); files stamped further ahead land but are counted instead
    max_event_ahead: Seconds = Field(default=3600.0, gt=0, le=10 * 365 * 86400)
    s3: LandingS3Config = Field(default_factory=LandingS3Config)
    lifecycle: LandingLifecycleConfig = Field(default_factory=LandingLifecycleConfig)
    # "delta" (the default since it passed chaos, issue 35): the daemon also commits what it
    # publishes to a Delta table at the landing's root (readable by delta-rs, DuckDB, Polars, Spark
    # seconds after it lands); "none": files only
    table: Literal["none", "delta"] = "delta"
    delta: LandingDeltaConfig = Field(default_factory=LandingDeltaConfig)


class SparkS3Config(_Model):
    """For an ``s3://`` table: the S3-compatible store S3A writes it to. Unset keys take
    ``[landing.s3]``'s; credentials come from the AWS chain (variables, profile, instance role)."""

    endpoint_url: Annotated[str, AfterValidator(_endpoint_url)] | None = None
    region: str | None = None
    # bucket in the path, not the host name: what MinIO, SeaweedFS and Ceph need; None: on when
    # endpoint_url is set (a store that is not AWS), off for AWS
    path_style: bool | None = None


def _registry_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if _bad_chars(value) or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"a schema registry URL is an http:// or https:// URL with a host, got {value!r}")
    return value


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


REGISTRY_FORMATS = (
    "avro",
    "json_schema",
    "protobuf",
)  # the Confluent wire format: 0, schema id, payload (mqd/spark/typed_records.py)


class SchemaRegistryConfig(_Model):
    """``[spark.schema_registry]``: a registry speaking Confluent's REST API (Confluent's own,
    Apicurio's ``/apis/ccompat/v7``, Karapace, Redpanda), asked for writer schemas by id."""

    # one URL, or several of one registry (tried in turn when one does not answer)
    url: Annotated[list[Annotated[str, AfterValidator(_registry_url)]], BeforeValidator(_one_or_many)] = (
        Field(min_length=1)
    )
    username: str | None = None  # basic auth
    password: str | None = Field(default=None, repr=False)  # better: MQD_SPARK__SCHEMA_REGISTRY__PASSWORD
    bearer_token: Token | None = Field(default=None, repr=False)
    tls_ca_file: ConfigPath | None = None  # CA bundle for an https registry (default: system store)
    request_timeout: Seconds = Field(default=10.0, gt=0)
    # a registry that does not answer is waited for (backoff, a warning each try) this long before
    # the batch fails and the job exits 1; never a dead letter for an outage; 0: fail at once
    retry_timeout: Seconds = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _one_auth(self) -> Self:
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together (basic auth)")
        if self.username is not None and self.bearer_token is not None:
            raise ValueError("basic auth (username, password) or bearer_token, not both")
        return self


class SparkConfig(_Model):
    master: str = "local[*]"
    app_name: str = "mqd-landing"
    # a folder, or s3://bucket/path (written through S3A, [spark.s3]); the checkpoint stays local
    output_dir: TableDir = Path("warehouse/events")
    checkpoint_dir: ConfigPath = Path("warehouse/_checkpoints/events")
    quarantine_dir: TableDir = Path("warehouse/_quarantine/events")
    s3: SparkS3Config = Field(default_factory=SparkS3Config)
    # delta: a Delta Lake table (every reader sees whole batches); iceberg: an Apache Iceberg table
    # (format 2, written by pyiceberg from the driver); parquet: the plain folder that mqd wrote
    # before table formats (mqd/spark/table_format.py)
    table_format: Literal["delta", "iceberg", "parquet"] = "delta"
    # iceberg: pyiceberg catalog properties ({ type = "rest", uri = "..." }, or "sql", "glue", ...);
    # none: the table's folder is its own catalog (no server; mqd/spark/iceberg_sink.py)
    iceberg_catalog: dict[str, str] | None = None
    # Delta table maintenance by the job (mqd/spark/table_maintenance.py): compaction to about
    # target_file_size and VACUUM of what no version younger than vacuum_retention needs, at most
    # every maintenance_interval (0: never; `mqd table optimize|vacuum` by hand then)
    maintenance_interval: Seconds = Field(default=3600.0, ge=0)
    target_file_size: Bytes = Field(default=128 * MiB, ge=1 * MiB)
    # a reader still on an older version needs its files: Delta's own default is 7 days
    vacuum_retention: Seconds = Field(default=7 * 86400.0, ge=3600)
    max_files_per_trigger: int = Field(default=1000, ge=1)
    # the duration syntax ("10s", "500ms") or Spark's own ("10 seconds"); Spark gets its own form
    trigger_interval: Annotated[str, BeforeValidator(_spark_seconds)] = Field(
        default="10s", validate_default=True
    )
    # raw: bytes as landed; json: parsed by value_schema (a Spark DDL); avro, json_schema, protobuf:
    # the Confluent wire format, decoded by the writer schema the registry names ([spark.schema_registry])
    value_format: Literal["raw", "json", "avro", "json_schema", "protobuf"] = "raw"
    value_schema: str = ""  # Spark DDL, for value_format = "json"
    key_format: Literal["raw", "avro", "json_schema", "protobuf"] = "raw"
    schema_registry: SchemaRegistryConfig | None = None
    # columns, named expressions ("to_date(ts) AS dt"), Iceberg transforms ("days(timestamp)"):
    # mqd/spark/partitioning.py; after what it checks against
    partition_by: list[str] = Field(default_factory=lambda: ["topic", "dt"])
    shuffle_partitions: int = Field(default=4, ge=1)
    driver_memory: str = "1g"  # the JVM's "1g", "512m" (1024-based) or the size syntax ("2GiB")
    log_level: Literal["ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"] = "WARN"  # log4j's
    ui: bool = False  # the Spark UI (bound to 127.0.0.1 for a local master), e.g. for the streaming unit
    ui_port: int = Field(default=4040, ge=1, le=65535)

    # what session or query start would refuse, refused here (mqd/spark/static_checks.py)
    @field_validator("master")
    @classmethod
    def _known_master(cls, value: str) -> str:
        from mqd.spark.static_checks import master_problem

        problem = master_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("trigger_interval")
    @classmethod
    def _spark_interval(cls, value: str) -> str:
        from mqd.spark.static_checks import trigger_interval

        return trigger_interval(value)

    @field_validator("driver_memory")
    @classmethod
    def _jvm_memory(cls, value: str) -> str:
        return jvm_memory(value)

    @field_validator("partition_by")
    @classmethod
    def _table_has_columns(cls, value: list[str], info: ValidationInfo) -> list[str]:
        from mqd.spark.static_checks import partition_problem, table_columns

        fmt, schema = info.data.get("value_format"), info.data.get("value_schema")
        table_format = info.data.get("table_format")
        if fmt is None or schema is None or table_format is None:  # reported on their own keys
            return value
        if fmt in REGISTRY_FORMATS:  # the value's columns come from the registry, asked at run time
            return value
        problem = partition_problem(value, table_columns(fmt, schema), table_format)
        if problem is not None:
            raise ValueError(problem)
        return value

    @property
    def has_dead_letters(self) -> bool:
        """The job writes a dead-letter table (at quarantine_dir): it parses or decodes records."""
        return self.value_format != "raw" or self.key_format in REGISTRY_FORMATS

    @model_validator(mode="after")
    def _json_needs_schema(self) -> Self:
        if self.value_format == "json" and not self.value_schema.strip():
            raise ValueError('value_format = "json" needs value_schema (a Spark DDL string)')
        for key in ("value_format", "key_format"):
            fmt = getattr(self, key)
            if fmt in REGISTRY_FORMATS and self.schema_registry is None:
                raise ValueError(
                    f'{key} = "{fmt}" reads the writer schema from a schema registry: it needs a '
                    "[spark.schema_registry] section with its url"
                )
            if fmt in REGISTRY_FORMATS and self.table_format == "parquet":
                raise ValueError(
                    f'{key} = "{fmt}" writes the table and its dead letters in one batch, exactly once '
                    'through each table\'s log: it needs table_format = "delta" or "iceberg"'
                )
        return self


class AdminConfig(_Model):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=9480, ge=0, le=65535)  # 0: any free port (written to state_dir/admin.json)
    auth_token: Token | None = Field(default=None, repr=False)  # every route but the probes, when set


class LogConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class DaemonSection(_Model):
    state_dir: ConfigPath = Path("state")
    pid_file: ConfigPath = Path("state/mqd.pid")  # default: <state_dir>/mqd.pid
    log_file: ConfigPath = Path("state/mqd.log")  # default: <state_dir>/mqd.log
    shutdown_timeout: Seconds = Field(default=30.0, gt=0)
    watchdog: bool = True

    @model_validator(mode="after")
    def _files_follow_state_dir(self) -> Self:
        # A second daemon on one host sets state_dir only: its pid and log files must not be the
        # first daemon's (it would refuse to start, or both would write one log).
        for key, name in (("pid_file", "mqd.pid"), ("log_file", "mqd.log")):
            if key not in self.model_fields_set:
                object.__setattr__(self, key, self.state_dir / name)
        return self


class MqdConfig(_Model):
    """The daemon's whole config file."""

    consumer: ConsumerConfig = Field(default_factory=ConsumerConfig)
    landing: LandingConfig = Field(default_factory=LandingConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    daemon: DaemonSection = Field(default_factory=DaemonSection)


# ---------------------------------------------------------------------------------------------
# loading


_M = TypeVar("_M", bound=BaseModel)
_SECRET_HINTS = ("token", "password", "secret", "key")


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that holds the key at ``loc`` (list indexes skipped), for "allowed keys"."""
    current: type[BaseModel] = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        ann: Any = field.annotation
        while get_origin(ann) in (list, Union, UnionType):
            ann = next((a for a in get_args(ann) if a is not type(None)), None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        current = ann
    return current


def _format_errors(
    path: Path,
    exc: ValidationError,
    model: type[BaseModel],
    env_keys: Mapping[tuple[str, ...], str] | None = None,
) -> str:
    """One line per problem: key path, what is wrong, what is allowed, and where the value came from."""
    lines = [f"{path}: invalid configuration"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        value = err.get("input")
        shown = "<hidden>" if any(h in where.lower() for h in _SECRET_HINTS) else repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        if err["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            allowed = sorted(parent.model_fields) if parent else []
            msg = "unknown key"
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            if close:
                msg += f" (did you mean {close[0]!r}?)"
                if any(h in close[0] for h in _SECRET_HINTS):  # a misspelt secret is still a secret
                    shown = "<hidden>"
            if allowed:
                msg += f"; allowed keys: {', '.join(allowed)}"
        elif err["type"] == "literal_error":
            choices = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
            msg = err["msg"]
            close = (
                difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
                if isinstance(value, str)
                else []
            )
            if close:
                msg += f" (did you mean {close[0]!r}?)"
        elif err["type"] == "missing":
            msg = "required key is missing"
            shown = ""
        else:
            msg = err["msg"].removeprefix("Value error, ")
        keys = env_keys or {}
        names = tuple(str(p) for p in loc)
        # the variable that set this key, or a section the error is about (a model-wide check or
        # an unknown section): the first variable under it
        origin = next((keys[names[:n]] for n in range(len(names), 1, -1) if names[:n] in keys), None)
        if origin is None:
            origin = next((v for k, v in keys.items() if names and k[: len(names)] == names), None)
        suffix = f" (got {shown})" if shown else ""
        if origin:
            suffix += f" [from environment variable {origin}]"
        lines.append(f"  {where}: {msg}{suffix}")
    return "\n".join(lines)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file") from None
    except PermissionError:
        raise ConfigError(f"{path}: config file not readable (permission denied)") from None
    except OSError as exc:  # name too long, I/O error, ...
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8: {exc}") from None
    except ValueError as exc:  # a NUL in the file name
        raise ConfigError(f"{str(path)!r}: not a usable file name: {exc}") from None


def _validate(
    model: type[_M],
    path: Path,
    data: dict[str, Any],
    env_keys: Mapping[tuple[str, ...], str] | None = None,
    env_errors: list[str] | None = None,
) -> _M:
    """Strict validation: TOML has real types, so "100" is not accepted where a number is expected.

    JSON mode lets strict validation take strings for paths and ints for floats, nothing looser.
    ``env_errors`` (unknown variables) are reported with the file's problems, or alone.
    """
    try:
        cfg = model.model_validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as exc:
        raise ConfigError(
            "\n".join([_format_errors(path, exc, model, env_keys), *(env_errors or [])])
        ) from None
    if env_errors:
        raise ConfigError("\n".join([f"{path}: invalid configuration", *env_errors]))
    return cfg


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p)


def _resolve_opt(base: Path, p: Path | None) -> Path | None:
    return None if p is None else _resolve(base, p)


def _scalar_kind(model: type[BaseModel], path: list[str]) -> str:
    """ "str" when the field at ``path`` takes text (str, Path, a Literal of strings), else "value"."""
    sub: Any = model
    for name in path[:-1]:
        field = sub.model_fields.get(name) if isinstance(sub, type) and issubclass(sub, BaseModel) else None
        sub = field.annotation if field else None
    if not (isinstance(sub, type) and issubclass(sub, BaseModel)) or path[-1] not in sub.model_fields:
        return "str"
    ann: Any = sub.model_fields[path[-1]].annotation
    union = get_origin(ann) in (Union, UnionType)
    args = [a for a in get_args(ann) if a is not type(None)] if union else [ann]
    # Annotated[str, ...] (Token, ConfigPath) inside an Optional is text too
    args = [get_args(a)[0] if get_origin(a) is Annotated else a for a in args]
    for a in args:
        if a in (str, Path) or (get_origin(a) is Literal and all(isinstance(v, str) for v in get_args(a))):
            return "str"
    return "value"


# MQD_* variables that are not config overrides: the CLI's (--config, --token), the systemd
# installer's, the benchmarks' and the chaos tool's. Any other MQD_ name without "__" is a mistake.
NOT_OVERRIDES = frozenset(
    {"MQD_CONFIG", "MQD_TOKEN", "MQD_BIN", "MQD_BENCH_SINK_BYTES_PER_S", "MQD_CHAOS_MOUNT_NS"}
)


def _override_names(model: type[BaseModel], prefix: str = "MQD") -> list[str]:
    """Every override variable: MQD_<SECTION>__<KEY>, and deeper for nested sections
    (MQD_CONSUMER__KAFKA__SASL_PASSWORD)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_override_names(ann, f"{prefix}_{name}_".upper()))
        elif prefix != "MQD":
            out.append(f"{prefix}_{name}".upper())
    return out


def _unknown_variable(name: str) -> str:
    """The error line for an MQD_ variable that is neither an override nor one of NOT_OVERRIDES."""
    names = _override_names(MqdConfig)
    # MQD_CONSUMER_GROUP: one underscore where the section ends
    guess = next((n for n in names if n.replace("__", "_") == name), None)
    if guess is None:
        close = difflib.get_close_matches(name, [*names, *NOT_OVERRIDES], n=1)
        guess = close[0] if close else None
    hint = f"; did you mean {guess}" if guess else ""
    return f"  {name}: unknown MQD_ environment variable (overrides are MQD_<SECTION>__<KEY>{hint})"


def _env_overrides(
    data: dict[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[tuple[str, ...], str], list[str]]:
    """Apply ``MQD_<SECTION>__<KEY>=value`` (nested sections take one more ``__`` per level:
    ``MQD_CONSUMER__KAFKA__SASL_PASSWORD``). Text fields take the value as is; numbers, booleans and
    lists take TOML syntax (``MQD_CONSUMER__TOPICS='["a", "b"]'``). Returns the data, which keys
    came from which variable (so errors can name the variable, not the file) and one error line per
    unknown MQD_ variable (a misspelt override must not be silently ignored)."""
    out = _copy_tables(data)
    origins: dict[tuple[str, ...], str] = {}
    unknown: list[str] = []
    for name, value in sorted(environ.items()):
        if not name.startswith("MQD_") or name in NOT_OVERRIDES:
            continue
        if "__" not in name:
            unknown.append(_unknown_variable(name))
            continue
        path = name[4:].lower().split("__")
        parsed: Any = value
        if _scalar_kind(MqdConfig, path) == "value":
            try:
                parsed = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError:
                pass  # left as text: validation names the variable and what it expects
        table: Any = out
        for part in path[:-1]:
            table = table.setdefault(part, {}) if isinstance(table, dict) else None
        if isinstance(table, dict):
            table[path[-1]] = parsed
            origins[tuple(path)] = name
    return out, origins, unknown


def _copy_tables(data: dict[str, Any]) -> dict[str, Any]:
    """A copy of every table (not the leaves), so overrides never change the caller's dicts."""
    return {k: (_copy_tables(v) if isinstance(v, dict) else v) for k, v in data.items()}


def load_daemon_config(path: str | Path, environ: Mapping[str, str] | None = None) -> MqdConfig:
    """Load ``mqd.toml``; relative paths in it are taken relative to the file's folder."""
    path = Path(path)
    data, origins, unknown = _env_overrides(read_toml(path), os.environ if environ is None else environ)
    cfg = _validate(MqdConfig, path, data, origins, unknown)
    base = path.resolve().parent
    return cfg.model_copy(
        update={
            "consumer": cfg.consumer.model_copy(
                update={
                    "offset_file": _resolve(base, cfg.consumer.offset_file),
                    "tls_ca_file": _resolve_opt(base, cfg.consumer.tls_ca_file),
                    "kafka": cfg.consumer.kafka.model_copy(
                        update={
                            k: _resolve_opt(base, getattr(cfg.consumer.kafka, k))
                            for k in ("tls_ca_file", "tls_cert_file", "tls_key_file")
                        }
                    ),
                }
            ),
            "landing": cfg.landing.model_copy(
                update={
                    "dir": cfg.landing.dir
                    if isinstance(cfg.landing.dir, str)
                    else _resolve(base, cfg.landing.dir)
                }
            ),
            "spark": cfg.spark.model_copy(
                update={
                    k: getattr(cfg.spark, k)
                    if isinstance(getattr(cfg.spark, k), str)
                    else _resolve(base, getattr(cfg.spark, k))
                    for k in ("output_dir", "checkpoint_dir", "quarantine_dir")
                }
            ),
            "daemon": cfg.daemon.model_copy(
                update={
                    k: _resolve(base, getattr(cfg.daemon, k)) for k in ("state_dir", "pid_file", "log_file")
                }
            ),
        }
    )


def load_cluster_config(path: str | Path) -> ClusterConfig:
    path = Path(path)
    return _validate(ClusterConfig, path, read_toml(path))


def load_broker_config(path: str | Path) -> tuple[BrokerConfig, ClusterConfig]:
    """Load a node's file and the cluster layout it points to; check the node is in the layout."""
    path = Path(path)
    cfg = _validate(BrokerConfig, path, read_toml(path))
    base = path.resolve().parent
    cfg = cfg.model_copy(
        update={
            "cluster_file": _resolve(base, cfg.cluster_file),
            "data_dir": _resolve(base, cfg.data_dir),
            "tls_cert": _resolve_opt(base, cfg.tls_cert),
            "tls_key": _resolve_opt(base, cfg.tls_key),
            "tls_ca_file": _resolve_opt(base, cfg.tls_ca_file),
            "replica_credentials": _resolve_opt(base, cfg.replica_credentials),
        }
    )
    try:
        cluster = load_cluster_config(cfg.cluster_file)
    except ConfigError as exc:  # name the file and key that point there, not only the layout file
        raise ConfigError(f"{path}: cluster_file: {exc}") from None
    if cluster.node(cfg.node_id) is None:
        raise ConfigError(f"{path}: node_id: {cfg.node_id!r} is not a node of {cfg.cluster_file}")
    return cfg, cluster


def shown(model: BaseModel) -> dict[str, Any]:
    """``model`` as JSON data for people (``mqd config check --show``): every duration and size in
    the units syntax (``"5s"``, ``"32MiB"``), which the loader reads back to the same value."""
    out: dict[str, Any] = {}
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        funcs = {getattr(m, "func", None) for m in field.metadata}
        if isinstance(value, BaseModel):
            out[name] = shown(value)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            out[name] = [shown(v) for v in value]
        elif isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
            if units.seconds_validator in funcs and float(value * 1000).is_integer():
                out[name] = units.format_duration_ms(int(value * 1000))
            elif units.millis_validator in funcs:
                out[name] = units.format_duration_ms(int(value))
            elif units.bytes_validator in funcs:
                out[name] = units.format_size(int(value))
            else:
                out[name] = value
        else:
            out[name] = model.__pydantic_serializer__.to_python(model, mode="json", include={name})[name]
    return out


ConfigKind = Literal["daemon", "broker", "cluster"]


def detect_kind(data: Mapping[str, Any]) -> ConfigKind:
    """Which kind of file this is, by its keys: a node file names its node, a layout lists groups."""
    if "node_id" in data or "cluster_file" in data:
        return "broker"
    if "groups" in data:
        return "cluster"
    return "daemon"


def check_file(path: str | Path, environ: Mapping[str, str] | None = None) -> tuple[ConfigKind, object]:
    """Validate any mqd config file; raises ConfigError, returns kind and model. (``mqd config check``
    also asks mqd.spark.table_format whether a daemon file's table format fits the tables there.)"""
    path = Path(path)
    kind = detect_kind(read_toml(path))
    if kind == "broker":
        return kind, load_broker_config(path)[0]
    if kind == "cluster":
        return kind, load_cluster_config(path)
    return kind, load_daemon_config(path, environ)
