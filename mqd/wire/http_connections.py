"""HTTP/1.1 to the brokers: kept-alive connections per node, answers read straight into their buffer.

Every request of :class:`mqd.wire.client.BrokerClient` goes through here. The bulk of what a
consumer reads is fetch answers, tens of MiB per second per node. Through aiohttp every byte was
copied three times in user space before it was decoded (the event loop's read buffer into a
``bytes`` per read, the HTTP parser's body chunk, the chunk into the answer's buffer), which on 1 KiB
records was a third of the event loop's time (issue 16). Here the answer's head is parsed by hand
and its body, whose size Content-Length gives, is received by an ``asyncio.BufferedProtocol``
directly into the :class:`FetchBody` the caller decodes: the kernel's copy is the only one. The
other requests (metadata, heartbeats, commits, produce) are small and take the same path, so a
daemon on the mqd broker source imports no HTTP library before its first fetch (issue 34: aiohttp's
import is ~0.15 s of the start on the Xeon machine kind; the admin endpoint imports it afterwards).

What the brokers send is what is read: an answer with Content-Length, never compressed or chunked
(anything else is refused as a malformed answer). Connections are kept alive per node and reused
one request at a time, at most ``limit_per_host`` open to a node at once (as aiohttp's connector
limit did). A reused connection that the broker closed while idle is retried once on a new one when
the request is idempotent (a fetch, a heartbeat, a commit of the same offsets); a produce is not
retried (the broker may have appended it before the connection went). TLS goes through the same
code (asyncio's TLS transport feeds a buffered protocol too).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import ssl
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

# the answer's status line and headers; the broker's are a few hundred bytes
MAX_HEAD_BYTES = 64 * 1024
_SCRATCH_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 5.0  # as the aiohttp session's sock_connect
# connections kept per node while idle: a consumer's fetch in flight, its heartbeat, commit and
# metadata beside it, and a spare for a cancelled one
MAX_IDLE_PER_NODE = 4


class FetchBody(bytearray):
    """A fetch answer's bytes. A bytearray subclass takes weak references, so the consumer can
    charge the body to its budget until the last zero-copy slice of it is gone."""


def new_body(n: int) -> FetchBody:
    """A body of ``n`` bytes left as they are: the socket fills every one, where ``bytearray(n)``
    would first zero them all (a pass over every answer's bytes)."""
    body = FetchBody()
    if _resize()(body, n):
        raise MemoryError(f"cannot allocate a fetch answer of {n} bytes")
    return body


@functools.cache
def _resize() -> Callable[[FetchBody, int], int]:
    # the C API grows a bytearray without initialising the new bytes
    fn = ctypes.pythonapi.PyByteArray_Resize
    fn.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
    fn.restype = ctypes.c_int
    return cast(Callable[[FetchBody, int], int], fn)


class AnswerError(Exception):
    """The answer is not one this client can read (framing); the connection is closed."""


class Answer:
    """One HTTP answer: status, headers (lower-case names) and the body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: FetchBody) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class _AnswerReader(asyncio.BufferedProtocol):
    """One connection's protocol: reads one answer per request, the body into its own buffer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self.got_bytes = False  # any byte of the current answer arrived
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._scratch_view = memoryview(self._scratch)
        self._head = bytearray()
        self._body: FetchBody | None = None
        self._body_view: memoryview | None = None
        self._pos = 0
        self._status = 0
        self._headers: dict[str, str] = {}
        # resolved with None: a future's result outlives the await (the loop's handle that woke the
        # task holds the future), and the answer's body must be freed with its last slice
        self._waiter: asyncio.Future[None] | None = None
        self._answer: Answer | None = None

    # -- asyncio.BufferedProtocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is no asyncio.Transport subclass, but has its methods
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body_view is not None:
            return self._body_view[self._pos :]
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        self.got_bytes = True
        if self._body_view is not None:
            self._pos += nbytes
            if self._pos == len(self._body_view):
                self._done()
            return
        if self._waiter is None or self._waiter.done():
            self._fail(AnswerError("bytes arrived with no request waiting for them"))
            return
        self._head += self._scratch_view[:nbytes]
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEAD_BYTES:
                self._fail(AnswerError(f"answer head longer than {MAX_HEAD_BYTES} bytes"))
            return
        try:
            length = self._parse_head(bytes(self._head[:end]))
        except AnswerError as exc:
            self._fail(exc)
            return
        rest = memoryview(self._head)[end + 4 :]
        if len(rest) > length:
            rest.release()
            self._fail(AnswerError(f"answer longer than its Content-Length {length}"))
            return
        body = new_body(length)
        body[: len(rest)] = rest
        self._pos = len(rest)
        rest.release()
        self._head = bytearray()
        self._body = body
        self._body_view = memoryview(body)
        if self._pos == length:
            self._done()

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost fails a waiting request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(
                exc if exc is not None else ConnectionResetError("the broker closed the connection")
            )
        self._release_body()

    # -- requests --------------------------------------------------------------------------------

    async def exchange(self, request: bytes) -> Answer:
        """Send one request and wait for its whole answer."""
        assert self.transport is not None and self._waiter is None
        self._waiter = asyncio.get_running_loop().create_future()
        self.got_bytes = False
        self.transport.write(request)
        await self._waiter
        answer, self._answer = self._answer, None
        assert answer is not None
        return answer

    def finished(self) -> None:
        """The caller has the answer (or gave up on it): the connection is idle again."""
        self._waiter = None
        self._answer = None
        if self._body_view is not None:  # gave up midway: the rest of that answer is unread
            self.reusable = False
            self._release_body()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    # -- internals -------------------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> int:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise AnswerError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self._status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise AnswerError(f"malformed header line {line[:80]!r}")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        self._headers = headers
        if headers.get("transfer-encoding", "identity").lower() != "identity":
            raise AnswerError(f"unsupported Transfer-Encoding {headers['transfer-encoding']!r}")
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise AnswerError(f"unsupported Content-Encoding {headers['content-encoding']!r}")
        length = headers.get("content-length", "")
        if not length.isdigit():
            raise AnswerError(f"answer without a valid Content-Length ({length!r})")
        if parts[0] == b"HTTP/1.0" or headers.get("connection", "").lower() == "close":
            self.reusable = False
        return int(length)

    def _done(self) -> None:
        body = self._body
        assert body is not None
        self._release_body()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._answer = Answer(self._status, self._headers, body)
            waiter.set_result(None)

    def _release_body(self) -> None:
        # dropped, not released: the transport may still hold a slice of it from get_buffer
        self._body_view = None
        self._body = None
        self._pos = 0

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()


class HttpConnections:
    """Kept-alive connections per node, one request at a time on each, at most ``limit_per_host``
    open to one node."""

    def __init__(
        self, *, headers: dict[str, str], ssl_context: ssl.SSLContext | bool, limit_per_host: int = 8
    ) -> None:
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._ssl = ssl_context
        self._default_tls: ssl.SSLContext | None = None  # the system's CA store, loaded once
        self._limit = limit_per_host
        self._slots: dict[tuple[str, str, int], asyncio.Semaphore] = {}
        self._idle: dict[tuple[str, str, int], list[_AnswerReader]] = {}
        self._busy: set[_AnswerReader] = set()

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None,
        timeout: float,
        *,
        content_type: str = "application/json",
        idempotent: bool = True,
    ) -> Answer:
        """``method`` ``url`` with ``body`` (``content_type``); the whole exchange, waiting for a
        free connection included, within ``timeout`` seconds. Raises OSError, TimeoutError or
        AnswerError."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            raise AnswerError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        host = parts.netloc.rpartition("@")[2]
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{self._headers}Accept-Encoding: identity\r\n"
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        request = (head + "\r\n").encode("latin-1") + (body or b"")
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = asyncio.Semaphore(self._limit)
        async with asyncio.timeout(timeout), slots:
            reader = self._take_idle(key)
            if reader is not None:
                try:
                    return await self._exchange(key, reader, request)
                except ConnectionError:
                    if reader.got_bytes or not idempotent:
                        raise
                    # closed by the broker while idle (keep-alive timeout): once more, on a new one
            reader = await self._connect(key)
            return await self._exchange(key, reader, request)

    async def close(self) -> None:
        for readers in self._idle.values():
            for r in readers:
                r.close()
        self._idle.clear()
        for r in list(self._busy):
            r.close()
        self._busy.clear()

    def _take_idle(self, key: tuple[str, str, int]) -> _AnswerReader | None:
        readers = self._idle.get(key)
        while readers:
            r = readers.pop()
            if r.reusable and not r.closed and r.transport is not None and not r.transport.is_closing():
                return r
            r.close()
        return None

    async def _connect(self, key: tuple[str, str, int]) -> _AnswerReader:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        tls = self._ssl if scheme == "https" else None
        if tls is True:
            if self._default_tls is None:
                self._default_tls = ssl.create_default_context()
            tls = self._default_tls
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, reader = await loop.create_connection(
                _AnswerReader, host, port, ssl=tls or None, server_hostname=host if tls else None
            )
        return reader

    async def _exchange(self, key: tuple[str, str, int], reader: _AnswerReader, request: bytes) -> Answer:
        self._busy.add(reader)
        ok = False
        try:
            answer = await reader.exchange(request)
            ok = True
            return answer
        finally:
            self._busy.discard(reader)
            reader.finished()
            if ok and reader.reusable and not reader.closed:
                idle = self._idle.setdefault(key, [])
                if len(idle) < MAX_IDLE_PER_NODE:
                    idle.append(reader)
                else:
                    reader.close()
            else:
                with contextlib.suppress(Exception):
                    reader.close()
