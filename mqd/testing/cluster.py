"""LocalCluster: a broker cluster of real ``mqd broker`` processes on 127.0.0.1, for tests.

Config files go to one directory (``root``); each node runs ``python -m mqd.operator.cli broker --config
<file>`` on a free 127.0.0.1 port with its stdout/stderr in ``<root>/<node>.log``.

Layout: group ``broker-a`` has master ``broker-a-0`` and slaves ``broker-a-1``...; groups
``broker-b``, ``broker-c``... follow. Partition ``i`` of every topic lives on group ``i % groups``.

Like an install, the cluster gets fresh replica credentials (``<root>/credentials``, one 0600 file
per node of a group with slaves) and every data dir is provisioned with its node marker, so a test
that deletes a master's data dir sees what a replaced disk does.

Everything here is synchronous (subprocesses, urllib): an async caller blocks its loop for the time a
node needs to start, which is fine in a test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import ssl
import string
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mqd.broker.node_marker import write_marker
from mqd.broker.replica_auth import ReplicaAuth, load_credentials, peers_of
from mqd.config import NodeSpec, load_cluster_config
from mqd.testing.configfiles import cluster_toml, merge_settings, node_toml, replica_credentials
from mqd.testing.process import START_TIMEOUT, STOP_TIMEOUT, ManagedProcess
from mqd.waiting import wait_until_sync

# Fast liveness so "node down" is observed well under a second after it happens.
DEFAULT_NODE_SETTINGS: dict[str, Any] = {
    "liveness_interval_ms": 100,
    "liveness_timeout_ms": 600,
    "replica_wait_ms": 500,
    "log_level": "info",
    "log_format": "json",
}


# ports free_port handed out in this process: the kernel offers a port again once the probe socket
# is closed (134 repeats in 2,000 calls), and two nodes of one cluster then race for it: the loser
# exits "address already in use" (a CI run failed so)
_HANDED_OUT: set[int] = set()
_PICK = random.Random(int.from_bytes(os.urandom(8), "big"))  # not the global one tests may seed


def _listen_ports() -> range:
    """Ports below the kernel's ephemeral range: a port taken from that range (bind to 0) is free
    when probed, but any outgoing connection may take it as its source port before the server
    binds it (a CI run failed so, a broker exiting "address already in use")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - 16384), max(2048, low))


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if it can be bound on 127.0.0.1, else a free port below the kernel's ephemeral
    range (_listen_ports) that this process was not given before."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if preferred is not None:
            try:
                s.bind(("127.0.0.1", preferred))
                _HANDED_OUT.add(preferred)
                return preferred
            except OSError:
                pass
    ports = _listen_ports()
    if len(_HANDED_OUT) > len(ports) // 2:
        _HANDED_OUT.clear()  # long ago: their servers have bound them or are gone
    for _ in range(1000):
        port = _PICK.choice(ports)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise OSError(f"no free port on 127.0.0.1 in {ports.start}-{ports.stop - 1}")


def get_json(
    url: str, timeout: float = 2.0, *, context: ssl.SSLContext | None = None, token: str | None = None
) -> dict[str, Any] | None:
    """The JSON object at ``url``, or None when there is no answer or it is not a JSON object."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            data = json.loads(resp.read())
            return data if isinstance(data, dict) else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def broker_argv(config_path: Path) -> list[str]:
    """The command that runs one broker node on ``config_path``."""
    return [sys.executable, "-m", "mqd.operator.cli", "broker", "--config", str(config_path)]


def group_names(groups: int) -> list[str]:
    """``broker-a``, ``broker-b``, ... for ``groups`` groups (1..26)."""
    if not 1 <= groups <= 26:
        raise ValueError("groups must be in 1..26")
    return [f"broker-{string.ascii_lowercase[i]}" for i in range(groups)]


class NodeProcess(ManagedProcess):
    """One broker node: its config file, data dir, log file and (while running) its process."""

    def __init__(
        self,
        node_id: str,
        group: str,
        role: str,
        port: int,
        root: Path,
        scheme: str,
        *,
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.id = node_id
        self.group = group
        self.role = role
        self.port = port
        self.scheme = scheme
        self.config_path = root / f"{node_id}.toml"
        self.data_dir = root / "data" / node_id
        super().__init__(
            node_id,
            broker_argv(self.config_path),
            root / f"{node_id}.log",
            cwd=root,
            env=env,
            die_with_parent=die_with_parent,
        )

    @property
    def url(self) -> str:
        """Where the node serves its HTTP API: ``<scheme>://127.0.0.1:<port>``."""
        return f"{self.scheme}://127.0.0.1:{self.port}"


class LocalCluster:
    """A broker cluster of real processes on 127.0.0.1. Use it as a context manager (``with
    LocalCluster(tmp) as cluster:`` starts every node and stops them on exit) or call :meth:`start`
    and, in a finalizer, :meth:`stop`.

    The constructor picks the ports and writes every config file under ``root``; nothing runs yet.

    - ``topics``: topic name -> partition count, spread over every group (default ``{"events": 4}``).
    - ``groups``: number of broker groups (1..26); ``slaves``: slaves per group (0: masters only).
    - ``node_settings``: BrokerConfig keys for every node, over :data:`DEFAULT_NODE_SETTINGS`
      (nested dicts merge one level deep into ``storage``/``limits``).
    - ``overrides``: node id -> BrokerConfig keys for that node only.
    - ``cluster_topics``: raw ``[[topics]]`` tables instead of ``topics`` (to pin topics to groups).
    - ``tls``: ``(cert, key)`` files: every node serves HTTPS with them.
    - ``env``: extra environment variables of the node processes.

    Node ids are ``broker-a-0`` (master of group ``broker-a``), ``broker-a-1`` (its first slave),
    ``broker-b-0``...; :meth:`master`, :meth:`slaves` and :meth:`url` find them.
    """

    def __init__(
        self,
        root: Path,
        *,
        topics: Mapping[str, int] | None = None,
        groups: int = 1,
        slaves: int = 0,
        node_settings: Mapping[str, Any] | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        cluster_topics: list[dict[str, Any]] | None = None,
        tls: tuple[Path, Path] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.group_names = group_names(groups)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.topics = dict(topics if topics is not None else {"events": 4})
        self.tls = tls
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        scheme = "https" if tls else "http"
        self.nodes: dict[str, NodeProcess] = {}
        for g in self.group_names:
            for i in range(slaves + 1):
                node_id = f"{g}-{i}"
                role = "master" if i == 0 else "slave"
                self.nodes[node_id] = NodeProcess(
                    node_id, g, role, free_port(), self.root, scheme, env=self.env
                )
        self.node_settings = merge_settings(DEFAULT_NODE_SETTINGS, node_settings or {})
        self.overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        unknown = set(self.overrides) - set(self.nodes)
        if unknown:
            raise ValueError(f"overrides for unknown nodes: {sorted(unknown)}")
        self.cluster_path = self.root / "cluster.toml"
        self._write_configs(cluster_topics)

    # -- config ------------------------------------------------------------------------------------

    def _write_configs(self, cluster_topics: list[dict[str, Any]] | None) -> None:
        topic_tables = cluster_topics or [{"name": t, "partitions": p} for t, p in self.topics.items()]
        self.cluster_path.write_text(cluster_toml(self.group_names, self.nodes.values(), topic_tables))
        self.credentials = replica_credentials(self.cluster_path, self.root / "credentials")
        for n in self.nodes.values():
            creds = self.credentials.get(n.id)
            cluster_id = None
            if creds is not None:
                cluster_id = load_credentials(creds, n.id, []).cluster_id
            if not (n.data_dir / "node.json").exists():
                write_marker(n.data_dir, n.id, cluster_id, "provisioned")
            settings = merge_settings(self.node_settings, self.overrides.get(n.id, {}))
            if creds is not None:
                settings = {"replica_credentials": str(creds), **settings}
            if self.tls:
                settings = {**settings, "tls_cert": str(self.tls[0]), "tls_key": str(self.tls[1])}
            n.config_path.write_text(node_toml(n.id, self.cluster_path, n.data_dir, n.port, settings))

    # -- queries -----------------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[str]:
        """Every node id, masters and slaves, group by group."""
        return list(self.nodes)

    @property
    def urls(self) -> dict[str, str]:
        """Node id -> base URL (``http://127.0.0.1:<port>``)."""
        return {n.id: n.url for n in self.nodes.values()}

    @property
    def bootstrap(self) -> str:
        """One node's URL: what a client or daemon config needs as ``bootstrap``."""
        return next(iter(self.nodes.values())).url

    def url(self, node_id: str) -> str:
        """The base URL of ``node_id``."""
        return self.nodes[node_id].url

    def master(self, group: int | str = 0) -> str:
        """The master's node id of ``group`` (an index or a name such as ``broker-b``)."""
        name = self.group_names[group] if isinstance(group, int) else group
        return next(n.id for n in self.nodes.values() if n.group == name and n.role == "master")

    def slaves(self, group: int | str = 0) -> list[str]:
        """The slaves' node ids of ``group`` (an index or a name)."""
        name = self.group_names[group] if isinstance(group, int) else group
        return [n.id for n in self.nodes.values() if n.group == name and n.role == "slave"]

    def broker_group_of(self, partition: int) -> str:
        """Group of partition ``partition`` of a topic spread over every group (the default)."""
        return self.group_names[partition % len(self.group_names)]

    def replica_auth(self, node_id: str) -> ReplicaAuth:
        """A :class:`mqd.broker.replica_auth.ReplicaAuth` that signs as ``node_id`` (from its
        credentials file): build a ``ReplicaClient`` on it to make replica calls as that node."""
        found = load_cluster_config(self.cluster_path).node(node_id)
        if found is None or node_id not in self.credentials:
            raise ValueError(f"{node_id} has no replica credentials (not in a group with slaves)")
        peers = peers_of(found[0], node_id)
        return ReplicaAuth(load_credentials(self.credentials[node_id], node_id, peers), peers)

    def node_spec(self, node_id: str) -> NodeSpec:
        """``node_id`` as the cluster file names it."""
        found = load_cluster_config(self.cluster_path).node(node_id)
        if found is None:
            raise ValueError(f"no node {node_id}")
        return found[1]

    def log(self, node_id: str) -> str:
        """Everything ``node_id`` wrote to its log file so far."""
        p = self.nodes[node_id].log_path
        return p.read_text(errors="replace") if p.exists() else ""

    def dump_logs(self, tail: int = 60) -> str:
        """The last ``tail`` lines of every node's log, for a failing test's output."""
        out = []
        for n in self.nodes.values():
            lines = self.log(n.id).splitlines()[-tail:]
            out.append(f"----- {n.id} ({n.log_path}) -----\n" + "\n".join(lines))
        return "\n".join(out)

    def health(self, node_id: str, timeout: float = 1.0) -> dict[str, Any] | None:
        """The node's /v1/health answer, or None when it does not answer."""
        return self.get_json(node_id, "/v1/health", timeout)

    def get_json(self, node_id: str, path: str, timeout: float = 2.0) -> dict[str, Any] | None:
        """GET ``path`` (e.g. ``/v1/stats``) of ``node_id`` as a JSON object; None when it does not
        answer. Speaks TLS and sends the auth token when the cluster uses them."""
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        token = self.node_settings.get("auth_token")
        return get_json(self.url(node_id) + path, timeout, context=ctx, token=token)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> LocalCluster:
        """Start every node and wait until each answers ``/v1/health`` and every slave replicates
        from its master (a master consults its slaves before it listens, so a slave started with
        it may be backing off for a moment); returns the cluster."""
        for node_id in self.nodes:
            self.start_node(node_id, wait=False)
        for node_id in self.nodes:
            self.wait_healthy(node_id, timeout)
        for node_id in self.nodes:
            if self.nodes[node_id].role == "slave":
                self.wait_replicating(node_id, timeout)
        return self

    def wait_replicating(self, node_id: str, timeout: float = START_TIMEOUT) -> None:
        """Until slave ``node_id`` reports its master reachable (``/v1/stats`` replication)."""

        def replicating() -> bool:
            stats = self.get_json(node_id, "/v1/stats", timeout=0.5) or {}
            return bool(stats.get("replication", {}).get("master_reachable"))

        wait_until_sync(replicating, timeout, f"{node_id} to replicate from its master", interval=0.05)

    def start_node(self, node_id: str, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Start one node (again); with ``wait``, until it is healthy. ProcessError if it runs."""
        self.nodes[node_id].start()
        if wait:
            self.wait_healthy(node_id, timeout)

    def wait_healthy(self, node_id: str, timeout: float = START_TIMEOUT) -> None:
        """Until ``node_id`` answers ``/v1/health``: ProcessError if it exits first, TimeoutError
        after ``timeout``; both carry the end of its log."""
        self.nodes[node_id].wait_ready(lambda: self.health(node_id, timeout=0.5) is not None, timeout)

    def kill(self, node_id: str, sig: int = signal.SIGKILL, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``sig`` and wait (bounded; SIGKILL after ``timeout``) for the exit; its exit code."""
        return self.nodes[node_id].stop(sig, timeout)

    def send_signal(self, node_id: str, sig: int) -> None:
        """Send ``sig`` without waiting (SIGSTOP/SIGCONT to freeze a node). ProcessError when the node
        is not running."""
        self.nodes[node_id].send_signal(sig)

    def stop_node(self, node_id: str, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        return self.kill(node_id, signal.SIGTERM, timeout)

    def restart(self, node_id: str, *, sig: int = signal.SIGTERM, timeout: float = START_TIMEOUT) -> None:
        """Stop ``node_id`` with ``sig`` and start it again on the same port and data dir."""
        self.kill(node_id, sig)
        self.start_node(node_id, wait=True, timeout=timeout)

    def stop(self) -> None:
        """Stop every node: SIGTERM to all at once, then SIGKILL whatever is left after one shared
        deadline. Idempotent."""
        stopping = [n for n in self.nodes.values() if n.begin_stop(signal.SIGTERM)]
        deadline = time.monotonic() + STOP_TIMEOUT
        for n in stopping:
            try:
                n.wait(max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                n.stop(signal.SIGKILL, STOP_TIMEOUT)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
