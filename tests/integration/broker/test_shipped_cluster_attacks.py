"""The forged-progress and fake-master attacks of issue 13 against the shipped 3-group configs.

The six node files and the cluster file of config/ are copied as they are, with only the ports
rewritten to free ones (their relative data dirs and credential paths then land in the copy's
folder). Credentials come from the real ``mqd broker-credentials`` command; six real ``mqd broker``
processes run on them. Proves, with what an operator would install:

- forged replica progress for a frozen slave (no credentials, a bearer token, another node's
  signature, another node's signature under the slave's name) is refused, and acks=all does not
  answer 200 while the master still counts the slave live;
- a process at a killed master's port receives no token or secret, and the slave applies none of
  its answers: its records stay and its health says the master is unverified until the real one is
  back.

Without ``replica_credentials`` in the shipped files the nodes refuse to start (exit 2), so the
fixture fails.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.harness import records_of
from support.replica import FakeMaster, fetched_replica

from mqd.broker.replica_auth import HEADER_NODE, HEADER_NONCE, ReplicaAuth, load_credentials, peers_of
from mqd.config import load_cluster_config
from mqd.testing import ManagedProcess, broker_argv, free_port, get_json
from mqd.waiting import wait_until, wait_until_sync
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.metadata import ClusterMetadata

CONFIG = Path(__file__).resolve().parents[3] / "config"
CLUSTER_FILE = "cluster-3g.toml"
TOPIC = "events"
START_S = 60.0


@dataclass
class ShippedCluster:
    """The six nodes of config/cluster-3g.toml on free ports, in ``root``."""

    root: Path
    nodes: dict[str, ManagedProcess]
    urls: dict[str, str]
    ports: dict[str, int]

    def url(self, node: str) -> str:
        return self.urls[node]

    def get(self, node: str, path: str) -> dict[str, Any] | None:
        return get_json(self.urls[node] + path, 1.0)

    def replica_auth(self, node: str) -> ReplicaAuth:
        """Signs as ``node``, from the credentials file its shipped config names."""
        config = tomllib.loads((self.root / "config" / f"{node}.toml").read_text())
        path = (self.root / "config" / config["replica_credentials"]).resolve()
        found = load_cluster_config(self.root / "config" / CLUSTER_FILE).node(node)
        assert found is not None
        peers = peers_of(found[0], node)
        return ReplicaAuth(load_credentials(path, node, peers), peers)

    def secrets(self, node: str) -> list[str]:
        config = tomllib.loads((self.root / "config" / f"{node}.toml").read_text())
        data = tomllib.loads((self.root / "config" / config["replica_credentials"]).read_text())
        return list(data["secrets"].values())

    def replicating(self, slave: str) -> bool:
        stats = self.get(slave, "/v1/stats") or {}
        return bool((stats.get("replication") or {}).get("master_reachable"))

    def wait_healthy(self, node: str) -> None:
        self.nodes[node].wait_ready(lambda: self.get(node, "/v1/health") is not None, START_S)


def _copy_shipped(root: Path) -> dict[str, int]:
    """config/cluster-3g.toml and config/broker-*-*.toml into root/config, each node's port
    replaced by a free one (the url in the cluster file, ``port`` in the node's file); node -> port."""
    out = root / "config"
    out.mkdir()
    cluster_text = (CONFIG / CLUSTER_FILE).read_text()
    shipped = load_cluster_config(CONFIG / CLUSTER_FILE)
    ports: dict[str, int] = {}
    for group in shipped.groups:
        for spec in group.nodes:
            old = int(spec.url.rsplit(":", 1)[1])
            new = free_port()
            ports[spec.id] = new
            cluster_text, n = re.subn(
                rf'"http://127\.0\.0\.1:{old}"', f'"http://127.0.0.1:{new}"', cluster_text
            )
            assert n == 1, spec.url
            text, n = re.subn(
                rf"(?m)^port = {old}\b", f"port = {new}", (CONFIG / f"{spec.id}.toml").read_text()
            )
            assert n == 1, f"{spec.id}.toml: port {old}"
            (out / f"{spec.id}.toml").write_text(text)
    (out / CLUSTER_FILE).write_text(cluster_text)
    return ports


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShippedCluster]:
    root = tmp_path_factory.mktemp("shipped-3g")
    ports = _copy_shipped(root)
    cred_dir = root / "demo-data" / "credentials"  # where the shipped files point
    argv = [sys.executable, "-m", "mqd.operator.cli", "broker-credentials"]
    argv += ["--cluster", str(root / "config" / CLUSTER_FILE), "--out-dir", str(cred_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    nodes: dict[str, ManagedProcess] = {}
    for node in ports:
        config = tomllib.loads((root / "config" / f"{node}.toml").read_text())
        # the shipped relative paths resolve into the copy, never into the repository's demo-data
        for key in ("data_dir", "replica_credentials"):
            assert (root / "config" / config[key]).resolve().is_relative_to(root), (node, key)
        assert (root / "config" / config["replica_credentials"]).is_file(), node
        nodes[node] = ManagedProcess(
            node,
            broker_argv(root / "config" / f"{node}.toml"),
            root / f"{node}.log",
            cwd=root,
            die_with_parent=True,
        )
    cluster = ShippedCluster(root, nodes, {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}, ports)
    try:
        for proc in nodes.values():
            proc.start()
        for node in nodes:
            cluster.wait_healthy(node)
        for node in nodes:
            if node.endswith("-slave"):
                wait_until_sync(partial(cluster.replicating, node), START_S, f"{node} to replicate")
        yield cluster
    except BaseException:
        for node, proc in nodes.items():
            print(f"----- {node} -----\n{proc.tail(40)}")
        raise
    finally:
        for proc in nodes.values():
            proc.stop()


def _partition_of(shipped: ShippedCluster, group: str) -> int:
    """A partition of ``events`` placed on broker group ``group``."""
    md = ClusterMetadata.parse(shipped.get(f"{group}-master", "/v1/metadata"))
    for tp in md.partitions_for([TOPIC]):
        url, _ = md.master_url(tp)
        if url == shipped.url(f"{group}-master"):
            return tp.partition
    raise AssertionError(f"no {TOPIC} partition on {group}")


async def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, data=body, headers={"Content-Type": "application/json", **headers}) as resp:
            await resp.read()
            return resp.status


async def test_forged_progress_does_not_make_acks_all_answer(shipped: ShippedCluster) -> None:
    """broker-a-slave frozen: replica fetches naming it with offset 10^12 are refused (no
    credentials, a bearer token, broker-b-slave's signature, broker-b-master's signature under
    broker-a-slave's name), and the acks=all produce to broker-a-master answers only once the master
    counts the frozen slave down (its liveness timeout): never while it is live."""
    master, slave = "broker-a-master", "broker-a-slave"
    partition = _partition_of(shipped, "broker-a")
    murl = shipped.url(master)
    fetch_path = "/v1/replica/fetch"
    body = json.dumps(
        {
            "node": slave,
            "max_wait_ms": 0,
            "partitions": [{"topic": TOPIC, "partition": partition, "offset": 10**12}],
        }
    ).encode()
    async with BrokerClient(request_timeout=30.0) as client:
        await client.produce(murl, TOPIC, partition, fmt.encode_batch([b"warm-up"]), acks="all")
        shipped.nodes[slave].send_signal(signal.SIGSTOP)
        try:
            produce = asyncio.create_task(
                client.produce(murl, TOPIC, partition, fmt.encode_batch([b"needs-the-slave"]), acks="all")
            )
            statuses = [
                await _post(murl + fetch_path, body, {}),
                await _post(murl + fetch_path, body, {"Authorization": "Bearer any-client-token"}),
            ]
            other = shipped.replica_auth("broker-b-slave")
            statuses.append(
                await _post(
                    murl + fetch_path, body, other.sign_request("POST", fetch_path, body, other.new_nonce())
                )
            )
            headers = shipped.replica_auth("broker-b-master").sign_request(
                "POST", fetch_path, body, other.new_nonce()
            )
            headers[HEADER_NODE] = slave
            statuses.append(await _post(murl + fetch_path, body, headers))
            assert all(s in (401, 403) for s in statuses), statuses
            assert not produce.done()
            await asyncio.wait_for(produce, 30)  # answers once the slave counts as down
            md = ClusterMetadata.parse(shipped.get(master, "/v1/metadata"))
            assert not md.is_alive(slave), "acks=all answered while the frozen slave was live"
        finally:
            shipped.nodes[slave].send_signal(signal.SIGCONT)
    await asyncio.to_thread(
        wait_until_sync,
        lambda: ClusterMetadata.parse(shipped.get(master, "/v1/metadata")).is_alive(slave),
        START_S,
        f"{slave} live again",
    )


async def _records(url: str, partition: int) -> list[tuple[int, bytes]]:
    async with BrokerClient(request_timeout=10.0) as client:
        answer = await client.fetch(
            url, [{"topic": TOPIC, "partition": partition, "offset": 0}], max_wait_ms=0
        )
    got: list[tuple[int, bytes]] = records_of(answer.partitions[0].data)
    return got


async def test_fake_master_gets_no_secret_and_changes_nothing(shipped: ShippedCluster) -> None:
    """broker-b-master killed, a fake at its port: broker-b-slave sends it no token or secret
    (signed calls only), counts its answers unverified, reports degraded health and keeps its 100
    records; the real master back, the slave's health is ok again."""
    master, slave = "broker-b-master", "broker-b-slave"
    partition = _partition_of(shipped, "broker-b")
    async with BrokerClient(request_timeout=30.0) as client:
        for i in range(10):
            batch = fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(10)])
            await client.produce(shipped.url(master), TOPIC, partition, batch, acks="all")
    before = await _records(shipped.url(slave), partition)
    assert len(before) == 100
    await asyncio.to_thread(shipped.nodes[master].stop, signal.SIGKILL)
    fake = FakeMaster(master)
    await fake.start(shipped.ports[master])
    try:
        await wait_until(lambda: fetched_replica(fake) >= 3, 30, "the slave to call the fake master")
        stats = shipped.get(slave, "/v1/stats")
        assert stats is not None and stats["replication"]["unverified_answers"] >= 1, stats
        health = shipped.get(slave, "/v1/health")
        assert health is not None and health["status"] == "degraded", health
        assert any(r.startswith("unverified master") for r in health["reasons"]), health
    finally:
        await fake.stop()
    secrets = shipped.secrets(slave)
    for _, headers, body in fake.requests:
        assert "Authorization" not in headers and "authorization" not in headers
        for secret in secrets:
            assert secret not in json.dumps(headers) and secret.encode() not in body
        assert headers[HEADER_NONCE]  # signed, not carrying a secret
    assert await _records(shipped.url(slave), partition) == before
    await asyncio.to_thread(shipped.nodes[master].start)
    await asyncio.to_thread(shipped.wait_healthy, master)
    await wait_until(
        lambda: (shipped.get(slave, "/v1/health") or {}).get("status") == "ok",
        START_S,
        "the slave healthy again",
    )
