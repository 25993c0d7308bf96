"""Security: TLS and the bearer token end to end (producer -> master -> slave -> daemon -> landing),
untrusted certificates refused, secrets never logged, admin endpoint and broker bound to loopback by
default."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mqd_dev.chaos.check import read_landing
from support import REPO_ROOT
from support.harness import Cluster, self_signed_cert, to_toml

from mqd.config import AdminConfig, BrokerConfig, ConsumerConfig
from mqd.waiting import wait_until_sync
from mqd.wire.client import BrokerClient, BrokerError

TOKEN = "tok-3f9a7c1e-never-log-me"
WRONG = "wrong-b71d2e-never-log-me-either"
REPO = REPO_ROOT
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl tool")


def _daemon_config(
    root: Path, bootstrap: list[str], *, token: str | None, admin: bool = False, ca_file: Path | None = None
) -> Path:
    state = root / "state"
    body: dict[str, Any] = {
        "consumer": {
            "group": "sec",
            "client_id": "sec-1",
            "bootstrap": bootstrap,
            "topics": ["events"],
            "consume_from": "first",
            "heartbeat_interval": 0.5,
            "request_timeout": 5.0,
            "auth_token": token,
            "tls_ca_file": ca_file,
        },
        "landing": {"dir": str(root / "landing"), "max_age": 0.3},
        "admin": {"enabled": admin, "port": 0, "auth_token": "admin-" + TOKEN},
        "log": {"level": "debug", "format": "json"},
        "daemon": {
            "state_dir": str(state),
            "pid_file": str(state / "mqd.pid"),
            "log_file": str(state / "mqd.log"),
            "watchdog": False,
        },
    }
    path = root / "mqd.toml"
    path.write_text(to_toml({k: {kk: vv for kk, vv in v.items() if vv is not None} for k, v in body.items()}))
    return path


def _mqd(args: list[str], env: dict[str, str], timeout: float, log: Path) -> int:
    with open(log, "ab") as fh:
        return subprocess.run(
            [sys.executable, "-m", "mqd.operator.cli", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=timeout,
            cwd=REPO,
        ).returncode


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path)


@needs_openssl
def test_tls_and_token_end_to_end_and_no_secret_in_any_log(
    cluster_factory: Any, tmp_path: Path, tls: tuple[Path, Path]
) -> None:
    """A master and a slave serving HTTPS and requiring the token: ``mqd produce`` (acks=all, so the
    slave replicates over TLS with the token) and a daemon in burst mode land every record; the
    token, a wrong token tried on the nodes, and the admin token appear in no log at debug level."""
    cert, _key = tls
    env = {**os.environ, "SSL_CERT_FILE": str(cert), "PYTHONUNBUFFERED": "1"}
    cluster: Cluster = cluster_factory(  # the slave trusts its master through tls_ca_file
        topics={"events": 2},
        slaves=1,
        tls=tls,
        node_settings={"auth_token": TOKEN, "log_level": "debug", "tls_ca_file": str(cert)},
    )
    master = cluster.url(cluster.master())
    assert master.startswith("https://")
    logs = tmp_path / "clients.log"
    assert (
        _mqd(
            [
                "produce",
                "--bootstrap",
                master,
                "--topic",
                "events",
                "--count",
                "300",
                "--acks",
                "all",
                "--token",
                TOKEN,
            ],
            env,
            60,
            logs,
        )
        == 0
    ), logs.read_text()[-3000:]
    # a wrong token is refused and must not be echoed either
    code = _mqd(
        ["produce", "--bootstrap", master, "--topic", "events", "--count", "1", "--token", WRONG],
        env,
        60,
        logs,
    )
    assert code != 0
    cfg = _daemon_config(tmp_path, [master], token=TOKEN)
    assert _mqd(["run", "--config", str(cfg), "--burst"], env, 90, logs) == 0, logs.read_text()[-3000:]
    landed = read_landing(tmp_path / "landing", "events")
    assert landed.num_rows == 300
    for node_id in cluster.node_ids:
        text = cluster.log(node_id)
        assert text, node_id
        assert TOKEN not in text and WRONG not in text, f"a token is in {node_id}'s log"
    for path in [logs, tmp_path / "state" / "mqd.log"]:
        if path.exists():
            text = path.read_text(errors="replace")
            assert TOKEN not in text and WRONG not in text, f"a token is in {path}"


@needs_openssl
def test_daemon_verifies_brokers_with_consumer_tls_ca_file(
    cluster_factory: Any, tmp_path: Path, tls: tuple[Path, Path]
) -> None:
    """``consumer.tls_ca_file`` alone (no SSL_CERT_FILE) lets a daemon verify the brokers' private
    CA and land everything in burst mode."""
    cert, _key = tls
    cluster: Cluster = cluster_factory(topics={"events": 1}, tls=tls, node_settings={"auth_token": TOKEN})
    master = cluster.url(cluster.master())
    logs = tmp_path / "clients.log"
    env = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    assert (
        _mqd(
            ["produce", "--bootstrap", master, "--topic", "events", "--count", "50", "--token", TOKEN],
            {**env, "SSL_CERT_FILE": str(cert)},
            60,
            logs,
        )
        == 0
    ), logs.read_text()[-3000:]
    cfg = _daemon_config(tmp_path, [master], token=TOKEN, ca_file=cert)
    try:
        code = _mqd(["run", "--config", str(cfg), "--burst"], env, 45, logs)
    except subprocess.TimeoutExpired:
        code = None
    assert code == 0, f"burst run did not finish ({code}):\n{logs.read_text()[-3000:]}"
    assert read_landing(tmp_path / "landing", "events").num_rows == 50


@needs_openssl
async def test_untrusted_certificate_and_missing_token_are_refused(
    cluster_factory: Any, tls: tuple[Path, Path]
) -> None:
    """A client that does not trust the node's certificate gets a TLS error, not an answer; one that
    trusts it but sends no token gets 401; /v1/health stays open for probes."""
    cert, _key = tls
    cluster: Cluster = cluster_factory(
        topics={"events": 1}, tls=tls, env={"SSL_CERT_FILE": str(cert)}, node_settings={"auth_token": TOKEN}
    )
    url = cluster.url(cluster.master())
    async with BrokerClient(request_timeout=5, auth_token=TOKEN) as client:
        with pytest.raises(BrokerError) as err:
            await client.metadata(url)
        assert "certificate" in str(err.value).lower() or "ssl" in str(err.value).lower()
    code = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-c",
            "import asyncio, sys\nfrom mqd.wire.client import BrokerClient, BrokerError\n"
            "async def main():\n"
            "    async with BrokerClient(request_timeout=5) as c:\n"
            "        assert (await c.health(sys.argv[1]))['status'] == 'ok'\n"
            "        try:\n"
            "            await c.metadata(sys.argv[1])\n"
            "        except BrokerError as e:\n"
            "            sys.exit(0 if e.status == 401 else 3)\n"
            "        sys.exit(4)\n"
            "asyncio.run(main())\n",
            url,
        ],
        env={**os.environ, "SSL_CERT_FILE": str(cert)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert code.returncode == 0, code.stdout + code.stderr


def test_tls_cert_without_key_is_a_clear_startup_error(cluster_factory: Any, tmp_path: Path) -> None:
    """Half a TLS config refuses to start with a message naming both keys, instead of serving
    plain HTTP."""
    (tmp_path / "c.pem").write_text("x")
    cluster: Cluster = cluster_factory(
        topics={"events": 1}, start=False, node_settings={"tls_cert": str(tmp_path / "c.pem")}
    )
    with pytest.raises(RuntimeError) as err:
        cluster.start(timeout=30)
    assert "tls_cert and tls_key" in str(err.value)


def test_defaults_bind_to_loopback_and_hide_secrets() -> None:
    """Out of the box nothing listens beyond 127.0.0.1, and secrets are not in config reprs."""
    assert AdminConfig().host == "127.0.0.1"
    assert BrokerConfig.model_fields["host"].default == "127.0.0.1"
    c = ConsumerConfig(auth_token=TOKEN)
    a = AdminConfig(auth_token=TOKEN)
    b = BrokerConfig(node_id="n", cluster_file=Path("c"), data_dir=Path("d"), auth_token=TOKEN)
    for model in (c, a, b):
        assert TOKEN not in repr(model) and TOKEN not in str(model)


@pytest.fixture
def running_daemon(cluster_factory: Any, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    cluster: Cluster = cluster_factory(topics={"events": 1})
    cfg = _daemon_config(tmp_path, [cluster.bootstrap], token=None, admin=True)
    log = open(tmp_path / "daemon.out", "ab")  # closed in the finalizer
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    try:
        yield proc, tmp_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


def test_admin_endpoint_listens_on_loopback_only_by_default(
    running_daemon: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """A daemon whose config sets no admin host serves its admin endpoint on 127.0.0.1, and every
    socket it listens on is a loopback one."""
    proc, root = running_daemon
    admin_file = root / "state" / "admin.json"

    def admin() -> dict[str, Any] | None:
        assert proc.poll() is None, (root / "daemon.out").read_text()[-3000:]
        try:
            return json.loads(admin_file.read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    info = wait_until_sync(admin, timeout=30, what="admin.json")
    assert info["url"].startswith("http://127.0.0.1:")
    listening = [c for c in psutil.Process(proc.pid).net_connections(kind="inet") if c.status == "LISTEN"]
    assert listening
    assert {c.laddr.ip for c in listening} == {"127.0.0.1"}


async def test_broker_without_token_config_is_open_but_health_never_needs_one(cluster_factory: Any) -> None:
    """Control: the token check is only on when configured (no accidental lock-out), and health is
    always open for probes."""
    cluster: Cluster = cluster_factory(topics={"events": 1})
    url = cluster.bootstrap
    async with BrokerClient(request_timeout=5, auth_token=WRONG) as c:
        assert (await c.health(url))["status"] == "ok"
        assert (await c.metadata(url))["topics"]
    assert WRONG not in cluster.log(cluster.master())
