"""No node deletes acknowledged data because a peer has less (issue 12.2), with real brokers.

A master whose data dir is replaced copies everything back from its slave before it takes writes
(the issue's case: 1,000 acks=all records survive); with no slave reachable it refuses writes with a
clear 503 and a degraded health until a slave answers or an operator runs ``mqd broker-init``; and a
slave never truncates below what it reported to its master (what acks=all may have acknowledged),
even when an operator made the master take writes on an empty log.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.harness import Cluster, fetch_all
from support.storage_node import flip_byte

from mqd.broker.master_recovery import MasterRecovery
from mqd.broker.replica_client import ReplicaClient
from mqd.broker.storage import Storage
from mqd.config import StorageConfig
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError

TOPIC = "events"


async def _produce(client: BrokerClient, url: str, count: int, tag: str, per_batch: int = 100) -> None:
    for start in range(0, count, per_batch):
        values = [f"{tag}-{i}".encode() for i in range(start, min(count, start + per_batch))]
        await client.produce(url, TOPIC, 0, fmt.encode_batch(values), acks="all")


def _wait(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def _replace_data_dir(cluster: Cluster, node: str) -> None:
    """What a replaced disk leaves: the node's data dir gone (its node marker with it)."""
    cluster.kill(node)
    shutil.rmtree(cluster.nodes[node].data_dir)


async def test_master_data_dir_replaced_loses_nothing(cluster_factory: Callable[..., Cluster]) -> None:
    """1,000 records produced with acks=all, the master's data dir replaced, the master restarted:
    all 1,000 are on the master and the slave (on main the slave truncated to the empty master),
    and new writes continue after them."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce(client, murl, 1000, "a")
    acked = fetch_all(surl, TOPIC, 0)
    assert len(acked) == 1000
    _replace_data_dir(cluster, master)
    cluster.start_node(master)
    assert fetch_all(murl, TOPIC, 0) == acked
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce(client, murl, 10, "b", per_batch=10)
    _wait(lambda: len(fetch_all(surl, TOPIC, 0)) == 1010, "the slave to copy the new batch")
    after = fetch_all(surl, TOPIC, 0)
    assert after[:1000] == acked and after == fetch_all(murl, TOPIC, 0)
    assert "master recovered records from a slave" in cluster.log(master)


async def test_new_master_dir_without_slave_refuses_writes_until_consulted(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Master data dir replaced while its slave is down: the master serves but refuses writes (503
    data_dir_unverified, health degraded with the reason); once the slave is back it copies the
    records back and takes writes."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl = cluster.url(master)
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce(client, murl, 300, "a")
    acked = fetch_all(cluster.url(slave), TOPIC, 0)
    cluster.kill(slave)
    _replace_data_dir(cluster, master)
    cluster.start_node(master)
    health = cluster.health(master)
    assert health is not None and health["status"] == "degraded", health
    assert any("consulted its slaves" in r for r in health["reasons"]), health
    async with BrokerClient(request_timeout=10.0) as client:
        with pytest.raises(BrokerError) as err:
            await client.produce(murl, TOPIC, 0, fmt.encode_batch([b"x"]), acks="master")
        assert err.value.status == 503 and err.value.code == "data_dir_unverified", err.value
        cluster.start_node(slave)
        _wait(lambda: len(fetch_all(murl, TOPIC, 0)) == 300, "the master to copy the records back")
        assert fetch_all(murl, TOPIC, 0) == acked
        _wait(lambda: (cluster.health(master) or {}).get("status") == "ok", "the master's health")
        await _produce(client, murl, 5, "b", per_batch=5)


async def test_slave_refuses_to_truncate_below_what_it_reported(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """An operator lets a master with a replaced, empty data dir take writes (`mqd broker-init`)
    while its slave is down; the slave comes back to a master log shorter than what it reported:
    it keeps its 200 records, parks the partition and reports it (stats, degraded health) instead
    of truncating (on main it went to the master's 5 records)."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce(client, murl, 200, "a")
    acked = fetch_all(surl, TOPIC, 0)
    assert len(acked) == 200
    cluster.stop_node(slave)  # a clean stop: its floor is saved (a crash may lose the last second's)
    _replace_data_dir(cluster, master)
    init = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "mqd.operator.cli",
            "broker-init",
            "--config",
            str(cluster.nodes[master].config_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert init.returncode == 0, init.stderr
    cluster.start_node(master)
    async with BrokerClient(request_timeout=10.0) as client:
        # no slave is live: acks=all does not wait
        await client.produce(murl, TOPIC, 0, fmt.encode_batch([b"new"] * 5), acks="all")
    cluster.start_node(slave)

    def parked() -> bool:
        stats = cluster.get_json(slave, "/v1/stats") or {}
        parts = stats.get("replication", {}).get("partitions", [])
        return bool(parts) and parts[0]["parked"]

    _wait(parked, "the slave to park the partition")
    stats = cluster.get_json(slave, "/v1/stats")
    assert stats is not None
    repl = stats["replication"]
    assert repl["truncations_refused"] >= 1
    assert repl["partitions"][0]["floor"] == 200
    assert "not truncating" in repl["partitions"][0]["error"]
    health = cluster.health(slave)
    assert health is not None and health["status"] == "degraded", health
    assert fetch_all(surl, TOPIC, 0) == acked
    assert "replication parked" in cluster.log(slave)


async def test_master_repairs_a_damaged_batch_from_its_slave(cluster_factory: Callable[..., Cluster]) -> None:
    """One flipped byte in a batch of an old closed segment of the master: at restart the batch is
    fenced (storage), then the master copies that exact range back from its slave before it
    listens: every record is served again by the master and its health is ok (without the repair
    the range stays DATA_LOST and health degraded)."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1, node_settings={"storage": {"segment_bytes": 4096}})
    master, slave = cluster.master(), cluster.slaves()[0]
    murl = cluster.url(master)
    async with BrokerClient(request_timeout=10.0) as client:
        for i in range(60):
            await client.produce(murl, TOPIC, 0, fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(5)]))
    _wait(lambda: len(fetch_all(cluster.url(slave), TOPIC, 0)) == 300, "the slave to copy everything")
    acked = fetch_all(murl, TOPIC, 0)
    cluster.stop_node(master)
    folder = cluster.nodes[master].data_dir / "logs" / f"{TOPIC}-0"
    second = sorted(folder.glob("*.log"))[1]
    victim = fmt.scan(second.read_bytes())[1]
    second.with_suffix(".index").unlink()  # rescanned at open, so the damage is found
    flip_byte(second, victim.position + 60)
    cluster.start_node(master)
    assert fetch_all(murl, TOPIC, 0) == acked
    health = cluster.health(master)
    assert health is not None and health["status"] == "ok", health
    assert "fenced range repaired from a replica" in cluster.log(master)


async def _incarnation_at(
    client: BrokerClient, url: str, offset: int, incarnation: str | None
) -> tuple[str, Any]:
    """The (status, answer) of a fetch at ``offset`` naming ``incarnation``, as a consumer asks."""
    answer = await client.fetch(
        url,
        [{"topic": TOPIC, "partition": 0, "offset": offset, "max_bytes": 1024, "incarnation": incarnation}],
        max_wait_ms=0,
        min_bytes=0,
    )
    p = answer.partitions[0]
    return str(p.status), p


async def test_partial_copy_back_never_reuses_offsets_under_the_landed_incarnation(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """The chaos finding of issue 12 (seed 21: 7,100 records cut as already landed): the master's
    data dir is replaced while its slave holds a damaged batch its trusted index does not reveal.
    The copy-back used to stop at that batch; now it fences it and goes on (test_segment_scrub.py),
    but the master still cannot know how far its lost log served under incarnation A, so the
    offsets it writes next must not be named A: a consumer at its old position gets
    INCARNATION_CHANGED with diverged_at at the master's new end (on the old main the master
    answered under A, the consumer followed it back and the new records were cut)."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1, node_settings={"storage": {"segment_bytes": 4096}})
    master, slave = cluster.master(), cluster.slaves()[0]
    murl = cluster.url(master)
    async with BrokerClient(request_timeout=10.0) as client:
        for i in range(60):
            batch = fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(5)])
            await client.produce(murl, TOPIC, 0, batch, acks="all")
        status, p = await _incarnation_at(client, murl, 300, None)
        landed_under = p.incarnation
        assert landed_under is not None
    _wait(lambda: len(fetch_all(cluster.url(slave), TOPIC, 0)) == 300, "the slave to copy everything")
    cluster.stop_node(slave)  # a clean stop: its closed segments' indexes are trusted at start
    folder = cluster.nodes[slave].data_dir / "logs" / f"{TOPIC}-0"
    second = sorted(folder.glob("*.log"))[1]
    victim = fmt.scan(second.read_bytes())[1]
    flip_byte(second, victim.position + 60)
    cluster.start_node(slave)
    _replace_data_dir(cluster, master)
    cluster.start_node(master)
    assert "master recovery: range fenced, the copy-back goes on after it" in cluster.log(master)
    async with BrokerClient(request_timeout=10.0) as client:
        status, p = await _incarnation_at(client, murl, 300, landed_under)
        assert status == "INCARNATION_CHANGED", (status, p)
        assert p.incarnation != landed_under
        assert p.diverged_at is not None and p.diverged_at == p.max_offset == 300, p


async def test_slave_repairs_a_damaged_batch_from_its_master(cluster_factory: Callable[..., Cluster]) -> None:
    """One flipped byte in a batch of an old closed segment of a stopped slave, more records produced
    meanwhile: at restart the batch is fenced (storage), the slave copies past the hole and asks its
    master for the fenced range, which is repaired in place: the slave serves every record of the
    master again and its health is ok (without the repair the range stays DATA_LOST, health
    degraded)."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1, node_settings={"storage": {"segment_bytes": 4096}})
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    async with BrokerClient(request_timeout=10.0) as client:
        for i in range(60):
            await client.produce(murl, TOPIC, 0, fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(5)]))
        _wait(lambda: len(fetch_all(surl, TOPIC, 0)) == 300, "the slave to copy everything")
        cluster.stop_node(slave)
        folder = cluster.nodes[slave].data_dir / "logs" / f"{TOPIC}-0"
        second = sorted(folder.glob("*.log"))[1]
        victim = fmt.scan(second.read_bytes())[1]
        second.with_suffix(".index").unlink()  # rescanned at open, so the damage is found
        flip_byte(second, victim.position + 60)
        for i in range(60, 80):
            await client.produce(murl, TOPIC, 0, fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(5)]))
    acked = fetch_all(murl, TOPIC, 0)
    assert len(acked) == 400
    cluster.start_node(slave)
    _wait(lambda: fetch_all(surl, TOPIC, 0) == acked, "the slave to repair the range and catch up")
    _wait(lambda: (h := cluster.health(slave)) is not None and h["status"] == "ok", "slave health ok")
    log_text = cluster.log(slave)
    assert "damaged range in a log segment: fenced" in log_text
    assert "fenced range repaired from a replica" in log_text


async def test_a_copy_back_cut_by_the_network_is_retried_under_the_slaves_names(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """The chaos finding of seed 199203 (241,060 records landed twice): a master with a replaced data
    dir whose copy-back is cut mid-answer (here: the slave dies right after answering the probe)
    tries the whole round again, and until it has copied everything its log carries only the
    slave's incarnations. It used to begin a new incarnation at its end (offset 0) after each cut
    copy, so a consumer at its old position was told that every offset it had landed now held
    other records, and fetched them all again as new ones."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce(client, cluster.url(master), 500, "a")
        _wait(lambda: len(fetch_all(cluster.url(slave), TOPIC, 0)) == 500, "the slave to copy everything")
        _, p = await _incarnation_at(client, cluster.url(slave), 500, None)
        served_as = p.incarnation  # the name the consumers landed the 500 records under
    assert served_as is not None
    cluster.kill(master)  # the master stays down: its recovery runs here, in-process, on a new dir
    storage = Storage(tmp_path / "replaced", StorageConfig(fsync="never"))
    storage.open([(TOPIC, 0)])
    replica = ReplicaClient(cluster.replica_auth(master), request_timeout=5.0)
    await replica.start()
    recovery = MasterRecovery(
        node_id=master,
        cluster_id=None,
        storage=storage,
        partitions=[(TOPIC, 0)],
        slaves=[cluster.node_spec(slave)],
        client=replica,
    )
    probe = recovery._slave_ends

    async def probe_then_slave_dies(timeout: float) -> Any:
        ends = await probe(timeout)
        cluster.kill(slave)  # the copy's fetch fails: a BrokerError mid-round
        return ends

    try:
        recovery._slave_ends = probe_then_slave_dies  # type: ignore[method-assign]
        assert await recovery._attempt() is False
        plog = storage.get(TOPIC, 0)
        assert plog is not None
        assert plog.max_offset == 0 and plog.incarnation == served_as, plog.history
        slave_names = {e.id for e in plog.history}
        cluster.start_node(slave)
        recovery._slave_ends = probe  # type: ignore[method-assign]
        assert await recovery._attempt() is True
        assert plog.max_offset == 500
        # the slave's names up to 500, then one new incarnation where writes begin
        history = plog.history
        assert {e.id for e in history[:-1]} == slave_names, history
        assert history[-1].base == 500 and history[-1].id not in slave_names, history
        assert recovery.writes_refused is None
    finally:
        await replica.close()
        storage.close()
