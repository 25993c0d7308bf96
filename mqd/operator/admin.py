"""The daemon's admin HTTP endpoint (aiohttp, 127.0.0.1 by default).

- ``GET /healthz``  liveness: 200 while the working loop turns, 503 when it is stuck.
- ``GET /readyz``   readiness: 200 when running and healthy, 503 with the reasons otherwise.
- ``GET /metrics``  Prometheus text format (``mqd.metrics.REGISTRY``).
- ``GET /status``   JSON: state, health, assignment, positions, lag (log end minus landed), fetch lag,
  time lag, pull node, flow-control, errors.
- ``GET /``         the HTML status page (:mod:`mqd.operator.status_page`), reloaded every 2 s.
- ``POST /pause``, ``POST /resume``  body ``{"partitions": ["topic", "topic:3"]}`` (or
  ``?partition=topic:3``, repeatable): a bare topic means every owned partition of it.

With ``admin.auth_token`` set, every route but the two probes needs the token (:class:`AdminAuth`):
``Authorization: Bearer <token>`` (the CLI, Prometheus), or, for GET, HTTP Basic with the token as
password (a browser, which cannot add a bearer header to a page it loads). The probes stay open
because systemd and Kubernetes probe without credentials; without the token they answer only ok/not
ok, no reasons, since the reasons carry paths, URLs and error text. See docs/security.md.

Browsers are kept from acting for a foreign web page (:func:`browser_refusal`): a state-changing
request with a foreign ``Origin`` or a form content type is refused (cross-site request forgery),
and while the endpoint binds loopback a request naming another host is refused (DNS rebinding).
Connections are bounded like the broker's: headers within 10 s (:mod:`mqd.header_deadline`), a body
within 10 s, idle keep-alive 75 s; a request aiohttp cannot parse (URL or header over 8 KiB) is a
400 counted and logged once per 10 s, never a traceback per request.

The server knows nothing about the daemon: it serves an :class:`AdminTarget` (the runner).
The text and HTML views are pure functions of the status JSON (mqd/operator/views.py) so
``mqd status``/``mqd top`` render exactly what the endpoint serves.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client.registry import CollectorRegistry

from mqd import __version__, metrics
from mqd.broker.rejected_requests import ParserErrorLog, RejectedRequests
from mqd.config import AdminConfig
from mqd.errors import MqdError
from mqd.header_deadline import BoundedAppRunner
from mqd.lazy_import import lazy_import
from mqd.operator import admin_listener, status_page
from mqd.topic_name import topic_name_problem
from mqd.waiting import cancel_and_wait

if TYPE_CHECKING:
    import prometheus_client.exposition as exposition
    import psutil
else:
    exposition = lazy_import("prometheus_client.exposition")  # its HTTP servers: at the first scrape

log = structlog.get_logger(__name__)

PartitionSpec = tuple[str, int | None]


class AdminError(MqdError):
    """Bad input to the admin endpoint or a failed call to it. Not retriable unless it says so."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message, retriable=retriable)


def parse_partition_spec(text: str) -> PartitionSpec:
    """``"events"`` -> ("events", None); ``"events:3"`` -> ("events", 3). Raises AdminError."""
    topic, sep, part = text.strip().partition(":")
    if topic_name_problem(topic) is not None:
        raise AdminError(f"bad topic in {text!r}: use TOPIC or TOPIC:PARTITION (letters, digits, ._-)")
    if not sep:
        return topic, None
    if not part.isdigit():
        raise AdminError(f"bad partition in {text!r}: must be a number >= 0")
    return topic, int(part)


OPEN_ROUTES = frozenset({"/healthz", "/readyz"})  # probes: systemd and k8s send no credentials
READ_METHODS = frozenset({"GET", "HEAD"})
REALM = "mqd"
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
KEEPALIVE_TIMEOUT_S = 75.0  # aiohttp: 3630 s, one fd each that long
THROUGHPUT_SAMPLE_S = 1.0  # the status page's records/s: a sample of the published total this often
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


def browser_refusal(
    method: str,
    origin: str | None,
    fetch_site: str | None,
    content_type: str | None,
    has_body: bool,
    host: str | None,
    scheme: str,
    loopback_only: bool,
) -> tuple[int, str, str] | None:
    """Why a request must be refused as one a browser sent for another site, as ``(status, code,
    reason)``, or None. Reads are refused only for a foreign ``Host`` on a loopback bind (a DNS
    rebinding page would read them as its own origin); a POST also for a foreign ``Origin`` (every
    browser sends it on a cross-origin POST, ``null`` from sandboxed pages), ``Sec-Fetch-Site:
    cross-site``/``same-site``, or a body of a type an HTML form can post without a CORS preflight."""
    if loopback_only and not _loopback_host(host):
        return 403, "forbidden_host", f"Host {host!r} is not a loopback name: this endpoint binds loopback"
    if method in READ_METHODS:
        return None
    if origin is not None and origin.lower() != f"{scheme}://{host or ''}".lower():
        return 403, "cross_origin", f"Origin {origin!r} is not this endpoint: refused (cross-site request)"
    if fetch_site is not None and fetch_site.lower() in ("cross-site", "same-site"):
        return 403, "cross_origin", f"Sec-Fetch-Site {fetch_site!r}: refused (cross-site request)"
    if has_body and (content_type or "").lower() != "application/json":
        return 415, "unsupported_media_type", "the body must be Content-Type: application/json"
    return None


def _loopback_host(host: str | None) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``, 127.x, ``[::1]``)."""
    if not host:
        return False
    if host.startswith("["):  # [::1]:9480
        name = host[1:].partition("]")[0]
    else:
        name = host.rpartition(":")[0] if ":" in host else host
    return _binds_loopback(name)


def _binds_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AdminAuth:
    """Who may call the admin endpoint. Without a token everyone (loopback by default); with one, a
    request must carry it as a bearer token, or, to read, as the password of HTTP Basic auth (any
    user name)."""

    def __init__(self, token: str | None) -> None:
        self._digest = _digest(token.encode()) if token else None

    def allows(self, authorization: str | None, *, basic: bool) -> bool:
        """Whether an ``Authorization`` header value (None when absent) grants access; ``basic``
        says whether HTTP Basic counts. A browser resends Basic credentials by itself, also on a
        form another site posts to us, so only reads take them: pause/resume need the bearer header,
        which no browser adds on its own."""
        if self._digest is None:
            return True
        given = _credential(authorization or "", basic=basic)
        # equal-length digests: the comparison takes the same time whatever the token's length or
        # how much of it a guess gets right
        return given is not None and hmac.compare_digest(_digest(given), self._digest)


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def _credential(authorization: str, *, basic: bool) -> bytes | None:
    """The secret a header carries: a bearer token or a basic password; None when it carries none."""
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if not value:
        return None
    # aiohttp decodes headers as UTF-8 with surrogateescape: this gives back the bytes sent
    if scheme.lower() == "bearer":
        return value.encode("utf-8", "surrogateescape")
    if scheme.lower() == "basic" and basic:
        try:
            decoded = base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            return None
        _user, sep, password = decoded.partition(b":")
        return password if sep else None
    return None


class AdminTarget(Protocol):
    """What the endpoint serves; the runner implements it around the Daemon."""

    def status(self) -> dict[str, Any]: ...

    def liveness(self) -> tuple[bool, str]: ...

    def readiness(self) -> tuple[bool, list[str]]: ...

    def pause(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]: ...

    def resume(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]: ...


class ProcessFigures:
    """The ``process`` section of the status JSON: version, RSS and CPU seconds of this process
    (``mqd top`` turns CPU seconds into a share between its samples). psutil is imported by the
    first status asked for, not with the endpoint: a burst run nobody looks at does not pay its
    ~20 ms import (issue 34)."""

    def __init__(self) -> None:
        self._proc: psutil.Process | None = None

    def status(self) -> dict[str, Any]:
        import psutil

        if self._proc is None:
            self._proc = psutil.Process()
        try:
            with self._proc.oneshot():
                cpu = self._proc.cpu_times()
                rss = self._proc.memory_info().rss
        except psutil.Error:  # not expected for our own process; the view shows "-"
            return {"version": __version__, "pid": os.getpid(), "rss_bytes": None, "cpu_seconds": None}
        return {
            "version": __version__,
            "pid": os.getpid(),
            "rss_bytes": rss,
            "cpu_seconds": round(cpu.user + cpu.system, 3),
        }


class AdminServer:
    """Build in __init__, bind in start(), stop() is idempotent."""

    def __init__(
        self,
        config: AdminConfig,
        target: AdminTarget,
        *,
        registry: CollectorRegistry = metrics.REGISTRY,
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        self._config = config
        self._header_timeout_s = header_timeout_s
        self._target = target
        self._registry = registry
        self._auth = AdminAuth(config.auth_token)
        self._loopback_only = _binds_loopback(config.host)
        self.rejected = RejectedRequests()
        self._app = web.Application(
            client_max_size=64 * 1024, middlewares=[self._check_browser, self._check_auth]
        )
        self._app.add_routes(
            [
                web.get("/", self._index),
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/metrics", self._metrics),
                web.get("/status", self._status),
                web.post("/pause", self._pause),
                web.post("/resume", self._resume),
            ]
        )
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._process = ProcessFigures()
        self._throughput = status_page.Throughput()
        self._sampler: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("AdminServer.start() was not called")
        return self._url

    async def start(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """Listen on ``admin.host``:``admin.port``, or serve ``sockets`` already bound and listening
        (mqd/operator/admin_listener.py binds them at the daemon's start)."""
        if self._runner is not None:
            return
        runner = BoundedAppRunner(
            self._app,
            header_timeout_s=self._header_timeout_s,
            rejected=self.rejected,
            access_log=None,
            handle_signals=False,
            logger=ParserErrorLog(self.rejected),
            keepalive_timeout=KEEPALIVE_TIMEOUT_S,
            lingering_time=BODY_TIMEOUT_S,
        )
        bound_here = sockets is None
        if sockets is None:
            sockets = admin_listener.bind(self._config.host, self._config.port)
        await runner.setup()
        try:
            for sock in sockets:
                await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            for sock in sockets if bound_here else ():
                sock.close()
            raise
        self._runner = runner
        self._throughput.observe(published_records(), time.monotonic())
        self._sampler = asyncio.create_task(self._sample_throughput(), name="mqd-admin-throughput")
        self._url = admin_listener.url_of(sockets[0])
        if bound_here:
            log.info("admin endpoint listening", url=self._url)

    async def stop(self) -> None:
        sampler, self._sampler = self._sampler, None
        await cancel_and_wait(sampler)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def _sample_throughput(self) -> None:
        # samples taken only on page loads left the first load with one sample and no rate
        while True:
            await asyncio.sleep(THROUGHPUT_SAMPLE_S)
            self._throughput.observe(published_records(), time.monotonic())

    # -- handlers --------------------------------------------------------------------------------

    @web.middleware
    async def _check_browser(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical in OPEN_ROUTES:
            return await handler(request)
        refusal = browser_refusal(
            request.method,
            request.headers.get("Origin"),
            request.headers.get("Sec-Fetch-Site"),
            request.headers.get("Content-Type", "").partition(";")[0].strip() or None,
            request.can_read_body,
            request.headers.get("Host"),
            request.scheme,
            self._loopback_only,
        )
        if refusal is None:
            return await handler(request)
        status, code, reason = refusal
        self.rejected.record(status, reason, method=request.method, path=request.path)
        response = _error(status, code, reason)
        if request.can_read_body:
            await _close_after(request, response)
        return response

    @web.middleware
    async def _check_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # judged on the route the router matched, so no spelling of a path reaches another handler
        resource = request.match_info.route.resource
        if (resource is not None and resource.canonical in OPEN_ROUTES) or self._trusted(request):
            return await handler(request)
        # reads offer Basic so a browser prompts (on the page, and on /status or /metrics opened
        # directly); once given, it sends the password to every path under / (RFC 7617)
        read = request.method in READ_METHODS
        scheme = "Basic" if read else "Bearer"
        response = _error(
            401,
            "unauthorized",
            "this endpoint needs the admin token: Authorization: Bearer <admin.auth_token>"
            + (", or HTTP Basic auth with the token as password" if read else ""),
        )
        response.headers["WWW-Authenticate"] = f'{scheme} realm="{REALM}"'
        return response

    def _trusted(self, request: web.Request) -> bool:
        """Whether the request may see details: no token is set, or it carries the right one."""
        return self._auth.allows(request.headers.get("Authorization"), basic=request.method in READ_METHODS)

    async def _healthz(self, request: web.Request) -> web.Response:
        ok, reason = self._target.liveness()
        return web.json_response(
            {"status": "ok" if ok else "stuck", "reason": reason}, status=200 if ok else 503
        )

    async def _readyz(self, request: web.Request) -> web.Response:
        ok, reasons = self._target.readiness()
        if not self._trusted(request):
            reasons = []  # the reasons name paths, broker URLs and error text
        return web.json_response({"ready": ok, "reasons": reasons}, status=200 if ok else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = exposition.generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": exposition.CONTENT_TYPE_LATEST})

    async def _status(self, request: web.Request) -> web.Response:
        status = self._target.status()
        status.setdefault("admin", {})["rejected"] = self.rejected.as_json()
        status.setdefault("process", self._process.status())
        return web.json_response(status, dumps=_dumps)

    async def _index(self, request: web.Request) -> web.Response:
        status = self._target.status()
        status.setdefault("process", self._process.status())
        rate = self._throughput.observe(published_records(), time.monotonic())
        return web.Response(text=status_page.render_page(status, rate), content_type="text/html")

    async def _pause(self, request: web.Request) -> web.Response:
        return await self._pause_resume(request, pause=True)

    async def _resume(self, request: web.Request) -> web.Response:
        return await self._pause_resume(request, pause=False)

    async def _pause_resume(self, request: web.Request, *, pause: bool) -> web.Response:
        try:
            specs = [parse_partition_spec(s) for s in await _partition_args(request)]
            if not specs:
                raise AdminError('name partitions: {"partitions": ["topic", "topic:3"]}')
            done = self._target.pause(specs) if pause else self._target.resume(specs)
        except _BodyRefused as exc:
            self.rejected.record(exc.status, str(exc), path=request.path)
            response = _error(exc.status, exc.code, str(exc))
            await _close_after(request, response)
            return response
        except AdminError as exc:
            return _error(400, "bad_request", str(exc))
        except KeyError as exc:  # the daemon refused a partition it does not own
            return _error(404, "not_assigned", str(exc.args[0]) if exc.args else str(exc))
        key = "paused" if pause else "resumed"
        log.info(f"partitions {key} by admin request", partitions=[f"{t}:{p}" for t, p in done])
        return web.json_response({key: [{"topic": t, "partition": p} for t, p in done]})


class _BodyRefused(AdminError):
    """A body not read whole: declared over the size limit, or not arrived within BODY_TIMEOUT_S."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


async def _partition_args(request: web.Request) -> list[str]:
    items = list(request.query.getall("partition", []))
    if request.can_read_body:
        limit = request.client_max_size
        if request.content_length is not None and request.content_length > limit:
            raise _BodyRefused(413, "too_large", f"request body larger than {limit} bytes")
        try:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                raw = await request.read()
        except TimeoutError:
            raise _BodyRefused(
                408, "body_timeout", f"request body not received within {BODY_TIMEOUT_S:g}s"
            ) from None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise AdminError(f"body is not JSON: {exc}") from None
        parts = body.get("partitions") if isinstance(body, dict) else None
        if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
            raise AdminError('body must be {"partitions": ["topic", "topic:3", ...]}')
        items.extend(parts)
    return items


async def _close_after(request: web.Request, response: web.Response) -> None:
    """Send ``response`` now and close the connection: the request's body is not read, and aiohttp
    would otherwise drain it for up to ``lingering_time`` first."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()


def published_records() -> int:
    """Records published by this process (``mqd_published_records_total`` over its topics): what
    the status page's records/s is measured on. A process-wide counter rather than the status's
    ``records_published``, which costs a full status to read."""
    total = 0.0
    for family in metrics.records_published.collect():
        total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def _error(status: int, code: str, reason: str) -> web.Response:
    return web.json_response({"error": code, "reason": reason}, status=status)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
