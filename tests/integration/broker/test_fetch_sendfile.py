"""A fetch answer's stored bytes sent from the segment files (mqd/broker/fetch_send.py, issue 34).

Real files, a real aiohttp server and sockets, on asyncio's loop and on uvloop (the broker's): the
bytes sent are the ones planned across segments, the socket's back-pressure included; and a
truncation while an answer is being sent ends that answer instead of sending what the cut wrote.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from aiohttp import web

from mqd.broker.fetch_send import can_sendfile, send_pinned
from mqd.broker.storage import PartitionLog, Storage
from mqd.config import StorageConfig
from mqd.wire import format as fmt

TOPIC = "events"
HEAD = b"head-bytes"
LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


def fill(plog: PartitionLog, batches: int, tag: int) -> None:
    for i in range(batches):
        batch = fmt.encode_batch([bytes([(tag + i + j) % 256]) * 1000 for j in range(16)])
        plog.append(batch, fmt.validate(batch))


def open_log(root: Path) -> tuple[Storage, PartitionLog]:
    storage = Storage(root, StorageConfig(segment_bytes=256 * 1024, fsync="never"))
    storage.open([(TOPIC, 0)])
    plog = storage.get(TOPIC, 0)
    assert plog is not None
    return storage, plog


async def serve(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


def answer_handler(plog: PartitionLog, max_bytes: int, sending: asyncio.Event | None = None) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None and can_sendfile(transport)
        if sending is not None:  # small kernel buffers: the send waits on the socket again and again
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        plan = plog.plan_read(0, max_bytes)
        assert plan is not None and len(plan.ranges) > 1  # across segments
        pinned = plog.pin_read(plan)
        try:
            response = web.StreamResponse()
            response.content_length = len(HEAD) + pinned.size
            writer = await response.prepare(request)
            assert writer is not None
            await response.write(HEAD)
            if sending is not None:
                sending.set()
            await send_pinned(transport, writer, [(plog, pinned)])
            await response.write_eof()
        finally:
            pinned.close()
        return response

    return handler


def http_get(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock


def read_answer(sock: socket.socket, until: int | None = None) -> tuple[int, bytes]:
    """(Content-Length, the body bytes read until EOF or a reset, or the first ``until`` of them)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(v)
        for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
        if k.lower() == b"content-length"
    )
    chunks = [body]
    got = len(body)
    while until is None or got < until:
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return length, b"".join(chunks)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_bytes_sent_are_the_planned_ones(tmp_path: Path, loop: str) -> None:
    async def main() -> None:
        storage, plog = open_log(tmp_path)
        fill(plog, 300, tag=1)  # ~4.8 MB over ~19 segments
        expected = HEAD + plog.read(0, 64 << 20)
        runner, port = await serve(answer_handler(plog, 64 << 20))
        try:
            sock = http_get(port, rcvbuf=16384)  # the reader lags: the sender waits for the socket
            with sock:
                length, body = await asyncio.to_thread(read_answer, sock, len(expected))
            assert length == len(expected)
            assert body == expected
        finally:
            await runner.cleanup()
            storage.close()

    LOOPS[loop](main())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_cut_during_a_send_ends_the_answer(tmp_path: Path, loop: str) -> None:
    """The log is truncated and written again while the answer waits on the socket: the answer
    stops (the connection closes short), and what arrived is the bytes planned, none of the new."""

    async def main() -> None:
        storage, plog = open_log(tmp_path)
        fill(plog, 300, tag=1)
        before = HEAD + plog.read(0, 64 << 20)
        sending = asyncio.Event()
        runner, port = await serve(answer_handler(plog, 64 << 20, sending))
        try:
            sock = http_get(port, rcvbuf=4096)
            with sock:
                await asyncio.wait_for(sending.wait(), 30)
                # the reader has not read yet and the buffers are small: most of the answer waits
                plog.truncate_to(plog.max_offset - 16 * 150)
                fill(plog, 150, tag=99)  # the same size again, other bytes
                length, body = await asyncio.to_thread(read_answer, sock)
            assert length == len(before)
            assert len(body) < len(before) - 16 * 150 * 1000  # stopped before the cut
            assert body == before[: len(body)]
        finally:
            await runner.cleanup()
            storage.close()

    LOOPS[loop](main())
