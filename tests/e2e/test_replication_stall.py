"""A slave's replication never stops without a word (make chaos seed 529091, issue of session 6).

In that run a slave stopped replicating for good, with no log line and no error in /v1/stats: the
fault proxy inverted one byte of the ``X-Mqd-Replica-Signature`` header of a replica fetch answer,
aiohttp kept the byte as a surrogate escape, and the answer check's ``sig.encode()`` raised a
``UnicodeEncodeError`` that no caller caught, so the slave's fetch loop task ended silently while its
committed-offsets loop went on. Real master and slave processes, the master behind a proxy that
inverts exactly that byte.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from mqd_dev.chaos.procs import ChaosCluster
from mqd_dev.chaos.proxy import FaultProxy

from mqd.broker.consumer_groups import ConsumerGroupStore
from mqd.broker.replica_auth import HEADER_SIGNATURE
from mqd.broker.replica_client import ReplicaClient
from mqd.broker.replica_floor import ReplicaFloor
from mqd.broker.replication import Replicator
from mqd.broker.storage import Storage
from mqd.config import StorageConfig, load_cluster_config
from mqd.testing import LocalCluster
from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.protocol import FETCH_CONTENT_TYPE

TOPIC = "events"
_MARK = f"\r\n{HEADER_SIGNATURE}: ".encode()


class SignatureFlipProxy(FaultProxy):
    """The chaos proxy, transparent, except that while ``armed`` > 0 it inverts the first byte of
    the signature header of the next replica fetch answers (one per arming), as ``net_corrupt`` did."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.armed = 0
        self.flipped = 0

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                at = chunk.find(_MARK)
                if self.armed > 0 and at >= 0 and FETCH_CONTENT_TYPE.encode() in chunk:
                    at += len(_MARK)
                    chunk = chunk[:at] + bytes([chunk[at] ^ 0xFF]) + chunk[at + 1 :]
                    self.armed -= 1
                    self.flipped += 1
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            return


async def _replication(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/stats") as resp:
        body = await resp.json()
    rep = body["replication"]
    assert isinstance(rep, dict)
    return rep


async def test_corrupted_signature_header_does_not_stop_replication(tmp_path: Path) -> None:
    """An answer whose signature header arrives with one byte inverted is refused as unverified
    (counted in ``unverified_answers``) and the slave keeps replicating: records the master takes
    afterwards reach the slave. On main the fetch loop died on the UnicodeEncodeError and the slave
    never copied another record."""
    cluster = ChaosCluster(tmp_path, topic=TOPIC, partitions=1, groups=1, slaves=1, seed=1)
    master, slave = cluster.masters()[0], cluster.slaves()[0]
    proxy = SignatureFlipProxy(master.port)
    master.proxy = proxy  # the cluster file names it: the slave replicates through it
    await cluster.start()
    try:
        async with BrokerClient(request_timeout=5.0) as client:

            async def slave_end(at_least: int) -> bool:
                parts = (await _replication(slave.direct_url))["partitions"]
                return bool(parts[0]["max_offset"] is not None and parts[0]["max_offset"] >= at_least)

            await client.produce(master.direct_url, TOPIC, 0, fmt.encode_batch([b"before"] * 10))
            await wait_until(lambda: slave_end(10), 30, "the slave copies the first batch")

            proxy.armed = 1
            await client.produce(master.direct_url, TOPIC, 0, fmt.encode_batch([b"flipped"] * 10))
            await wait_until(lambda: proxy.flipped == 1, 30, "an answer with a corrupted signature header")

            await client.produce(master.direct_url, TOPIC, 0, fmt.encode_batch([b"after"] * 10))
            # the slave backs off at most 2 s after a refused answer, then asks again
            await wait_until(lambda: slave_end(30), 20, "the slave copies the batches after the fault")
            rep = await _replication(slave.direct_url)
            assert rep["unverified_answers"] >= 1, rep
            assert rep["loop_restarts"] == 0, rep  # refused by the client check, not by the supervisor
    finally:
        await cluster.stop()


async def test_a_replication_loop_that_ends_is_logged_counted_and_started_again(tmp_path: Path) -> None:
    """The Replicator's supervision, for the next exception nobody expects: a Replicator over real
    storage follows a real master process; its first append hook raises, and later its fetch task
    is cancelled from outside. Each time the loop is counted in ``loop_restarts``, the cause is the
    last error, and replication goes on: every record the master takes reaches this log. On main
    the first exception ended the fetch loop for good."""
    cluster = LocalCluster(tmp_path / "cluster", topics={TOPIC: 1}, slaves=1)
    master, slave_id = cluster.master(), cluster.slaves()[0]
    found = load_cluster_config(cluster.cluster_path).node(slave_id)
    assert found is not None
    cluster.start_node(master)  # the slave process never runs: this Replicator stands in for it
    storage = Storage(tmp_path / "slave", StorageConfig(fsync="never"))
    storage.open([(TOPIC, 0)])
    client = ReplicaClient(cluster.replica_auth(slave_id))
    failures = [RuntimeError("append hook failed")]

    def on_append(topic: str, partition: int) -> None:
        if failures:
            raise failures.pop()

    replicator = Replicator(
        node_id=slave_id,
        broker_group=found[0],
        storage=storage,
        partitions=[(TOPIC, 0)],
        client=client,
        consumer_groups=ConsumerGroupStore(tmp_path / "slave"),
        floor=ReplicaFloor(tmp_path / "slave"),
        on_append=on_append,
        wait_ms=50,
    )
    plog = storage.get(TOPIC, 0)
    assert plog is not None
    try:
        await client.start()
        await replicator.start()
        async with BrokerClient(request_timeout=5.0) as producer:
            murl = cluster.url(master)
            await producer.produce(murl, TOPIC, 0, fmt.encode_batch([b"one"] * 10))
            await wait_until(lambda: plog.max_offset == 10, 30, "the first batch (its hook raises)")
            await producer.produce(murl, TOPIC, 0, fmt.encode_batch([b"two"] * 10))
            await wait_until(lambda: plog.max_offset == 20, 30, "the restarted loop copies on")
            assert replicator.loop_restarts == 1
            assert "RuntimeError: append hook failed" in str(replicator.status()["last_error"])

            replicator._tasks["fetch"].cancel()  # a stray cancellation, not stop()
            await wait_until(lambda: replicator.loop_restarts == 2, 30, "the cancelled loop counted")
            assert "fetch loop ended: cancelled" in str(replicator.status()["last_error"])
            await producer.produce(murl, TOPIC, 0, fmt.encode_batch([b"three"] * 10))
            await wait_until(lambda: plog.max_offset == 30, 30, "the loop copies on after the cancellation")
        assert replicator.status()["loop_restarts"] == 2
    finally:
        await replicator.stop()
        await client.close()
        storage.close()
        cluster.stop()
