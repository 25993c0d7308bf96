"""A fetch answer's stored bytes sent from the segment files by the kernel (sendfile, issue 34).

The answer's head (HTTP headers, the framed fetch header) goes through the transport as any
answer's; once the transport has flushed it, every pinned range (:class:`PinnedRanges`: dups of the
segments' fds, taken with no await since the plan) is handed to ``os.sendfile`` on a dup of the
connection's socket, from the event loop thread, waiting for the socket to take more with the
loop's writer callback. The broker then neither reads the records into a buffer nor copies them
into the socket: at 1 KiB records that was most of a broker's CPU per fetch.

Where the bytes must pass through Python the copy path stays (:meth:`FetchPlanner.read`): a TLS
connection (the transport encrypts in user space) and a signed replica answer (the signature is
over the bytes). :func:`can_sendfile` decides it from the connection's transport, which is fixed for
the connection's life.

Correctness: retention, a repair and a close only close the log's own fds, so a dup still reads the
planned bytes. A truncation rewrites a file in place: before each ``sendfile`` the sender checks the
log's count of cuts, and a cut since the pin ends the answer by closing the connection (the
consumer gets a short answer and fetches again), so no byte read after a cut is sent.
Truncations and sends both run on the event loop thread, so that check is exact at each call.
"""

from __future__ import annotations

import asyncio
import os

import structlog
from aiohttp.abc import AbstractStreamWriter

from mqd.broker.segment_reads import PinnedRanges
from mqd.broker.storage import PartitionLog

log = structlog.get_logger(__name__)


class _Abandoned(Exception):
    """The answer cannot go on (its log was cut, a file holds less than planned)."""


def can_sendfile(transport: asyncio.BaseTransport) -> bool:
    """A plain TCP connection: its socket can take file pages from the kernel."""
    if not hasattr(os, "sendfile"):
        return False
    if (
        transport.get_extra_info("sslcontext") is not None
        or transport.get_extra_info("ssl_object") is not None
    ):
        return False
    sock = transport.get_extra_info("socket")
    return sock is not None and sock.fileno() >= 0


async def send_pinned(
    transport: asyncio.Transport, writer: AbstractStreamWriter, parts: list[tuple[PartitionLog, PinnedRanges]]
) -> None:
    """Send every pinned range, in order, after what the transport holds; ConnectionResetError
    when the peer is gone or the answer had to be cut short (the connection is then closed)."""
    await _flushed(transport, writer)
    # a dup: the loop refuses a writer callback on a transport's own fd
    sock_fd = os.dup(transport.get_extra_info("socket").fileno())
    try:
        loop = asyncio.get_running_loop()
        for plog, pinned in parts:
            for fd, pos, length in pinned.ranges:
                await _send_range(loop, sock_fd, plog, pinned, fd, pos, length)
    except _Abandoned as exc:
        log.warning("fetch answer cut short", topic=plog.topic, partition=plog.partition, reason=str(exc))
        transport.abort()
        raise ConnectionResetError(str(exc)) from None
    except OSError as exc:
        transport.abort()
        raise ConnectionResetError(f"sending a fetch answer: {exc}") from exc
    finally:
        os.close(sock_fd)


async def _flushed(transport: asyncio.Transport, writer: AbstractStreamWriter) -> None:
    """Wait until the transport has handed all it holds to the socket (the head must go first)."""
    while transport.get_write_buffer_size():
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0)  # pauses the protocol until the buffer is empty
        try:
            await writer.drain()
        finally:
            transport.set_write_buffer_limits(high=high, low=low)
        if transport.is_closing():
            raise ConnectionResetError("the connection closed")


async def _send_range(
    loop: asyncio.AbstractEventLoop,
    sock_fd: int,
    plog: PartitionLog,
    pinned: PinnedRanges,
    fd: int,
    pos: int,
    length: int,
) -> None:
    while length:
        if plog.cuts != pinned.cuts:
            raise _Abandoned("the log was truncated while the answer was being sent")
        try:
            sent = os.sendfile(sock_fd, fd, pos, length)
        except BlockingIOError:
            await _writable(loop, sock_fd)
            continue
        if sent == 0:
            raise _Abandoned(f"short read at {pos} (file changed underneath)")
        pos += sent
        length -= sent


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, _wake, ready)
    try:
        await ready
    finally:
        loop.remove_writer(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
