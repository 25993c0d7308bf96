"""Long polling: a held fetch is answered by the append that gives it data, not by a timer tick."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.harness import Cluster, records_of

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.protocol import FetchAnswer

LONG_WAIT_MS = 10_000  # far longer than any wake-up may take: an answer before it is not a tick


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: Callable[..., Cluster]) -> Cluster:
    return module_cluster_factory(topics={"events": 4}, groups=1, slaves=1)


async def _wait_held(client: BrokerClient, url: str, client_id: str, n: int = 1) -> None:
    """Until the node reports ``n`` fetches of ``client_id`` in flight (bounded)."""
    deadline = time.monotonic() + 10
    while (await client.stats(url))["inflight_fetch"].get(client_id, 0) < n:
        assert time.monotonic() < deadline, "fetch never got held"
        await asyncio.sleep(0.01)


async def _end(client: BrokerClient, url: str, partition: int) -> int:
    r = await client.list_offsets(url, [{"topic": "events", "partition": partition, "spec": "latest"}])
    return int(r[0]["offset"])


def _fetch(
    client: BrokerClient, url: str, client_id: str, parts: list[tuple[int, int]], **kw: Any
) -> asyncio.Task[FetchAnswer]:
    return asyncio.create_task(
        client.fetch(
            url,
            [{"topic": "events", "partition": p, "offset": o} for p, o in parts],
            client_id=client_id,
            max_wait_ms=kw.pop("max_wait_ms", LONG_WAIT_MS),
            **kw,
        )
    )


async def test_produce_wakes_a_held_fetch_at_once(cluster: Cluster, client: BrokerClient) -> None:
    """A fetch held at the log end (10 s max wait) is answered right after the produce is acked,
    with the new record, long before max_wait: the produce itself wakes it."""
    url = cluster.url(cluster.master())
    end = await _end(client, url, 0)
    task = _fetch(client, url, "wake", [(0, end), (1, await _end(client, url, 1))])
    await _wait_held(client, url, "wake")
    started = time.monotonic()
    r = await client.produce(url, "events", 0, fmt.encode_batch([b"hello"]))
    acked = time.monotonic()
    answer = await asyncio.wait_for(task, LONG_WAIT_MS / 1000)
    answered = time.monotonic()
    p0 = answer.partitions[0]
    assert p0.status == "FOUND" and records_of(p0.data, end) == [(r.base_offset, b"hello")]
    assert p0.next_offset == r.last_offset + 1
    assert answer.partitions[1].status in ("OFFSET_OVERFLOW_ONE", "NO_MESSAGE_IN_QUEUE")
    # the whole exchange took a small fraction of max_wait: woken by the append, not timed out
    assert answered - started < LONG_WAIT_MS / 1000 / 4, (acked - started, answered - acked)


async def test_append_to_another_partition_does_not_answer(cluster: Cluster, client: BrokerClient) -> None:
    """Only appends to a requested partition wake a fetch; it stays held otherwise."""
    url = cluster.url(cluster.master())
    end2 = await _end(client, url, 2)
    task = _fetch(client, url, "other", [(2, end2)])
    await _wait_held(client, url, "other")
    await client.produce(url, "events", 3, fmt.encode_batch([b"elsewhere"]))
    await asyncio.sleep(0.2)  # give a wrong wake-up the chance to happen
    assert not task.done()
    assert (await client.stats(url))["inflight_fetch"].get("other") == 1
    r = await client.produce(url, "events", 2, fmt.encode_batch([b"mine"]))
    answer = await asyncio.wait_for(task, LONG_WAIT_MS / 1000)
    assert records_of(answer.partitions[0].data, end2) == [(r.base_offset, b"mine")]


async def test_min_bytes_holds_until_enough_data(cluster: Cluster, client: BrokerClient) -> None:
    """With min_bytes above one batch, the first small append does not answer; the next does."""
    url = cluster.url(cluster.master())
    end = await _end(client, url, 1)
    one = fmt.encode_batch([b"x" * 100])
    task = _fetch(client, url, "minb", [(1, end)], min_bytes=len(one) + 1)
    await _wait_held(client, url, "minb")
    await client.produce(url, "events", 1, one)
    await asyncio.sleep(0.2)
    assert not task.done()
    await client.produce(url, "events", 1, one)
    answer = await asyncio.wait_for(task, LONG_WAIT_MS / 1000)
    assert len(records_of(answer.partitions[0].data, end)) == 2


async def test_nothing_new_is_answered_after_max_wait(cluster: Cluster, client: BrokerClient) -> None:
    """Without appends the fetch is held for max_wait_ms and then answered OFFSET_OVERFLOW_ONE."""
    url = cluster.url(cluster.master())
    end = await _end(client, url, 3)
    started = time.monotonic()
    answer = await client.fetch(url, [{"topic": "events", "partition": 3, "offset": end}], max_wait_ms=300)
    assert time.monotonic() - started >= 0.29
    assert answer.partitions[0].status == "OFFSET_OVERFLOW_ONE"
    assert answer.partitions[0].next_offset == end


async def test_replication_wakes_a_fetch_held_on_a_slave(cluster: Cluster, client: BrokerClient) -> None:
    """A fetch held on a slave is answered when replication appends the produced batch there."""
    master, slave = cluster.url(cluster.master()), cluster.url(cluster.slaves()[0])
    end = await _end(client, master, 0)
    deadline = time.monotonic() + 10
    while await _end(client, slave, 0) != end:  # the slave has caught up before we wait on it
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    task = _fetch(client, slave, "slave-wake", [(0, end)])
    await _wait_held(client, slave, "slave-wake")
    started = time.monotonic()
    r = await client.produce(master, "events", 0, fmt.encode_batch([b"replicated"]))
    answer = await asyncio.wait_for(task, LONG_WAIT_MS / 1000)
    assert records_of(answer.partitions[0].data, end) == [(r.base_offset, b"replicated")]
    assert time.monotonic() - started < LONG_WAIT_MS / 1000 / 4


async def test_stopping_node_answers_held_fetches(cluster_factory: Any, client: BrokerClient) -> None:
    """SIGTERM answers held long polls at once (drain), and the node exits cleanly."""
    cluster = cluster_factory(topics={"events": 1})
    url = cluster.bootstrap
    task = _fetch(client, url, "drain", [(0, 0)])
    await _wait_held(client, url, "drain")
    started = time.monotonic()
    code = await asyncio.to_thread(cluster.kill, cluster.master(), signal.SIGTERM)
    answer = await asyncio.wait_for(task, LONG_WAIT_MS / 1000)
    assert answer.partitions[0].status == "NO_MESSAGE_IN_QUEUE"
    assert time.monotonic() - started < LONG_WAIT_MS / 1000 / 2
    assert code == 0


async def test_held_fetch_is_cancelled_when_its_client_disconnects(
    cluster: Cluster, client: BrokerClient
) -> None:
    """A client that drops its connection while its fetch is held stops counting as in flight at
    once (the handler is cancelled), not when the 10 s max wait runs out."""
    url = cluster.url(cluster.master())
    end = await _end(client, url, 1)
    body = (
        b'{"client_id": "gone", "max_wait_ms": %d, "partitions": '
        b'[{"topic": "events", "partition": 1, "offset": %d}]}' % (LONG_WAIT_MS, end)
    )
    host, port = url.removeprefix("http://").split(":")
    _reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    await writer.drain()
    await _wait_held(client, url, "gone")
    writer.close()
    await writer.wait_closed()
    deadline = time.monotonic() + LONG_WAIT_MS / 1000 / 2
    while (await client.stats(url))["inflight_fetch"].get("gone"):
        assert time.monotonic() < deadline, "the held fetch outlived its client"
        await asyncio.sleep(0.02)


def test_client_stats_of_idle_clients_are_dropped() -> None:
    """Per-client counters are bounded: a client idle past the limit with nothing in flight is
    dropped, an active one or one with a fetch held is kept."""
    from mqd.broker.client_stats import ClientStats

    stats = ClientStats(idle_s=600)
    stats.count("old", "fetch", now=0.0)
    stats.count("held", "fetch", now=0.0)
    stats.fetch_started("held")
    stats.count("new", "heartbeat", now=500.0)
    assert stats.prune(now=700.0) == 1
    view = stats.as_json("n")
    assert sorted(view["clients"]) == ["held", "new"]
    assert view["inflight_fetch"] == {"held": 1}
    stats.fetch_done("held")
    assert stats.as_json("n")["inflight_fetch"] == {}
    assert stats.prune(now=1200.0) == 2
    assert stats.as_json("n")["clients"] == {} and stats.as_json("n")["inflight_fetch_max_per_client"] == {}
