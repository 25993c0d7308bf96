"""Typed, frozen configuration for broker nodes and the daemon, loaded from TOML.

Every model rejects unknown keys; a bad file raises ConfigError naming the file, the key path and
what is allowed. ``MQD_<SECTION>__<KEY>`` environment variables override daemon keys (containers,
secrets): ``MQD_CONSUMER__GROUP=g`` sets ``consumer.group``.
"""

from __future__ import annotations

import os
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MiB = 1024 * 1024


class ConfigError(Exception):
    """A config file is missing, unreadable or invalid. Not retriable: fix the file."""

    retriable = False


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


# ---------------------------------------------------------------------------------------------
# broker cluster


class NodeSpec(_Model):
    id: str = Field(min_length=1)
    url: str = Field(pattern=r"^https?://")
    role: Literal["master", "slave"]


class GroupSpec(_Model):
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
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    partitions: int = Field(ge=1, le=4096)
    # partition i lives on groups[i % len(groups)]; empty means every group, in cluster order
    groups: list[str] = Field(default_factory=list)


class ClusterConfig(_Model):
    groups: list[GroupSpec] = Field(min_length=1)
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

    def group_of(self, topic: str, partition: int) -> GroupSpec | None:
        t = next((t for t in self.topics if t.name == topic), None)
        if t is None or not 0 <= partition < t.partitions:
            return None
        names = t.groups or [g.name for g in self.groups]
        name = names[partition % len(names)]
        return next(g for g in self.groups if g.name == name)

    def node(self, node_id: str) -> tuple[GroupSpec, NodeSpec] | None:
        for g in self.groups:
            for n in g.nodes:
                if n.id == node_id:
                    return g, n
        return None


class StorageConfig(_Model):
    segment_bytes: int = Field(default=256 * MiB, ge=4096)
    retention_bytes: int = Field(default=-1, ge=-1)  # per partition; -1 keeps everything
    retention_ms: int = Field(default=-1, ge=-1)  # by newest timestamp of a segment; -1 keeps
    fsync: Literal["always", "interval", "never"] = "interval"
    fsync_interval_ms: int = Field(default=1000, ge=1)
    retention_check_interval_ms: int = Field(default=60_000, ge=100)


class BrokerLimits(_Model):
    max_request_bytes: int = Field(default=64 * MiB, ge=1024)
    max_fetch_bytes: int = Field(default=64 * MiB, ge=1024)
    max_wait_ms: int = Field(default=30_000, ge=0)
    max_partitions_per_fetch: int = Field(default=10_000, ge=1)


class BrokerConfig(_Model):
    """One node: which node of the cluster it is, where its data lives, how it behaves."""

    node_id: str
    cluster_file: Path  # relative to the node's config file
    data_dir: Path
    host: str = "127.0.0.1"
    port: int | None = None  # default: the port of the node's url
    offset_check_in_slave: bool = False
    slave_suggest_lag_bytes: int = Field(default=64 * MiB, ge=0)  # RocketMQ's "40% of RAM"
    session_timeout_ms: int = Field(default=10_000, ge=100)
    liveness_interval_ms: int = Field(default=1000, ge=50)
    liveness_timeout_ms: int = Field(default=3000, ge=100)
    replica_wait_ms: int = Field(default=1000, ge=0)  # replica long-poll
    acks_all_timeout_ms: int = Field(default=10_000, ge=1)
    auth_token: str | None = Field(default=None, repr=False)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    storage: StorageConfig = StorageConfig()
    limits: BrokerLimits = BrokerLimits()


# ---------------------------------------------------------------------------------------------
# daemon


class ConsumerConfig(_Model):
    group: str = Field(default="mqd", min_length=1)
    client_id: str = ""  # default: hostname-pid
    bootstrap: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9400"], min_length=1)
    topics: list[str] = Field(default_factory=lambda: ["events"], min_length=1)
    mode: Literal["cluster", "broadcast"] = "cluster"
    consume_from: Literal["last", "first", "timestamp"] = "last"
    consume_timestamp_ms: int | None = None  # for consume_from = "timestamp"
    allocation: str = "averagely"
    on_offset_reset: Literal["broker", "earliest", "latest", "fail"] = "broker"
    rebalance_interval: float = Field(default=20.0, gt=0)
    heartbeat_interval: float = Field(default=3.0, gt=0)
    session_timeout: float = Field(default=10.0, gt=0)
    metadata_refresh_interval: float = Field(default=30.0, gt=0)
    commit_interval: float = Field(default=5.0, gt=0)
    max_queued_records: int = Field(default=1000, ge=1)
    max_queued_bytes: int = Field(default=100 * MiB, ge=1)
    max_offset_span: int = Field(default=2000, ge=1)
    flow_control_retry_ms: int = Field(default=50, ge=1)
    max_buffered_bytes: int = Field(default=256 * MiB, ge=1)  # daemon-wide budget
    fetch_max_wait_ms: int = Field(default=500, ge=0)
    fetch_min_bytes: int = Field(default=1, ge=0)
    fetch_max_bytes: int = Field(default=32 * MiB, ge=1)
    partition_max_bytes: int = Field(default=4 * MiB, ge=1)
    request_timeout: float = Field(default=30.0, gt=0)
    error_backoff_ms: int = Field(default=100, ge=1)
    error_backoff_max_ms: int = Field(default=5000, ge=1)
    check_crc: bool = True
    offset_file: Path = Path("state/offsets.json")  # broadcast mode
    auth_token: str | None = Field(default=None, repr=False)

    @model_validator(mode="after")
    def _timestamp_needs_time(self) -> Self:
        if self.consume_from == "timestamp" and self.consume_timestamp_ms is None:
            raise ValueError('consume_from = "timestamp" needs consume_timestamp_ms')
        return self

    @property
    def effective_client_id(self) -> str:
        return self.client_id or f"{socket.gethostname()}-{os.getpid()}"


class LandingConfig(_Model):
    dir: Path = Path("landing")
    max_records: int = Field(default=500_000, ge=1)
    max_bytes: int = Field(default=128 * MiB, ge=1)
    max_age: float = Field(default=5.0, gt=0)
    compression: Literal["snappy", "zstd", "gzip", "lz4", "none"] = "snappy"
    disk_retry_interval: float = Field(default=1.0, gt=0)


class SparkConfig(_Model):
    master: str = "local[*]"
    app_name: str = "mqd-landing"
    output_dir: Path = Path("warehouse/events")
    checkpoint_dir: Path = Path("warehouse/_checkpoints/events")
    quarantine_dir: Path = Path("warehouse/_quarantine/events")
    max_files_per_trigger: int = Field(default=1000, ge=1)
    trigger_interval: str = "10 seconds"
    partition_by: list[str] = Field(default_factory=lambda: ["topic", "dt"])
    value_format: Literal["raw", "json"] = "raw"
    value_schema: str = ""  # Spark DDL, for value_format = "json"
    shuffle_partitions: int = Field(default=4, ge=1)
    driver_memory: str = "1g"

    @model_validator(mode="after")
    def _json_needs_schema(self) -> Self:
        if self.value_format == "json" and not self.value_schema.strip():
            raise ValueError('value_format = "json" needs value_schema (a Spark DDL string)')
        return self


class AdminConfig(_Model):
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=9480, ge=0, le=65535)


class LogConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


class DaemonSection(_Model):
    state_dir: Path = Path("state")
    pid_file: Path = Path("state/mqd.pid")
    log_file: Path = Path("state/mqd.log")
    shutdown_timeout: float = Field(default=30.0, gt=0)
    watchdog: bool = True


class MqdConfig(_Model):
    """The daemon's whole config file."""

    consumer: ConsumerConfig = ConsumerConfig()
    landing: LandingConfig = LandingConfig()
    spark: SparkConfig = SparkConfig()
    admin: AdminConfig = AdminConfig()
    log: LogConfig = LogConfig()
    daemon: DaemonSection = DaemonSection()


# ---------------------------------------------------------------------------------------------
# loading


def _format_errors(path: Path, exc: ValidationError) -> str:
    lines = [f"{path}: invalid configuration"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "literal_error":
            msg = f"{msg}"
        lines.append(f"  {loc}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except PermissionError:
        raise ConfigError(f"{path}: config file not readable (permission denied)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p)


def _env_overrides(data: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for name, value in environ.items():
        if not name.startswith("MQD_") or "__" not in name:
            continue
        section, _, key = name[4:].lower().partition("__")
        parsed: Any = value
        try:  # TOML scalar or array syntax, so numbers, booleans and lists work too
            parsed = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            pass
        out.setdefault(section, {})
        if isinstance(out[section], dict):
            out[section][key] = parsed
    return out


def load_daemon_config(path: str | Path, environ: dict[str, str] | None = None) -> MqdConfig:
    """Load ``mqd.toml``; relative paths in it are taken relative to the file's folder."""
    path = Path(path)
    data = _env_overrides(read_toml(path), dict(os.environ if environ is None else environ))
    try:
        cfg = MqdConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(path, exc)) from None
    base = path.resolve().parent
    return cfg.model_copy(
        update={
            "consumer": cfg.consumer.model_copy(
                update={"offset_file": _resolve(base, cfg.consumer.offset_file)}
            ),
            "landing": cfg.landing.model_copy(update={"dir": _resolve(base, cfg.landing.dir)}),
            "spark": cfg.spark.model_copy(
                update={
                    k: _resolve(base, getattr(cfg.spark, k))
                    for k in ("output_dir", "checkpoint_dir", "quarantine_dir")
                }
            ),
            "daemon": cfg.daemon.model_copy(
                update={
                    k: _resolve(base, getattr(cfg.daemon, k))
                    for k in ("state_dir", "pid_file", "log_file")
                }
            ),
        }
    )


def load_cluster_config(path: str | Path) -> ClusterConfig:
    path = Path(path)
    try:
        return ClusterConfig.model_validate(read_toml(path))
    except ValidationError as exc:
        raise ConfigError(_format_errors(path, exc)) from None


def load_broker_config(path: str | Path) -> tuple[BrokerConfig, ClusterConfig]:
    """Load a node's file and the cluster layout it points to; check the node is in the layout."""
    path = Path(path)
    try:
        cfg = BrokerConfig.model_validate(read_toml(path))
    except ValidationError as exc:
        raise ConfigError(_format_errors(path, exc)) from None
    base = path.resolve().parent
    cfg = cfg.model_copy(
        update={
            "cluster_file": _resolve(base, cfg.cluster_file),
            "data_dir": _resolve(base, cfg.data_dir),
        }
    )
    cluster = load_cluster_config(cfg.cluster_file)
    if cluster.node(cfg.node_id) is None:
        raise ConfigError(f"{path}: node_id: {cfg.node_id!r} is not a node of {cfg.cluster_file}")
    return cfg, cluster
