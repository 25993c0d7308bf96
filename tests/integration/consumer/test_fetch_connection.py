"""Fetch answers read straight into their buffer (mqd.wire.fetch_connection, issue 16), against real
broker nodes: large answers arrive intact, one connection per node is reused, a node restarted
under an idle connection is reached again, error answers keep their code, a cancelled long poll
closes its connection (and the broker stops holding it), and answers this client cannot frame are
refused as transport errors, never misread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.consumer import master_url, produce, stats
from support.harness import records_of

from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.protocol import FetchAnswer


def fetched(answer: FetchAnswer) -> list[tuple[int, bytes]]:
    got: list[tuple[int, bytes]] = records_of(answer.partitions[0].data, start_offset=0)
    return got


async def test_large_answer_arrives_intact_over_one_kept_connection(cluster_factory: Any) -> None:
    """An answer of several MiB (many socket reads) holds every record in order, and three fetches
    in a row to a node use one connection (the same transport)."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    url = master_url(cluster, 0)
    values = [i.to_bytes(4, "big") * 256 for i in range(6000)]  # 1 KiB each, ~6 MiB in all
    async with BrokerClient(request_timeout=10) as client:
        for lo in range(0, len(values), 500):
            await produce(client, cluster, 0, values[lo : lo + 500])
        transports = []
        for _ in range(3):
            answer = await client.fetch(
                url,
                [{"topic": "events", "partition": 0, "offset": 0, "max_bytes": 16 << 20}],
                max_bytes=16 << 20,
            )
            assert fetched(answer) == list(enumerate(values))
            transports.append(client._fetches._idle[next(iter(client._fetches._idle))][0].transport)  # type: ignore[union-attr]
        assert transports[0] is transports[1] is transports[2]


async def test_node_restarted_under_an_idle_connection_is_reached_again(cluster_factory: Any) -> None:
    """The broker closes the kept connection (here: it restarts); the next fetch opens a new one
    and gets its answer, no error reaches the caller."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    node = cluster.master(0)
    async with BrokerClient(request_timeout=10) as client:
        await produce(client, cluster, 0, [b"a", b"b"])
        request = [{"topic": "events", "partition": 0, "offset": 0}]
        assert [v for _, v in fetched(await client.fetch(master_url(cluster, 0), request))] == [b"a", b"b"]
        cluster.restart(node)
        answer = await client.fetch(master_url(cluster, 0), request)
        assert [v for _, v in fetched(answer)] == [b"a", b"b"]


async def test_error_answer_keeps_its_status_and_code_and_the_connection(cluster_factory: Any) -> None:
    """A 400 from the broker is a BrokerError with the broker's status, code and reason, not
    retriable; the same connection then serves the next fetch."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    url = master_url(cluster, 0)
    async with BrokerClient(request_timeout=10) as client:
        await produce(client, cluster, 0, [b"x"])
        with pytest.raises(BrokerError) as err:
            await client.fetch(url, [{"topic": "events", "partition": 0, "offset": -1}])
        assert err.value.status == 400 and err.value.code == "bad_request"
        assert not err.value.retriable and "offset" in str(err.value)
        answer = await client.fetch(url, [{"topic": "events", "partition": 0, "offset": 0}])
        assert [v for _, v in fetched(answer)] == [b"x"]


async def test_cancelled_long_poll_closes_its_connection(cluster_factory: Any) -> None:
    """A fetch held by the broker (nothing to answer) and cancelled by the caller closes its
    connection: the broker stops holding it, and the next fetch works on a new connection."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    node, url = cluster.master(0), master_url(cluster, 0)
    async with BrokerClient(request_timeout=10) as client:
        held = asyncio.ensure_future(
            client.fetch(
                url, [{"topic": "events", "partition": 0, "offset": 0}], client_id="h8", max_wait_ms=20_000
            )
        )
        await wait_until(lambda: stats(cluster, node)["inflight_fetch"].get("h8", 0) == 1, 10.0, what="held")
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
        await wait_until(
            lambda: stats(cluster, node)["inflight_fetch"].get("h8", 0) == 0, 10.0, what="released"
        )
        await produce(client, cluster, 0, [b"after"])
        answer = await client.fetch(url, [{"topic": "events", "partition": 0, "offset": 0}])
        assert [v for _, v in fetched(answer)] == [b"after"]


@contextlib.asynccontextmanager
async def answering(raw: bytes) -> AsyncIterator[str]:
    """A socket on 127.0.0.1 that answers every request with ``raw`` and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-mqd-fetch\r\n"


@pytest.mark.parametrize(
    "raw",
    [
        OK + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        OK + b"\r\nMQF1",
        OK + b"Content-Length: 100\r\n\r\nMQF1",
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ],
    ids=["chunked", "no-length", "cut-short", "not-http"],
)
async def test_answer_it_cannot_frame_is_a_transport_error(raw: bytes) -> None:
    """Chunked, unsized, truncated or non-HTTP answers raise a retriable BrokerError without a
    status (the node is treated as failing), never a misread answer."""
    async with answering(raw) as url, BrokerClient(request_timeout=5) as client:
        with pytest.raises(BrokerError) as err:
            await client.fetch(url, [{"topic": "events", "partition": 0, "offset": 0}])
        assert err.value.status is None and err.value.retriable
