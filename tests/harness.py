"""Real broker clusters for tests: config files in a tmp dir, one subprocess per node.

Every real-process test in the project uses :class:`Cluster` (through the ``cluster_factory``
fixture in conftest.py). Nodes run ``python -m mqd.cli broker --config <file>`` on free 127.0.0.1
ports; their stdout/stderr go to ``<root>/<node>.log`` (printed by the fixture when a test fails).

Layout: group ``broker-a`` has master ``broker-a-0`` and slaves ``broker-a-1``...; groups
``broker-b``, ``broker-c``... follow. Partition ``i`` of every topic lives on group ``i % groups``.

The harness is synchronous (subprocesses, urllib): calling it from an async test blocks the loop
for the time a node needs to start, which is fine in tests.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

# Fast liveness so "node down" tests take well under a second to observe.
DEFAULT_NODE_SETTINGS: dict[str, Any] = {
    "liveness_interval_ms": 100,
    "liveness_timeout_ms": 600,
    "replica_wait_ms": 500,
    "log_level": "info",
    "log_format": "json",
}


def free_port() -> int:
    """A port the kernel considers free right now (bind to port 0, then release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll ``condition`` until it returns a truthy value; raise TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


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


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


class NodeProcess:
    """One node: its config file, data dir, log file and (while running) its process."""

    def __init__(self, node_id: str, group: str, role: str, port: int, root: Path, scheme: str) -> None:
        self.id = node_id
        self.group = group
        self.role = role
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.config_path = root / f"{node_id}.toml"
        self.data_dir = root / "data" / node_id
        self.log_path = root / f"{node_id}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    """A broker cluster of real processes. Use as a context manager or call stop() in a finalizer.

    ``topics``: ``{"events": 8}``. ``groups``: number of broker groups. ``slaves``: slaves per group.
    ``node_settings``: BrokerConfig keys for every node (nested dicts for ``storage``/``limits``),
    ``overrides``: per node id. ``cluster_topics``: raw topic tables (to pin topics to groups).
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
        if not 1 <= groups <= 26:
            raise ValueError("groups must be in 1..26")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.topics = dict(topics if topics is not None else {"events": 4})
        self.group_names = [f"broker-{string.ascii_lowercase[i]}" for i in range(groups)]
        self.tls = tls
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        scheme = "https" if tls else "http"
        self.nodes: dict[str, NodeProcess] = {}
        for g in self.group_names:
            for i in range(slaves + 1):
                node_id = f"{g}-{i}"
                role = "master" if i == 0 else "slave"
                self.nodes[node_id] = NodeProcess(node_id, g, role, free_port(), self.root, scheme)
        self.node_settings = _merge(DEFAULT_NODE_SETTINGS, node_settings or {})
        self.overrides = {k: dict(v) for k, v in (overrides or {}).items()}
        unknown = set(self.overrides) - set(self.nodes)
        if unknown:
            raise ValueError(f"overrides for unknown nodes: {sorted(unknown)}")
        self.cluster_path = self.root / "cluster.toml"
        self._write_configs(cluster_topics)

    # -- config ------------------------------------------------------------------------------------

    def _write_configs(self, cluster_topics: list[dict[str, Any]] | None) -> None:
        lines: list[str] = []
        for g in self.group_names:
            lines.append(f'[[groups]]\nname = "{g}"\n')
            for n in self.nodes.values():
                if n.group == g:
                    lines.append(f'[[groups.nodes]]\nid = "{n.id}"\nurl = "{n.url}"\nrole = "{n.role}"\n')
        topic_tables = cluster_topics or [{"name": t, "partitions": p} for t, p in self.topics.items()]
        for t in topic_tables:
            lines.append("[[topics]]\n" + to_toml(t))
        self.cluster_path.write_text("\n".join(lines))
        for n in self.nodes.values():
            settings = _merge(self.node_settings, self.overrides.get(n.id, {}))
            if self.tls:
                settings = {**settings, "tls_cert": str(self.tls[0]), "tls_key": str(self.tls[1])}
            body = {
                "node_id": n.id,
                "cluster_file": str(self.cluster_path),
                "data_dir": str(n.data_dir),
                "host": "127.0.0.1",
                "port": n.port,
                **settings,
            }
            n.config_path.write_text(to_toml(body))

    # -- queries -----------------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[str]:
        return list(self.nodes)

    @property
    def urls(self) -> dict[str, str]:
        return {n.id: n.url for n in self.nodes.values()}

    @property
    def bootstrap(self) -> str:
        return next(iter(self.nodes.values())).url

    def url(self, node_id: str) -> str:
        return self.nodes[node_id].url

    def master(self, group: int | str = 0) -> str:
        name = self.group_names[group] if isinstance(group, int) else group
        return next(n.id for n in self.nodes.values() if n.group == name and n.role == "master")

    def slaves(self, group: int | str = 0) -> list[str]:
        name = self.group_names[group] if isinstance(group, int) else group
        return [n.id for n in self.nodes.values() if n.group == name and n.role == "slave"]

    def group_of(self, partition: int) -> str:
        """Group of partition ``partition`` of a topic spread over every group (the default)."""
        return self.group_names[partition % len(self.group_names)]

    def log(self, node_id: str) -> str:
        p = self.nodes[node_id].log_path
        return p.read_text(errors="replace") if p.exists() else ""

    def dump_logs(self, tail: int = 60) -> str:
        out = []
        for n in self.nodes.values():
            lines = self.log(n.id).splitlines()[-tail:]
            out.append(f"----- {n.id} ({n.log_path}) -----\n" + "\n".join(lines))
        return "\n".join(out)

    def health(self, node_id: str, timeout: float = 1.0) -> dict[str, Any] | None:
        """The node's /v1/health answer, or None when it does not answer."""
        return self.get_json(node_id, "/v1/health", timeout)

    def get_json(self, node_id: str, path: str, timeout: float = 2.0) -> dict[str, Any] | None:
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(self.url(node_id) + path)
        token = self.node_settings.get("auth_token")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                data = json.loads(resp.read())
                return data if isinstance(data, dict) else None
        except (urllib.error.URLError, OSError, ValueError):
            return None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> Cluster:
        for node_id in self.nodes:
            self.start_node(node_id, wait=False)
        for node_id in self.nodes:
            self.wait_healthy(node_id, timeout)
        return self

    def start_node(self, node_id: str, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        n = self.nodes[node_id]
        if n.running:
            raise RuntimeError(f"{node_id} is already running")
        with open(n.log_path, "ab") as log:
            log.write(f"===== start {node_id} at {time.time():.3f} =====\n".encode())
            log.flush()
            n.proc = subprocess.Popen(
                [sys.executable, "-m", "mqd.cli", "broker", "--config", str(n.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.root,
                env=self.env,
            )
        if wait:
            self.wait_healthy(node_id, timeout)

    def wait_healthy(self, node_id: str, timeout: float = START_TIMEOUT) -> None:
        n = self.nodes[node_id]
        deadline = time.monotonic() + timeout
        while self.health(node_id, timeout=0.5) is None:
            if n.proc is not None and n.proc.poll() is not None:
                raise RuntimeError(
                    f"{node_id} exited with {n.proc.returncode} while starting:\n{self.log(node_id)[-4000:]}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{node_id} not healthy after {timeout}s:\n{self.log(node_id)[-4000:]}")
            time.sleep(0.05)

    def kill(self, node_id: str, sig: int = signal.SIGKILL, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``sig`` and wait (bounded) for the process to exit; returns its exit code."""
        n = self.nodes[node_id]
        if n.proc is None:
            return None
        if n.proc.poll() is None:
            n.proc.send_signal(sig)
            if sig != signal.SIGKILL:
                n.proc.send_signal(signal.SIGCONT)  # a frozen (SIGSTOP) node must wake to act on it
            try:
                n.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(timeout)
        code = n.proc.returncode
        n.proc = None
        return code

    def send_signal(self, node_id: str, sig: int) -> None:
        """Send ``sig`` without waiting (SIGSTOP/SIGCONT to freeze a node)."""
        n = self.nodes[node_id]
        if n.proc is None or n.proc.poll() is not None:
            raise RuntimeError(f"{node_id} is not running")
        n.proc.send_signal(sig)

    def stop_node(self, node_id: str, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        return self.kill(node_id, signal.SIGTERM, timeout)

    def restart(self, node_id: str, *, sig: int = signal.SIGTERM, timeout: float = START_TIMEOUT) -> None:
        self.kill(node_id, sig)
        self.start_node(node_id, wait=True, timeout=timeout)

    def stop(self) -> None:
        """Stop every node (SIGTERM to all, then SIGKILL whatever is left after a deadline)."""
        running = [n for n in self.nodes.values() if n.running]
        for n in running:
            assert n.proc is not None
            n.proc.send_signal(signal.SIGCONT)  # a frozen node could not act on SIGTERM
            n.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for n in running:
            assert n.proc is not None
            try:
                n.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(STOP_TIMEOUT)
            n.proc = None

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- record helpers for tests ----------------------------------------------------------------------


def records_of(data: bytes | memoryview, start_offset: int | None = None) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of every record in whole batches ``data`` (CRC-checked), from ``start_offset``."""
    from mqd import format as fmt

    buf = bytes(data)
    out: list[tuple[int, bytes]] = []
    for info in fmt.scan(buf, crc=True):
        rb = fmt.to_arrow(buf, info, start_offset)
        out.extend(zip(rb.column("offset").to_pylist(), rb.column("value").to_pylist(), strict=True))
    return out
