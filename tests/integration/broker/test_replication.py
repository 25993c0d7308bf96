"""Slave replication (mqd/broker/replication.py).

End to end with real broker processes (tests/support/harness.py): a slave catches up with its master's log
and committed offsets, acks=all answers only once the slave holds the records, a killed master's
slave still serves everything acked, and replication resumes when the master comes back (a master
that lost a tail copies it back from the slave). Answer handling (corrupt data, divergence) is
tested directly on a Replicator over real storage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.harness import Cluster
from support.replica import replica_offsets

from mqd.broker.consumer_groups import ConsumerGroupStore
from mqd.broker.replica_auth import ReplicaAuth, ReplicaCredentials
from mqd.broker.replica_client import ReplicaClient
from mqd.broker.replica_floor import ReplicaFloor
from mqd.broker.replication import Replicator
from mqd.broker.storage import Storage
from mqd.config import BrokerGroupSpec, NodeSpec, StorageConfig
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.protocol import FetchAnswer, PartitionFetch, Status

T = TypeVar("T")
TOPIC = "events"


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = 15.0) -> T:
    """Poll an async condition until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except BrokerError as exc:
            last = exc
        if last:
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def make_batch(count: int, tag: int) -> bytes:
    return fmt.encode_batch([b"v-%d-%d" % (tag, i) for i in range(count)], timestamps=[1_000 + tag] * count)


def stored(batch: bytes, base_offset: int) -> bytes:
    buf = bytearray(batch)
    fmt.set_base_offset(buf, 0, base_offset)
    return bytes(buf)


async def read_all(client: BrokerClient, url: str, partition: int = 0) -> bytes:
    """Everything a node serves for a partition from offset 0, in stored form."""
    out = b""
    while True:
        offset = fmt.scan(out)[-1].next_offset if out else 0
        answer = await client.fetch(
            url,
            [{"topic": TOPIC, "partition": partition, "offset": offset}],
            max_wait_ms=0,
            max_bytes=1 << 20,
        )
        p = answer.partitions[0]
        if p.status is not Status.FOUND or not p.data:
            return out
        out += bytes(p.data)


async def produce(
    client: BrokerClient, url: str, batches: list[bytes], partition: int = 0, acks: str = "all"
) -> bytes:
    """Produce each batch; returns the bytes the log holds for them."""
    expected = b""
    for b in batches:
        r = await client.produce(url, TOPIC, partition, b, acks=acks)
        expected += stored(b, r.base_offset)
    return expected


def one_group_cluster(factory: Callable[..., Cluster], **kw: Any) -> Cluster:
    return factory(topics={TOPIC: 2}, groups=1, slaves=1, **kw)


# -- end to end -------------------------------------------------------------------------------------


async def test_slave_catches_up_with_log_and_committed_offsets(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """A slave started after the master took writes and commits copies the log byte for byte
    (both partitions, across the replica fetch size) and the committed offsets."""
    cluster = one_group_cluster(cluster_factory, start=False)
    master, slave = cluster.master(), cluster.slaves()[0]
    cluster.start_node(master)
    murl, surl = cluster.url(master), cluster.url(slave)
    p0 = await produce(client, murl, [make_batch(50, i) for i in range(40)], acks="master")
    p1 = await produce(client, murl, [make_batch(3, 100 + i) for i in range(5)], partition=1, acks="master")
    await client.commit(
        murl,
        "g1",
        "c1",
        [{"topic": TOPIC, "partition": 0, "offset": 1234}, {"topic": TOPIC, "partition": 1, "offset": 7}],
    )
    cluster.start_node(slave)

    async def caught_up() -> bool:
        return await read_all(client, surl, 0) == p0 and await read_all(client, surl, 1) == p1

    await eventually(caught_up, "slave log equal to the master's")
    assert await read_all(client, murl, 0) == p0

    async def offsets_pulled() -> dict[str, Any] | None:
        snap = await replica_offsets(cluster, master, slave)
        return snap if snap.get("g1") else None

    snap = await eventually(offsets_pulled, "committed offsets on the slave")
    assert snap["g1"] == [
        {"topic": TOPIC, "partition": 0, "offset": 1234},
        {"topic": TOPIC, "partition": 1, "offset": 7},
    ]
    # later commits follow within the pull interval
    await client.commit(murl, "g1", "c1", [{"topic": TOPIC, "partition": 0, "offset": 2000}])

    async def moved() -> bool:
        snap = await replica_offsets(cluster, master, slave)
        return any(e["offset"] == 2000 for e in snap.get("g1", []))

    await eventually(moved, "new commit on the slave")
    stats = await client.stats(surl)
    repl = stats["replication"]
    assert repl["master"] == master and repl["master_reachable"] is True
    assert {p["partition"]: p["lag"] for p in repl["partitions"]} == {0: 0, 1: 0}


async def test_acks_all_returns_after_slave_has_records(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """Right after an acks=all produce returns, the slave serves the records it acknowledged."""
    cluster = one_group_cluster(cluster_factory)
    murl, surl = cluster.url(cluster.master()), cluster.url(cluster.slaves()[0])
    for i in range(8):
        b = make_batch(1 + i, i)
        r = await client.produce(murl, TOPIC, 0, b, acks="all")
        answer = await client.fetch(
            surl, [{"topic": TOPIC, "partition": 0, "offset": r.base_offset}], max_wait_ms=0
        )
        p = answer.partitions[0]
        assert p.status is Status.FOUND, p
        assert bytes(p.data) == stored(b, r.base_offset)
        assert p.max_offset == r.last_offset + 1


async def test_master_killed_then_restarted(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """With the master SIGKILLed the slave still serves everything acked and refuses writes;
    once the master is back, the slave replicates new records again."""
    cluster = one_group_cluster(cluster_factory)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    acked = await produce(client, murl, [make_batch(20, i) for i in range(10)])
    cluster.kill(master)
    assert await read_all(client, surl) == acked
    with pytest.raises(BrokerError) as e:
        await client.produce(surl, TOPIC, 0, make_batch(1, 99))
    assert e.value.status == 421

    async def master_seen_down() -> bool:
        status = (await client.stats(surl))["replication"]
        return status["master_reachable"] is False and status["last_error"] is not None

    await eventually(master_seen_down, "slave noticing the master is gone")
    cluster.start_node(master)
    async with BrokerClient(request_timeout=10.0) as fresh:  # no pooled connection to the dead process
        more = await produce(fresh, murl, [make_batch(5, 50 + i) for i in range(3)])

        async def has_all() -> bool:
            return await read_all(fresh, surl) == acked + more

        await eventually(has_all, "slave replicating after the master restart")


async def test_master_that_lost_its_tail_gets_it_back_from_the_slave(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """A master restarted with a shorter log (its tail lost, as an OS crash before fsync leaves it)
    copies the acknowledged tail back from its slave before it takes writes (issue 12.2; it used to
    make the slave truncate); new writes follow the recovered records on both nodes."""
    cluster = one_group_cluster(cluster_factory)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    batches = [make_batch(4, i) for i in range(6)]
    acked = await produce(client, murl, batches)
    cluster.kill(master)
    seg = cluster.nodes[master].data_dir / "logs" / f"{TOPIC}-0" / f"{0:020d}.log"
    lost = len(batches[-1]) + len(batches[-2])
    with open(seg, "r+b") as fh:  # what an OS crash before fsync could leave behind
        fh.truncate(seg.stat().st_size - lost)
    cluster.start_node(master)
    async with BrokerClient(request_timeout=10.0) as fresh:  # no pooled connection to the dead process
        assert await read_all(fresh, murl) == acked
        more = await produce(fresh, murl, [make_batch(7, 70)])

        async def converged() -> bool:
            return await read_all(fresh, surl) == acked + more

        await eventually(converged, "slave holding the recovered log and the new batch")
        assert await read_all(fresh, murl) == acked + more


# -- answer handling on a Replicator over real storage ------------------------------------------------


class _Slave:
    """A Replicator wired to real storage and a real ConsumerGroupStore; answers are fed to it directly."""

    def __init__(self, root: Path) -> None:
        self.storage = Storage(root, StorageConfig(segment_bytes=4096, fsync="never"))
        self.storage.open([(TOPIC, 0)])
        self.appended: list[tuple[str, int]] = []
        group = BrokerGroupSpec(
            name="broker-a",
            nodes=[
                NodeSpec(id="m", url="http://127.0.0.1:9", role="master"),
                NodeSpec(id="s", url="http://127.0.0.1:10", role="slave"),
            ],
        )
        self.replicator = Replicator(
            node_id="s",
            broker_group=group,
            storage=self.storage,
            partitions=[(TOPIC, 0)],
            client=ReplicaClient(
                ReplicaAuth(ReplicaCredentials("c", "s", {"s": "0" * 64, "m": "1" * 64}), ["m"])
            ),
            consumer_groups=ConsumerGroupStore(root),
            floor=ReplicaFloor(root),
            on_append=self._on_append,
            wait_ms=10,
        )

    def _on_append(self, topic: str, partition: int) -> None:
        self.appended.append((topic, partition))

    @property
    def log(self) -> Any:
        return self.storage.get(TOPIC, 0)

    def feed(self, status: Status, data: bytes, master_min: int, master_max: int) -> None:
        p = PartitionFetch(TOPIC, 0, status, 0, master_min, master_max, None, memoryview(data))
        self.replicator._apply(FetchAnswer("m", [p], data), now=0.0)

    def close(self) -> None:
        self.storage.close()


@pytest.fixture
def slave(tmp_path: Path) -> Any:
    s = _Slave(tmp_path)
    yield s
    s.close()


def test_corrupt_answer_never_reaches_the_log(slave: _Slave) -> None:
    """A batch with a bad CRC or a torn end in a master answer is refused whole; the log is unchanged
    and the partition reports the error and backs off."""
    good = stored(make_batch(3, 1), 0)
    slave.feed(Status.FOUND, good, 0, 3)
    assert slave.log.max_offset == 3 and slave.appended == [(TOPIC, 0)]
    nxt = bytearray(stored(make_batch(2, 2), 3) + stored(make_batch(2, 3), 5))
    nxt[-5] ^= 0xFF  # the second batch's CRC fails
    slave.feed(Status.FOUND, bytes(nxt), 0, 7)
    torn = stored(make_batch(2, 2), 3)[:-8]
    slave.feed(Status.FOUND, torn, 0, 7)
    assert slave.log.max_offset == 3
    assert slave.log.read(0, 10**6) == good
    status = slave.replicator.status()
    assert "truncated batch" in status["partitions"][0]["error"]
    assert status["partitions"][0]["lag"] == 4
    assert slave.appended == [(TOPIC, 0)]
    slave.feed(Status.FOUND, stored(make_batch(2, 2), 3), 0, 5)  # a good answer clears the error
    assert slave.log.max_offset == 5
    assert slave.replicator.status()["partitions"][0]["error"] is None


def test_divergence_and_master_log_moves(slave: _Slave) -> None:
    """Ahead of the master -> truncate to its log end; a master batch starting before our log end ->
    truncate to it and append; master's log start past our end -> restart the log there."""
    a, b = stored(make_batch(4, 1), 0), stored(make_batch(4, 2), 4)
    slave.feed(Status.FOUND, a + b, 0, 8)
    assert slave.log.max_offset == 8
    slave.feed(Status.OFFSET_OVERFLOW_BADLY, b"", 0, 4)  # master restarted with only 0..3
    assert slave.log.max_offset == 4 and slave.log.read(0, 10**6) == a
    c = stored(make_batch(6, 3), 2)  # a master batch 2..7 where we hold 0..3: diverged at 2
    slave.feed(Status.FOUND, c, 0, 8)
    assert slave.log.max_offset == 0  # our batch 0..3 holds offset 2: cut, and ask again
    slave.feed(Status.FOUND, a, 0, 8)
    assert slave.log.read(0, 10**6) == a
    slave.feed(Status.OFFSET_TOO_SMALL, b"", 100, 120)
    assert (slave.log.min_offset, slave.log.max_offset) == (100, 100)
    d = stored(make_batch(5, 4), 100)
    slave.feed(Status.FOUND, d, 100, 120)
    assert slave.log.read(100, 10**6) == d
    slave.feed(Status.NOT_SERVED, b"", 0, 0)
    assert slave.replicator.status()["partitions"][0]["error"] is not None
    assert slave.log.max_offset == 105
