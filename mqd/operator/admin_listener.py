"""The admin endpoint's port, bound when the daemon starts; aiohttp and the endpoint are built at the
first connection (issue 34).

Why: importing ``aiohttp.web`` and building the endpoint costs ~0.33 CPU-s on a 2-core Xeon (aiohttp
loads the CA bundle twice at its import, for client TLS contexts a server never uses), a fifth of a
short burst's fixed cost, and most runs are never asked: a burst from a timer, a daemon nobody
scrapes yet. What a user sees of the endpoint does not change:

- the port is bound at start, as before: a taken port fails the start with the same error, and
  ``state_dir/admin.json`` names the URL before READY=1;
- a connection that arrives before the endpoint is built waits in the listen backlog (nothing
  accepts it yet); the listener sees the socket readable, builds the endpoint on a worker thread
  (the imports), and hands it the bound sockets, whose backlog aiohttp then accepts. The first
  answer takes the build (~0.3 s), once;
- a build that fails (a broken install) is logged and reported through ``on_failure``: the runner
  stops the process and exits 1 with the reason, as when the endpoint fails during the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from mqd.config import AdminConfig
from mqd.errors import MqdError

log = structlog.get_logger(__name__)

BACKLOG = 128  # aiohttp's default for its own sites


class Served(Protocol):
    """The built endpoint (mqd.operator.admin.AdminServer) as the listener uses it."""

    async def start(self, sockets: Sequence[socket.socket] | None = None) -> None: ...

    async def stop(self) -> None: ...


class AdminListenError(MqdError):
    """The admin port cannot be bound. Retriable: the port may be free later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address of ``host``, as asyncio's ``create_server`` binds them
    (SO_REUSEADDR; an IPv6 socket only IPv6). With port 0 the first address picks the port and the
    others take the same one, so the one URL reaches all of them."""
    try:
        # an ASCII host goes as bytes: for a str, CPython's socket module loads the idna codec
        # (stringprep's tables: ~17 ms of CPU at every start), even for an address literal
        query: str | bytes = host.encode("ascii") if host.isascii() else host
        infos = socket.getaddrinfo(query, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise AdminListenError(f"admin endpoint cannot listen on {host}:{port}: {exc}") from exc
    sockets: list[socket.socket] = []
    try:
        for family, type_, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise AdminListenError(f"admin endpoint cannot listen on {host}:{port}: {exc}") from exc
    return sockets


def http_url(host: str, port: int) -> str:
    """The endpoint's URL at ``host``:``port`` (an IPv6 address in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return http_url(host, port)


class AdminListener:
    """Build in __init__, bind in start(), stop() is idempotent. ``build`` makes the endpoint (it
    runs on a worker thread: its imports); ``on_failure`` hears a build or start that failed."""

    def __init__(
        self,
        config: AdminConfig,
        build: Callable[[], Served],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self._config = config
        self._build = build
        self._on_failure = on_failure
        self._sockets: list[socket.socket] = []
        self._served: Served | None = None
        self._building: asyncio.Task[None] | None = None
        self._url: str | None = None
        self._closing = False

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("AdminListener.start() was not called")
        return self._url

    @property
    def built(self) -> bool:
        """Whether the endpoint was built (a connection came)."""
        return self._served is not None

    async def start(self) -> None:
        if self._sockets:
            return
        self._closing = False
        self._sockets = bind(self._config.host, self._config.port)
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            loop.add_reader(sock.fileno(), self._connection_waiting)
        self._url = url_of(self._sockets[0])
        log.info("admin endpoint listening", url=self._url)

    def _connection_waiting(self) -> None:
        self._stop_watching()
        if self._building is None:
            self._building = asyncio.get_running_loop().create_task(self._serve(), name="mqd-admin-build")

    async def _serve(self) -> None:
        try:
            served = await asyncio.to_thread(self._build)
            if self._closing:
                return  # stop() came during the build: the sockets close unserved
            await served.start(self._sockets)
        except Exception as exc:  # a broken install, a bug: the process stops and says why
            log.exception("admin endpoint failed to build: its port closes", url=self._url)
            self._close_sockets()
            self._on_failure(exc)
            return
        self._served = served
        log.info("admin endpoint serving", url=self._url)

    def _stop_watching(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            if sock.fileno() >= 0:
                loop.remove_reader(sock.fileno())

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    async def stop(self) -> None:
        if not self._sockets:
            return
        self._closing = True
        self._stop_watching()
        building, self._building = self._building, None
        if building is not None:
            await asyncio.wait({building})  # a thread cannot be cancelled: its build ends first
        served, self._served = self._served, None
        if served is not None:
            await served.stop()
        self._close_sockets()
        self._sockets = []
