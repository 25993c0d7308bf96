"""Bounded request handling on a real broker process: a stalled body is cut with 408, fetches held
over ``limits.max_long_polls`` get 429 with Retry-After, and a request line over 8 KiB gets a 4xx
with a reason and no traceback in the node's log (counted in /v1/stats, one warning at most)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from support.harness import Cluster

from mqd.sources.mqd_broker.source import source_error
from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.protocol import BATCH_CONTENT_TYPE, FetchAnswer

BODY_TIMEOUT_MS = 1000
MAX_LONG_POLLS = 3
LONG_WAIT_MS = 10_000


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: Callable[..., Cluster]) -> Cluster:
    return module_cluster_factory(
        topics={"events": 2},
        node_settings={"limits": {"body_timeout_ms": BODY_TIMEOUT_MS, "max_long_polls": MAX_LONG_POLLS}},
    )


async def _stalled_request(
    host: str, port: int, path: str, ctype: str = "application/json"
) -> tuple[bytes, float]:
    """Send headers declaring a 100 KB body and one byte of it; ``(everything the node answered
    until it closed the connection, seconds that took)``. Bounded: 15 s at most."""
    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
            "Content-Length: 100000\r\n\r\n{".encode()
        )
        await writer.drain()
        async with asyncio.timeout(15):
            answer = await reader.read()  # until the node closes the connection
        return answer, time.monotonic() - started
    finally:
        writer.close()


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def test_stalled_bodies_are_cut_with_408_within_the_bound(cluster: Cluster) -> None:
    """20 connections that send one byte of a declared 100 KB body (fetch, produce, heartbeat,
    offsets) each get a 408 body_timeout and are closed by the node within body_timeout_ms plus a
    margin, instead of staying open (today: open until the client gives up); one answered early
    (415, body never read) is closed within the same bound."""
    url = cluster.url(cluster.master())
    host, port = _host_port(url)
    paths = [
        ("/v1/fetch", "application/json"),
        ("/v1/produce/events/0", BATCH_CONTENT_TYPE),
        ("/v1/groups/g/heartbeat", "application/json"),
        ("/v1/offsets", "application/json"),
    ] * 5
    results = await asyncio.gather(*(_stalled_request(host, port, p, c) for p, c in paths))
    bound = BODY_TIMEOUT_MS / 1000 + 3
    for answer, took in results:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body_timeout" in answer
        assert BODY_TIMEOUT_MS / 1000 * 0.9 <= took < bound, took
    answer, took = await _stalled_request(host, port, "/v1/produce/events/0", "text/plain")
    assert answer.startswith(b"HTTP/1.1 415") and took < bound, (answer[:200], took)
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/stats") as resp:
        stats = await resp.json()
    assert stats["rejected"]["408"] >= len(paths)
    log = cluster.log(cluster.master())
    assert "Traceback" not in log
    # 20 answers in about a second: one warning line (a second only if the run spanned 10 s)
    assert 1 <= log.count("request rejected") <= 2, log[-3000:]


def _held_fetch(client: BrokerClient, url: str, client_id: str, offset: int) -> asyncio.Task[FetchAnswer]:
    return asyncio.create_task(
        client.fetch(
            url,
            [{"topic": "events", "partition": 1, "offset": offset}],
            client_id=client_id,
            max_wait_ms=LONG_WAIT_MS,
        )
    )


async def _end(client: BrokerClient, url: str) -> int:
    r = await client.list_offsets(url, [{"topic": "events", "partition": 1, "spec": "latest"}])
    return int(r[0]["offset"])


async def _fetch_raw(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> aiohttp.ClientResponse:
    async with session.post(url + "/v1/fetch", json=body) as resp:
        await resp.read()
        return resp


async def test_long_polls_over_the_cap_get_429_with_retry_after(
    cluster: Cluster, client: BrokerClient
) -> None:
    """With max_long_polls=3 and three fetches held, a fourth that would be held gets 429
    too_many_long_polls with Retry-After (retriable for the consumer, not a node failure), a fetch
    that can answer at once is still served, and once the held ones end a new one is held again."""
    url = cluster.url(cluster.master())
    end = await _end(client, url)
    held = [_held_fetch(client, url, f"held-{i}", end) for i in range(MAX_LONG_POLLS)]
    try:
        async with asyncio.timeout(10):
            while (await client.stats(url))["long_polls_held"] < MAX_LONG_POLLS:
                await asyncio.sleep(0.01)
        partitions: list[dict[str, Any]] = [{"topic": "events", "partition": 1, "offset": end}]
        wanted = {"partitions": partitions, "max_wait_ms": 5000}
        async with aiohttp.ClientSession() as s:
            resp = await _fetch_raw(s, url, wanted)
            assert resp.status == 429
            assert resp.headers["Retry-After"] == "1"
            # max_wait_ms 0 is never held: answered at once
            assert (await _fetch_raw(s, url, {**wanted, "max_wait_ms": 0})).status == 200
        with pytest.raises(BrokerError) as caught:
            await client.fetch(url, partitions, max_wait_ms=5000)
        assert caught.value.status == 429 and caught.value.code == "too_many_long_polls"
        err = source_error(caught.value)
        assert err.retriable and not err.node_down and err.kind == "http_429"
        # a produce wakes the held fetches, which frees their places
        await client.produce(url, "events", 1, fmt.encode_batch([b"wake"]))
        async with asyncio.timeout(10):
            answers = await asyncio.gather(*held)
        assert all(a.partitions[0].data for a in answers)
        async with asyncio.timeout(10):
            while (await client.stats(url))["long_polls_held"] > 0:
                await asyncio.sleep(0.01)
        again = _held_fetch(client, url, "again", end + 1)
        async with asyncio.timeout(10):
            while (await client.stats(url))["long_polls_held"] < 1:
                assert not again.done(), again
                await asyncio.sleep(0.01)
        await client.produce(url, "events", 1, fmt.encode_batch([b"again"]))
        async with asyncio.timeout(10):
            assert (await again).partitions[0].data
    finally:
        for t in held:
            t.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def test_a_request_line_over_8k_gets_400_with_a_reason_and_no_traceback(cluster: Cluster) -> None:
    """50 requests whose URL is 9 KiB each get a 400 naming the cause, and the node's log holds no
    traceback and at most two warning lines for them; /v1/stats counts every one."""
    url = cluster.url(cluster.master())
    host, port = _host_port(url)
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/stats") as resp:
        before = (await resp.json())["rejected"].get("400", 0)
    log_before = cluster.log(cluster.master())
    for _ in range(50):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(f"GET /v1/metadata?x={'a' * 9216} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            await writer.drain()
            async with asyncio.timeout(10):
                answer = await reader.read()
        finally:
            writer.close()
        assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")), answer[:200]
        assert b"Got more than 8190 bytes when reading" in answer, answer[:400]
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/stats") as resp:
        assert (await resp.json())["rejected"]["400"] >= before + 50
    new = cluster.log(cluster.master())[len(log_before) :]
    assert "Traceback" not in new and "Error handling request" not in new, new[-3000:]
    assert new.count("request rejected") <= 2, new[-3000:]


async def test_memory_is_given_back_after_a_burst_of_held_fetches(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """After 300 fetches held at once end, the node holds none of them (long_polls_held back to 0)
    and gives memory back once: it collects the burst's garbage, trims the C heap and logs its RSS
    before and after (before: trimmed silently, with the burst's cyclic garbage still uncollected)."""
    node = cluster_factory(topics={"events": 1}, node_settings={"limits": {"max_long_polls": 500}})
    url = node.url(node.master())
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    body = {"partitions": [{"topic": "events", "partition": 0, "offset": 0}], "max_wait_ms": 2000}
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as s:

        async def held() -> int:
            async with s.post(url + "/v1/fetch", json=body) as resp:
                await resp.read()
                return resp.status

        statuses = await asyncio.gather(*(held() for _ in range(300)))
        assert set(statuses) == {200}
        async with s.get(url + "/v1/stats") as resp:
            assert (await resp.json())["long_polls_held"] == 0

    def trimmed() -> str | None:
        lines = [line for line in node.log(node.master()).splitlines() if "memory given back" in line]
        return lines[0] if lines else None

    line = await wait_until(trimmed, timeout=30, what="the node to trim its heap")
    entry = json.loads(line)
    assert entry["rss_mib_before"] > 0 and entry["rss_mib_after"] > 0, entry
