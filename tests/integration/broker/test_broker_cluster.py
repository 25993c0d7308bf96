"""Master/slave behaviour on real processes: master down, acks=all, slave suggestion, and a
kill -9 in the middle of writes."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import pytest
from support.harness import records_of

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError


async def _latest(client: BrokerClient, url: str, partition: int = 0) -> int:
    r = await client.list_offsets(url, [{"topic": "events", "partition": partition, "spec": "latest"}])
    return int(r[0]["offset"])


async def _until(what: str, check: Any, timeout: float = 10.0) -> Any:
    """Await ``check()`` until truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def _read_all(client: BrokerClient, url: str, partition: int, end: int) -> list[tuple[int, bytes]]:
    """Every record of the partition from 0 to ``end``, fetched in pieces."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while offset < end:
        answer = await client.fetch(
            url,
            [{"topic": "events", "partition": partition, "offset": offset, "max_bytes": 64 * 1024}],
            max_wait_ms=0,
        )
        p = answer.partitions[0]
        assert p.status == "FOUND", p
        out.extend(records_of(p.data, offset))
        offset = p.next_offset
    return out


async def _alive(client: BrokerClient, url: str, node: str) -> bool:
    meta = await client.metadata(url)
    return bool(next(n["alive"] for g in meta["groups"] for n in g["nodes"] if n["id"] == node))


async def test_master_down(cluster_factory: Any, client: BrokerClient) -> None:
    """With the master killed, metadata on the slave reports it down, produce through the slave fails
    with 503 master_unavailable, and the slave keeps serving every replicated record. After a
    restart the master is reported alive again and takes writes."""
    cluster = cluster_factory(topics={"events": 2}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    for i in range(5):
        await client.produce(murl, "events", 0, fmt.encode_batch([b"v%d" % i]))
    await _until("slave catch-up", lambda: _latest_is(client, surl, 5))
    await asyncio.to_thread(cluster.kill, master)
    await _until("master reported down", lambda: _not(_alive(client, surl, master)))
    with pytest.raises(BrokerError) as err:
        await client.produce(surl, "events", 0, fmt.encode_batch([b"lost"]))
    assert err.value.status == 503 and err.value.code == "master_unavailable"
    assert master in err.value.body["reason"] and err.value.body["master"] == master
    with pytest.raises(BrokerError) as err:
        await client.produce(murl, "events", 0, fmt.encode_batch([b"lost"]))
    assert err.value.status is None and err.value.retriable  # nobody answers
    assert await _read_all(client, surl, 0, 5) == [(i, b"v%d" % i) for i in range(5)]
    answer = await client.fetch(surl, [{"topic": "events", "partition": 0, "offset": 5}], max_wait_ms=0)
    assert answer.partitions[0].suggest is None  # never sends a consumer to a dead master

    await asyncio.to_thread(cluster.start_node, master)
    await _until("master reported alive", lambda: _alive(client, surl, master))
    r = await client.produce(murl, "events", 0, fmt.encode_batch([b"back"]))
    assert r.base_offset == 5


async def _latest_is(client: BrokerClient, url: str, offset: int) -> bool:
    return await _latest(client, url) == offset


async def _not(aw: Any) -> bool:
    return not await aw


async def test_acks_all_waits_for_the_slave(cluster_factory: Any, client: BrokerClient) -> None:
    """acks=all answers only once the slave holds the batch; a frozen slave makes it time out with
    504 (the records stay written); a slave reported down is not waited for."""
    cluster = cluster_factory(
        topics={"events": 1},
        slaves=1,
        node_settings={"acks_all_timeout_ms": 400, "liveness_timeout_ms": 3000},
    )
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    for i in range(3):
        r = await client.produce(murl, "events", 0, fmt.encode_batch([b"a%d" % i, b"b%d" % i]), acks="all")
        assert await _latest(client, surl) == r.last_offset + 1  # on the slave before the ack
    cluster.send_signal(slave, signal.SIGSTOP)
    try:
        with pytest.raises(BrokerError) as err:
            await client.produce(murl, "events", 0, fmt.encode_batch([b"slow"]), acks="all")
        assert err.value.status == 504 and err.value.code == "replication_timeout"
        assert err.value.body["last_offset"] == 6
        assert await _latest(client, murl) == 7  # written on the master all the same
        await _until("frozen slave reported down", lambda: _not(_alive(client, murl, slave)))
        r = await client.produce(murl, "events", 0, fmt.encode_batch([b"alone"]), acks="all")
        assert r.base_offset == 7
    finally:
        cluster.send_signal(slave, signal.SIGCONT)
    await _until("slave catch-up after thaw", lambda: _latest_is(client, surl, 8))


async def test_slave_suggestion(cluster_factory: Any, client: BrokerClient) -> None:
    """A master sends a consumer that is far behind (bytes) to a caught-up slave; the slave sends a
    consumer near the head, or at an offset it cannot judge, back to the master; a master never
    suggests for a caught-up consumer."""
    cluster = cluster_factory(topics={"events": 1}, slaves=1, node_settings={"slave_suggest_lag_bytes": 8192})
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    for i in range(30):
        await client.produce(murl, "events", 0, fmt.encode_batch([b"%03d" % i + b"x" * 1000]))
    await _until("slave catch-up", lambda: _latest_is(client, surl, 30))

    async def suggest(url: str, offset: int) -> str | None:
        answer = await client.fetch(
            url, [{"topic": "events", "partition": 0, "offset": offset, "max_bytes": 2048}], max_wait_ms=0
        )
        return answer.partitions[0].suggest

    # the master learns the slave's progress from its next replica fetch
    assert await _until("master suggests the slave", lambda: _eq(suggest(murl, 0), slave)) == slave
    assert await suggest(murl, 29) is None
    assert await suggest(surl, 0) is None  # far behind on the slave too: stay there
    assert await suggest(surl, 29) == master
    assert await suggest(surl, 30) == master  # caught up (OFFSET_OVERFLOW_ONE)
    assert await suggest(surl, 1000) == master  # only the master can correct a bad offset


async def _eq(aw: Any, want: Any) -> Any:
    return want if await aw == want else None


async def test_kill9_during_writes_loses_no_acked_record(cluster_factory: Any, client: BrokerClient) -> None:
    """Producers run while the node gets SIGKILL; after a restart (with a torn half batch appended to
    the log as a crash in mid-write would leave it) every acked offset holds its exact value, offsets
    are dense, no torn batch is served, and new writes continue right after the last whole batch."""
    cluster = cluster_factory(topics={"events": 1}, node_settings={"storage": {"segment_bytes": 16384}})
    node = cluster.master()
    url = cluster.url(node)
    acked: dict[int, bytes] = {}
    stop = asyncio.Event()

    async def producer(k: int) -> None:
        i = 0
        while not stop.is_set():
            values = [b"p%d-%d-%d" % (k, i, j) for j in range(5)]
            try:
                r = await client.produce(url, "events", 0, fmt.encode_batch(values))
            except BrokerError:
                return  # the node is gone
            acked.update(zip(range(r.base_offset, r.last_offset + 1), values, strict=True))
            i += 1

    tasks = [asyncio.create_task(producer(k)) for k in range(3)]
    await _until("enough acked writes", lambda: _true(len(acked) >= 1000))
    await asyncio.to_thread(cluster.kill, node, signal.SIGKILL)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)

    logs = sorted((cluster.nodes[node].data_dir / "logs" / "events-0").glob("*.log"))
    assert len(logs) > 1  # the writes crossed segments
    torn = fmt.encode_batch([b"torn" * 50])
    with open(logs[-1], "ab") as fh:
        fh.write(torn[: len(torn) // 2])

    await asyncio.to_thread(cluster.start_node, node)
    end = await _latest(client, url)
    assert end >= max(acked) + 1
    got = await _read_all(client, url, 0, end)
    assert [o for o, _ in got] == list(range(end))  # dense, and every batch passed its CRC
    stored = dict(got)
    assert all(stored[o] == v for o, v in acked.items())
    assert b"torn" * 50 not in stored.values()
    r = await client.produce(url, "events", 0, fmt.encode_batch([b"after"]))
    assert r.base_offset == end


async def _true(value: bool) -> bool:
    return value
