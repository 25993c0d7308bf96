"""A deadline on a request's headers, for the broker's and the admin endpoint's aiohttp servers.

aiohttp reads a request's headers with no deadline of its own: a connection that never finishes
them (sends one byte a second, or nothing at all) holds its socket until the keep-alive timer
fires (3630 s by default, 75 s on the broker), so a few thousand such connections exhaust the
node's file descriptors ("slowloris"). Here every request's headers must be complete within
``header_timeout_s`` of the connection opening, or of their first byte on a kept-alive connection;
otherwise the node answers ``408`` and closes the connection, counted and logged (rate-limited) by
the server's :class:`Rejections` (the broker's and the admin endpoint's
:class:`~mqd.broker.rejected_requests.RejectedRequests`). Bodies have their own deadline
(:func:`mqd.broker.request_parsing.read_body`).

The mechanism is a :class:`aiohttp.web_protocol.RequestHandler` subclass (aiohttp has no hook for
it), built by :class:`BoundedAppRunner` in place of aiohttp's; it reads two of the handler's
internals (``_request_count``, ``_waiter``), which tests/integration/ops/test_security_edges.py
pins against the aiohttp version in use.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

DEFAULT_HEADER_TIMEOUT_S = 10.0
_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)


class Rejections(Protocol):
    """Where a refused request is counted and logged: all this module needs of its servers."""

    def record(self, status: int, reason: str, **context: Any) -> bool: ...


class HeaderDeadlineHandler(RequestHandler):
    """aiohttp's per-connection protocol, plus the header deadline."""

    __slots__ = ("_count_at_arm", "_deadline", "_header_timeout_s", "_rejected")

    def __init__(
        self, manager: web.Server, *, header_timeout_s: float, rejected: Rejections, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._rejected = rejected
        self._deadline: asyncio.TimerHandle | None = None
        self._count_at_arm = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()  # a connection that sends nothing at all is cut too

    def data_received(self, data: bytes) -> None:
        # idle (waiting for the next request, none queued): these bytes start a new request's headers
        if self._deadline is None and self._waiter is not None and not self._waiter.done():
            self._arm()
        super().data_received(data)
        if self._deadline is not None and self._request_count != self._count_at_arm:
            self._disarm()  # the headers are complete: the body has its own deadline

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._count_at_arm = self._request_count
        self._deadline = self._loop.call_later(self._header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self._request_count != self._count_at_arm or self.transport is None:
            return
        reason = f"request headers not received within {self._header_timeout_s:g}s"
        peer = self.transport.get_extra_info("peername")
        self._rejected.record(408, reason, remote=str(peer[0] if peer else None), kind="header_timeout")
        body = b'{"error": "header_timeout", "reason": "%s"}' % reason.encode()
        self.transport.write(_TIMEOUT_ANSWER % (len(body), body))
        self.force_close()


class _HeaderDeadlineServer(web.Server):
    def __init__(self, *args: Any, header_timeout_s: float, rejected: Rejections, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s = header_timeout_s
        self.rejected = rejected

    def __call__(self) -> RequestHandler:
        return HeaderDeadlineHandler(
            self,
            loop=self._loop,
            header_timeout_s=self.header_timeout_s,
            rejected=self.rejected,
            **self._kwargs,
        )


class BoundedAppRunner(web.AppRunner):
    """``web.AppRunner`` whose connections get the header deadline; every other keyword goes to
    aiohttp's server as usual."""

    __slots__ = ("_header_timeout_s", "_rejected")

    def __init__(
        self,
        app: web.Application,
        *,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        rejected: Rejections,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._rejected = rejected

    async def _make_server(self) -> web.Server:
        # aiohttp's own server (the app started and frozen, its handler and settings), rebuilt as
        # the subclass that makes HeaderDeadlineHandler connections
        server = await super()._make_server()
        return _HeaderDeadlineServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=asyncio.get_running_loop(),
            header_timeout_s=self._header_timeout_s,
            rejected=self._rejected,
            **server._kwargs,
        )
