"""The node marker: which node and cluster a data dir belongs to, and whether it was vouched for.

``<data_dir>/node.json`` holds the node id, the cluster id (from the replica credentials; None for a
node without them), a uuid of the data dir and how it came to be (``provisioned``: an operator or
``mqd broker-init`` said this empty dir is the node's; ``recovered``: a master consulted its slaves
and copied back what it was missing). A master that starts without it is on a new or replaced disk
(issue 12.2): it must not take writes on an empty log its slaves know to be wrong, so it first
consults them (:mod:`mqd.broker.master_recovery`). A marker naming another node or cluster means the
data dir is not this node's: the node refuses to start.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from mqd.config import ConfigError
from mqd.fsutil import atomic_write

MARKER_NAME = "node.json"


@dataclass(frozen=True, slots=True)
class NodeMarker:
    node_id: str
    cluster_id: str | None
    data_dir_id: str
    created_by: str  # "provisioned" | "recovered" | "single" (a group without slaves)
    created_at_ms: int


def marker_path(data_dir: Path) -> Path:
    return data_dir / MARKER_NAME


def read_marker(data_dir: Path) -> NodeMarker | None:
    """The data dir's marker, None when it has none; ConfigError when it is unreadable."""
    path = marker_path(data_dir)
    try:
        raw = json.loads(path.read_bytes())
        return NodeMarker(
            node_id=str(raw["node_id"]),
            cluster_id=None if raw.get("cluster_id") is None else str(raw["cluster_id"]),
            data_dir_id=str(raw["data_dir_id"]),
            created_by=str(raw.get("created_by", "")),
            created_at_ms=int(raw.get("created_at_ms", 0)),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: unreadable node marker ({exc}); fix or remove it") from None


def check_marker(marker: NodeMarker, data_dir: Path, node_id: str, cluster_id: str | None) -> None:
    """ConfigError when the marker says the data dir belongs to another node or cluster."""
    if marker.node_id != node_id:
        raise ConfigError(
            f"{marker_path(data_dir)}: data dir belongs to node {marker.node_id!r}, not {node_id!r}"
        )
    if cluster_id is not None and marker.cluster_id is not None and marker.cluster_id != cluster_id:
        raise ConfigError(
            f"{marker_path(data_dir)}: data dir belongs to cluster {marker.cluster_id}, the replica "
            f"credentials name cluster {cluster_id}"
        )


def write_marker(data_dir: Path, node_id: str, cluster_id: str | None, created_by: str) -> NodeMarker:
    """Write (durably) a new marker for ``node_id`` into ``data_dir``."""
    marker = NodeMarker(node_id, cluster_id, uuid.uuid4().hex, created_by, int(time.time() * 1000))
    data_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(marker_path(data_dir), json.dumps(asdict(marker), indent=1).encode() + b"\n")
    return marker
