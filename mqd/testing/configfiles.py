"""The config files of a local broker cluster and of a daemon run as a child: a tiny TOML writer
(scalars, lists of scalars, one level of tables: all mqd's config files need), the cluster file,
a node's file, the nodes' replica credentials and a daemon's ``[daemon]`` table. Used by
:class:`mqd.testing.LocalCluster`, the chaos harness and the demo.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

# -- tiny TOML writer (scalars, lists of scalars, one level of tables) ----------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str | Path):
        return json.dumps(str(v))  # JSON string escapes are valid TOML basic strings
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(data: Mapping[str, Any]) -> str:
    """Scalars, lists of scalars and one level of tables: all our config files need."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables:
        lines.append(f"\n[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None)
    return "\n".join(lines) + "\n"


def merge_settings(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``; nested tables (``storage``, ``limits``) merge one level deep."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


# -- config files ----------------------------------------------------------------------------------


class NodeSpec(Protocol):
    """What the cluster file says about a node."""

    @property
    def id(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def url(self) -> str: ...


class NodeAddress(NamedTuple):
    """A node as the cluster file names it, for callers without a :class:`NodeProcess`."""

    id: str
    group: str
    role: str
    url: str


def cluster_toml(
    groups: Iterable[str], nodes: Iterable[NodeSpec], topics: Iterable[Mapping[str, Any]]
) -> str:
    """The cluster file: every group with its nodes (in ``nodes`` order), then the topic tables."""
    node_list = list(nodes)
    lines: list[str] = []
    for g in groups:
        lines.append(f'[[groups]]\nname = "{g}"\n')
        for n in node_list:
            if n.group == g:
                lines.append(f'[[groups.nodes]]\nid = "{n.id}"\nurl = "{n.url}"\nrole = "{n.role}"\n')
    for t in topics:
        lines.append("[[topics]]\n" + to_toml(t))
    return "\n".join(lines)


def node_toml(
    node_id: str, cluster_file: Path, data_dir: Path, port: int, settings: Mapping[str, Any]
) -> str:
    """A node's config file: where it listens and keeps its data, plus BrokerConfig ``settings``."""
    return to_toml(
        {
            "node_id": node_id,
            "cluster_file": str(cluster_file),
            "data_dir": str(data_dir),
            "host": "127.0.0.1",
            "port": port,
            **settings,
        }
    )


def replica_credentials(cluster_path: Path, out_dir: Path) -> dict[str, Path]:
    """Fresh replica credentials (mode 0600) for every node of a group with slaves in the cluster
    file ``cluster_path``, written into ``out_dir``: node id -> the file its ``replica_credentials``
    names (what ``mqd broker-credentials`` does for an install)."""
    from mqd.broker.replica_auth import generate_credentials
    from mqd.config import load_cluster_config

    return generate_credentials(load_cluster_config(cluster_path), out_dir)


def fast_consumer_timings() -> dict[str, Any]:
    """The ``[consumer]`` timings of a daemon a harness runs under faults: heartbeats, rebalances,
    metadata, commits and retries on the scale of a second, so a round sees a fault and its
    recovery in seconds (the session timeout is each harness's own)."""
    return {
        "heartbeat_interval": 0.5,
        "rebalance_interval": 2.0,
        "metadata_refresh_interval": 2.0,
        "commit_interval": 1.0,
        "request_timeout": 5.0,
        "fetch_max_wait_ms": 300,
        "error_backoff_max_ms": 1000,
    }


def daemon_section(state_dir: Path, shutdown_timeout: float = 10.0) -> dict[str, Any]:
    """The ``[daemon]`` table of a daemon a tool runs as a child: its files under ``state_dir``, no
    systemd watchdog."""
    return {
        "state_dir": str(state_dir),
        "pid_file": str(state_dir / "mqd.pid"),
        "log_file": str(state_dir / "mqd.log"),
        "shutdown_timeout": shutdown_timeout,
        "watchdog": False,
    }
