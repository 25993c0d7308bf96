"""Answers read straight into their buffer (mqd.wire.http_connections, issues 16 and 34), against real
broker nodes: large answers arrive intact, one connection per node is reused, a node restarted
under an idle connection is reached again, error answers keep their code, a cancelled long poll
closes its connection (and the broker stops holding it), and answers this client cannot frame are
refused as transport errors, never misread. Against small servers of its own: a request on a kept
connection that drops is sent again only when it is idempotent (never a produce), and connections to
one node stay within ``limit_per_host``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
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
            transports.append(client._http._idle[next(iter(client._http._idle))][0].transport)  # type: ignore[union-attr]
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


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """A server on 127.0.0.1 that runs ``handler`` on each connection; its URL."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def answering(raw: bytes) -> AsyncIterator[str]:
    """A socket on 127.0.0.1 that answers every request with ``raw`` and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw)
        await writer.drain()
        writer.close()

    async with serving(serve) as url:
        yield url


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


class KeptAliveServer:
    """An HTTP/1.1 server on 127.0.0.1 that keeps connections open and answers each request with
    a JSON body. ``drop_second``: the first connection's second request is read and the connection
    closed without an answer (a broker gone between two requests on a kept connection).
    ``hold``: answers wait for it to be set. Records every request line and connection count."""

    ANSWER = json.dumps(
        {"topic": "events", "partition": 0, "base_offset": 0, "last_offset": 0, "count": 1, "max_offset": 0}
    ).encode()

    def __init__(self, *, drop_second: bool = False, hold: asyncio.Event | None = None) -> None:
        self.drop_second = drop_second
        self.hold = hold
        self.requests: list[bytes] = []
        self.connections = 0
        self.open = 0
        self.most_open = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            for n in itertools.count(1):
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests.append(head.split(b"\r\n")[0])
                if self.drop_second and number == 1 and n == 2:
                    return
                if self.hold is not None:
                    await self.hold.wait()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + b"Content-Length: %d\r\n\r\n" % len(self.ANSWER)
                    + self.ANSWER
                )
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()


async def test_a_produce_is_not_sent_again_when_its_kept_connection_drops() -> None:
    """A produce whose kept connection closes before any answer byte raises a BrokerError: it is
    not sent again on a new connection, since the broker may have appended it (the producer
    decides). The broker saw it once."""
    server = KeptAliveServer(drop_second=True)
    async with serving(server.serve) as url, BrokerClient(request_timeout=5) as client:
        await client.produce(url, "events", 0, b"batch-1")
        with pytest.raises(BrokerError) as err:
            await client.produce(url, "events", 0, b"batch-2")
        assert err.value.retriable and err.value.status is None
    assert server.requests == [b"POST /v1/produce/events/0?acks=master HTTP/1.1"] * 2
    assert server.connections == 1


async def test_an_idempotent_request_is_sent_once_more_on_a_new_connection() -> None:
    """A heartbeat (or fetch, commit, GET) whose kept connection closes before any answer byte is
    sent once more on a new connection, and its answer reaches the caller."""
    server = KeptAliveServer(drop_second=True)
    async with serving(server.serve) as url, BrokerClient(request_timeout=5) as client:
        await client.heartbeat(url, "g", "c1", ["events"], 5000)
        assert (await client.heartbeat(url, "g", "c1", ["events"], 5000))["topic"] == "events"
    assert server.requests == [b"POST /v1/groups/g/heartbeat HTTP/1.1"] * 3
    assert server.connections == 2


async def test_connections_to_one_node_stay_within_the_limit() -> None:
    """Five requests at once with ``limit_per_host`` 2: two connections open, the other requests
    wait for one of them and reuse it; every request is answered."""
    hold = asyncio.Event()
    server = KeptAliveServer(hold=hold)
    async with serving(server.serve) as url, BrokerClient(request_timeout=10, limit_per_host=2) as client:
        calls = [asyncio.create_task(client.health(url, timeout=10)) for _ in range(5)]
        await wait_until(lambda: len(server.requests) == 2, 5.0, what="two requests held")
        hold.set()
        answers = await asyncio.gather(*calls)
    assert len(answers) == 5 and len(server.requests) == 5
    assert server.connections == 2 and server.most_open == 2
