"""A broker cluster of real local processes: config files in one directory, one subprocess per node.

Used by the tests (tests/harness.py re-exports it), the benchmarks, the chaos runner and ``mqd demo``.
Nodes run ``python -m mqd.cli broker --config <file>`` on free 127.0.0.1 ports; their stdout/stderr
go to ``<root>/<node>.log``.

Layout: group ``broker-a`` has master ``broker-a-0`` and slaves ``broker-a-1``...; groups
``broker-b``, ``broker-c``... follow. Partition ``i`` of every topic lives on group ``i % groups``.

Everything here is synchronous (subprocesses, urllib): an async caller blocks its loop for the time a
node needs to start.
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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, Protocol

START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

# Fast liveness so "node down" is observed well under a second after it happens.
DEFAULT_NODE_SETTINGS: dict[str, Any] = {
    "liveness_interval_ms": 100,
    "liveness_timeout_ms": 600,
    "replica_wait_ms": 500,
    "log_level": "info",
    "log_format": "json",
}


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if it can be bound on 127.0.0.1, else a port the kernel considers free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if preferred is not None:
            try:
                s.bind(("127.0.0.1", preferred))
                return preferred
            except OSError:
                pass
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


# -- processes -------------------------------------------------------------------------------------


def spawn_logged(
    argv: list[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    banner: str | None = None,
    preexec_fn: Callable[[], Any] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log_path`` (after ``banner``, if given)."""
    with open(log_path, "ab") as log:
        if banner is not None:
            log.write(f"===== {banner} at {time.time():.3f} =====\n".encode())
            log.flush()
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            preexec_fn=preexec_fn,
        )


def broker_argv(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "mqd.cli", "broker", "--config", str(config_path)]


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT
) -> int | None:
    """Send ``sig`` (and SIGCONT, so a frozen process can act on it); SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        if sig != signal.SIGKILL:
            proc.send_signal(signal.SIGCONT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


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


def wait_started(
    proc: subprocess.Popen[bytes] | None,
    ready: Callable[[], Any],
    *,
    name: str,
    timeout: float = START_TIMEOUT,
    log_path: Path | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``ready`` until it is truthy. RuntimeError if ``proc`` exits first, TimeoutError after
    ``timeout``; both carry the tail of ``log_path``."""

    def tail() -> str:
        if log_path is None or not log_path.exists():
            return ""
        return log_path.read_text(errors="replace")[-4000:]

    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} while starting:\n{tail()}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{name} not healthy after {timeout}s:\n{tail()}")
        time.sleep(interval)


# -- the cluster -----------------------------------------------------------------------------------


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


def group_names(groups: int) -> list[str]:
    """``broker-a``, ``broker-b``, ... for ``groups`` groups (1..26)."""
    if not 1 <= groups <= 26:
        raise ValueError("groups must be in 1..26")
    return [f"broker-{string.ascii_lowercase[i]}" for i in range(groups)]


class LocalCluster:
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
                self.nodes[node_id] = NodeProcess(node_id, g, role, free_port(), self.root, scheme)
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
        for n in self.nodes.values():
            settings = merge_settings(self.node_settings, self.overrides.get(n.id, {}))
            if self.tls:
                settings = {**settings, "tls_cert": str(self.tls[0]), "tls_key": str(self.tls[1])}
            n.config_path.write_text(node_toml(n.id, self.cluster_path, n.data_dir, n.port, settings))

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
        token = self.node_settings.get("auth_token")
        return get_json(self.url(node_id) + path, timeout, context=ctx, token=token)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> LocalCluster:
        for node_id in self.nodes:
            self.start_node(node_id, wait=False)
        for node_id in self.nodes:
            self.wait_healthy(node_id, timeout)
        return self

    def start_node(self, node_id: str, *, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        n = self.nodes[node_id]
        if n.running:
            raise RuntimeError(f"{node_id} is already running")
        n.proc = spawn_logged(
            broker_argv(n.config_path), n.log_path, cwd=self.root, env=self.env, banner=f"start {node_id}"
        )
        if wait:
            self.wait_healthy(node_id, timeout)

    def wait_healthy(self, node_id: str, timeout: float = START_TIMEOUT) -> None:
        n = self.nodes[node_id]
        wait_started(
            n.proc,
            lambda: self.health(node_id, timeout=0.5) is not None,
            name=node_id,
            timeout=timeout,
            log_path=n.log_path,
        )

    def kill(self, node_id: str, sig: int = signal.SIGKILL, timeout: float = STOP_TIMEOUT) -> int | None:
        """Send ``sig`` and wait (bounded) for the process to exit; returns its exit code."""
        n = self.nodes[node_id]
        if n.proc is None:
            return None
        code = stop_process(n.proc, sig, timeout)
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

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
