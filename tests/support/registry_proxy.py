"""A small aiohttp reverse proxy in front of a test schema registry: it counts the requests it
forwards, can demand credentials, serve https, or answer every request with an error.

Why a proxy: Apicurio Registry's own authentication needs a Keycloak (OIDC) server, which these
tests do not have; the registries people run put basic auth or bearer tokens in front just the
same (Confluent's REST proxy realm, an ingress). So the proxy is the honest stand-in for "a registry
that wants credentials": the client's Authorization header meets a real HTTP server that refuses
it (401 with Confluent's error body) or forwards the request to the real registry. It runs its
own event loop in a thread, so synchronous code (the urllib client) can be tested against it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from aiohttp import web

from mqd.testing.cluster import free_port

START_TIMEOUT = 10.0
SESSION = web.AppKey("session", aiohttp.ClientSession)


class RegistryProxy:
    """``upstream``: the registry's root (``http://127.0.0.1:<port>``); ``url`` is the proxy's
    Confluent API (same path). ``paths`` lists every request path (with query) that reached the
    proxy, answered or refused."""

    def __init__(
        self,
        upstream: str,
        *,
        basic: tuple[str, str] | None = None,
        bearer: str | None = None,
        tls: ssl.SSLContext | None = None,
        fail_status: int | None = None,
        api_path: str = "/apis/ccompat/v7",
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.basic = basic
        self.bearer = bearer
        self.tls = tls
        self.fail_status = fail_status
        self.api_path = api_path
        self.port = free_port()
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{self.api_path}"

    def count(self, fragment: str = "") -> int:
        """How many requests had ``fragment`` in their path."""
        with self._lock:
            return sum(fragment in p for p in self.paths)

    def _authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if self.basic is not None:
            expected = base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
            return header == f"Basic {expected}"
        if self.bearer is not None:
            return header == f"Bearer {self.bearer}"
        return True

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.paths.append(request.path_qs)
        if self.fail_status is not None:
            return _error(self.fail_status, self.fail_status * 100, "the proxy answers every request so")
        if not self._authorized(request):
            resp = _error(401, 401, "Unauthorized")
            resp.headers["WWW-Authenticate"] = 'Basic realm="registry"' if self.basic else "Bearer"
            return resp
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("accept", "content-type")}
        session = request.app[SESSION]
        async with session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        ) as upstream:
            data = await upstream.read()
            out = web.Response(status=upstream.status, body=data)
            if "Content-Type" in upstream.headers:
                out.headers["Content-Type"] = upstream.headers["Content-Type"]
            return out

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        app[SESSION] = session
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=self.tls).start()
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await session.close()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    def start(self) -> RegistryProxy:
        self._thread = threading.Thread(target=self._run, name=f"registry-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise TimeoutError(f"registry proxy on port {self.port} did not start in {START_TIMEOUT}s")
        if self._error is not None:
            raise RuntimeError(f"registry proxy on port {self.port} failed: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None or self._stop is None:
            return
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(START_TIMEOUT)
        self._thread = None


def _error(status: int, code: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps({"error_code": code, "message": message}).encode(),
        content_type="application/json",
    )


@contextmanager
def registry_proxy(
    upstream: str,
    *,
    basic: tuple[str, str] | None = None,
    bearer: str | None = None,
    tls: ssl.SSLContext | None = None,
    fail_status: int | None = None,
) -> Iterator[RegistryProxy]:
    """A started :class:`RegistryProxy`, stopped on exit."""
    proxy = RegistryProxy(upstream, basic=basic, bearer=bearer, tls=tls, fail_status=fail_status)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
