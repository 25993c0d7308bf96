"""One broker node: the aiohttp HTTP API of docs/protocol.md over the partition logs.

The node serves produce (masters only), fetch with long polling, metadata, offsets, the group
coordinator and the replication endpoints. Long polling has no timer tick: every waiting fetch holds
an ``asyncio.Event`` registered on each partition it asked for, and :meth:`BrokerNode.notify_append`
(called after a produce, and on slaves after replication appended) sets them.

``acks=all`` on a master waits until every live slave has replicated past the batch: a slave's
replica fetch names the offset it wants next, which is how far it has come.

Fetch hot path: while a fetch waits, each partition is only *planned* (byte ranges from the
in-memory index, no I/O); once the answer is ready every range is read with ``preadv`` straight
into one buffer, which goes to the socket as is. Stored bytes are copied once in user space and
never parsed (the offset after the last batch comes from the index too).

Committed offsets: a master max-merges its slaves' offsets (groups.py) when it starts, before it
listens, and every second, so commits a slave took as coordinator while the master was down
survive its return.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import re
import signal
import ssl
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import structlog
from aiohttp import web

from mqd import format as fmt
from mqd.broker.cluster_state import ClusterState
from mqd.broker.groups import GroupError, GroupStore
from mqd.broker.replication import Replicator
from mqd.broker.storage import PartitionLog, ReadPlan, Storage, StorageError
from mqd.client import BrokerClient, BrokerError
from mqd.config import BrokerConfig, ClusterConfig, ConfigError, load_broker_config
from mqd.errors import MqdError
from mqd.protocol import BATCH_CONTENT_TYPE, FETCH_CONTENT_TYPE, Status, encode_fetch_answer

log = structlog.get_logger(__name__)

MAX_OFFSET = 2**63 - 1
MAX_SESSION_TIMEOUT_MS = 3_600_000
SHUTDOWN_DRAIN_S = 5.0  # how long in-flight requests may take to finish on stop
CLIENT_STATS_IDLE_S = 600.0  # per-client counters of a client silent this long are dropped
STATS_PRUNE_INTERVAL_S = 60.0
OFFSETS_PULL_INTERVAL_S = 1.0  # a master pulls its slaves' committed offsets this often
OFFSETS_PULL_START_TIMEOUT_S = 2.0  # ... and once at start, before it serves, waiting at most this
_MISSING: Any = object()
_PARTITION_RE = re.compile(r"-?[0-9]+")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(MqdError):
    """An error answer: JSON ``{"error": code, "reason": ..., **extra}`` with an HTTP status."""

    def __init__(self, status: int, code: str, reason: str, **extra: Any) -> None:
        super().__init__(reason, retriable=status >= 500 or status in (408, 421, 429))
        self.status = status
        self.code = code
        self.reason = reason
        self.extra = extra

    def response(self) -> web.Response:
        body = {"error": self.code, "reason": self.reason, **self.extra}
        return web.json_response(body, status=self.status)


def _bad(reason: str) -> NoReturn:
    raise ApiError(400, "bad_request", reason)


@functools.cache
def openapi_spec() -> bytes | None:
    """The OpenAPI description shipped in the package (mqd/broker/openapi.yaml), read once; None
    when the install lacks it (GET /v1/openapi.yaml then answers 500, the node still serves)."""
    try:
        return resources.files(__package__ or "mqd.broker").joinpath("openapi.yaml").read_bytes()
    except OSError as exc:
        log.error("openapi.yaml is missing from the mqd install", error=str(exc))
        return None


# -- request parsing ---------------------------------------------------------------------------------


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        _bad("body is not valid JSON")
    if not isinstance(data, dict):
        _bad("body must be a JSON object")
    return data


def _int(
    obj: dict[str, Any],
    key: str,
    where: str = "",
    *,
    default: Any = _MISSING,
    minimum: int = 0,
    maximum: int = MAX_OFFSET,
) -> int:
    value = obj.get(key, default)
    if value is _MISSING:
        _bad(f"{where}{key}: required")
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(f"{where}{key}: must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        _bad(f"{where}{key}: must be in [{minimum}, {maximum}], got {value}")
    return value


def _str(
    obj: dict[str, Any], key: str, where: str = "", *, default: Any = _MISSING, empty: bool = False
) -> str:
    value = obj.get(key, default)
    if value is _MISSING:
        _bad(f"{where}{key}: required")
    if not isinstance(value, str):
        _bad(f"{where}{key}: must be a string, got {type(value).__name__}")
    if not empty and not value:
        _bad(f"{where}{key}: must not be empty")
    if len(value) > 1024:
        _bad(f"{where}{key}: longer than 1024 characters")
    return value


def _list(obj: dict[str, Any], key: str, *, default: Any = _MISSING, limit: int = 100_000) -> list[Any]:
    value = obj.get(key, default)
    if value is _MISSING:
        _bad(f"{key}: required")
    if not isinstance(value, list):
        _bad(f"{key}: must be a list, got {type(value).__name__}")
    if len(value) > limit:
        _bad(f"{key}: more than {limit} entries")
    return value


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _bad(f"{where}: must be an object, got {type(value).__name__}")
    return value


# -- the node ----------------------------------------------------------------------------------------


class _Stats:
    """Request counters for GET /v1/stats (tests and the benchmark read them).

    Per-client entries are bounded: a client with nothing in flight and silent for ``idle_s`` is
    dropped by :meth:`prune` (client ids may be per process, so they would otherwise pile up).
    """

    def __init__(self, idle_s: float = CLIENT_STATS_IDLE_S) -> None:
        self.idle_s = idle_s
        self.requests: dict[str, int] = defaultdict(int)
        self.clients: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.last_seen: dict[str, float] = {}
        self.fetch_partitions = 0
        self.inflight: dict[str, int] = defaultdict(int)
        self.inflight_max: dict[str, int] = defaultdict(int)

    def count(self, client_id: str, what: str, now: float | None = None) -> None:
        self.clients[client_id][what] += 1
        self.last_seen[client_id] = time.monotonic() if now is None else now

    def fetch_started(self, client_id: str) -> None:
        self.inflight[client_id] += 1
        self.inflight_max[client_id] = max(self.inflight_max[client_id], self.inflight[client_id])

    def fetch_done(self, client_id: str) -> None:
        left = self.inflight[client_id] - 1
        if left > 0:
            self.inflight[client_id] = left
        else:
            del self.inflight[client_id]

    def prune(self, now: float | None = None) -> int:
        """Drop the counters of clients idle for ``idle_s`` with nothing in flight; returns how many."""
        now = time.monotonic() if now is None else now
        idle = [
            c for c, seen in self.last_seen.items() if now - seen > self.idle_s and c not in self.inflight
        ]
        for c in idle:
            del self.last_seen[c]
            self.clients.pop(c, None)
            self.inflight_max.pop(c, None)
        return len(idle)

    def as_json(self, node_id: str) -> dict[str, Any]:
        return {
            "node": node_id,
            "requests": dict(self.requests),
            "clients": {c: dict(v) for c, v in self.clients.items()},
            "fetch_partitions": self.fetch_partitions,
            "inflight_fetch": {c: n for c, n in self.inflight.items() if n},
            "inflight_fetch_max_per_client": dict(self.inflight_max),
        }


class _FetchItem:
    __slots__ = ("max_bytes", "offset", "partition", "topic")

    def __init__(self, topic: str, partition: int, offset: int, max_bytes: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.max_bytes = max_bytes


class BrokerNode:
    """A broker node. ``start()`` opens storage and binds the HTTP server; ``stop()`` is the ordered,
    idempotent shutdown (stop accepting, let in-flight requests finish, stop tasks, close storage)."""

    def __init__(self, config: BrokerConfig, cluster: ClusterConfig) -> None:
        if (config.tls_cert is None) != (config.tls_key is None):
            raise ConfigError("tls_cert and tls_key must be given together")
        self.config = config
        self.cluster = cluster
        self.node_id = config.node_id
        self._client = BrokerClient(
            request_timeout=10.0, auth_token=config.auth_token, ca_file=config.tls_ca_file
        )
        self.state = ClusterState(config, cluster, self._client, on_liveness_change=self._wake_acks)
        self.storage = Storage(config.data_dir, config.storage)
        self.groups = GroupStore(config.data_dir)
        self.stats = _Stats()
        # long polls: partition -> events of the fetches waiting on it
        self._waiters: dict[tuple[str, int], set[asyncio.Event]] = defaultdict(set)
        # acks=all: partition -> slave -> next offset the slave asked for (= its log end)
        self._replicated: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
        self._ack_waiters: dict[tuple[str, int], set[asyncio.Event]] = defaultdict(set)
        self._replicator: Replicator | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._started = False
        self._stopped = False
        self.url: str | None = None
        self._openapi_spec = openapi_spec()
        self._app = self._build_app()

    # -- lifecycle ---------------------------------------------------------------------------------

    def _build_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.limits.max_request_bytes,
            middlewares=[self._error_middleware, self._auth_middleware],
        )
        r = app.router
        r.add_get("/v1/health", self._health, name="health")
        r.add_get("/v1/metadata", self._metadata, name="metadata")
        r.add_get("/v1/stats", self._get_stats, name="stats")
        r.add_post("/v1/produce/{topic}/{partition}", self._produce, name="produce")
        r.add_post("/v1/fetch", self._fetch, name="fetch")
        r.add_post("/v1/offsets", self._offsets, name="offsets")
        r.add_post("/v1/groups/{group}/heartbeat", self._heartbeat, name="heartbeat")
        r.add_post("/v1/groups/{group}/leave", self._leave, name="leave")
        r.add_post("/v1/groups/{group}/commit", self._commit, name="commit")
        r.add_post("/v1/groups/{group}/offsets", self._committed, name="committed")
        r.add_post("/v1/replica/fetch", self._replica_fetch, name="replica_fetch")
        r.add_get("/v1/replica/offsets", self._replica_offsets, name="replica_offsets")
        r.add_get("/v1/openapi.yaml", self._openapi, name="openapi")
        return app

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.config.tls_cert is None or self.config.tls_key is None:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load TLS certificate/key: {exc}") from exc
        return ctx

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        ssl_ctx = self._ssl_context()
        await loop.run_in_executor(None, self.groups.load)
        await loop.run_in_executor(None, self.storage.open, self.state.partitions)
        await self._client.start()
        if self.state.is_master and self.state.group.slaves:
            # a slave may have been the coordinator while this master was down: take its commits
            # before answering any group request
            await self._pull_slave_offsets(OFFSETS_PULL_START_TIMEOUT_S)
            self._tasks.append(asyncio.create_task(self._offsets_pull_loop(), name="offsets-pull"))
        await self.state.start()
        if not self.state.is_master:
            self._replicator = Replicator(
                node_id=self.node_id,
                group=self.state.group,
                storage=self.storage,
                partitions=self.state.partitions,
                client=self._client,
                groups=self.groups,
                on_append=self.notify_append,
                wait_ms=self.config.replica_wait_ms,
            )
            await self._replicator.start()
        self._tasks.append(asyncio.create_task(self._expiry_loop(), name="group-expiry"))
        self._tasks.append(asyncio.create_task(self._stats_prune_loop(), name="stats-prune"))
        if self.config.storage.fsync == "interval":
            self._tasks.append(asyncio.create_task(self._flush_loop(), name="fsync"))
        if self.config.storage.retention_bytes >= 0 or self.config.storage.retention_ms >= 0:
            self._tasks.append(asyncio.create_task(self._retention_loop(), name="retention"))
        # handler_cancellation: a fetch held for a client that went away is cancelled at once, so
        # its waiter and in-flight count go with it instead of lasting until max_wait_ms
        self._runner = web.AppRunner(
            self._app, shutdown_timeout=SHUTDOWN_DRAIN_S, access_log=None, handler_cancellation=True
        )
        await self._runner.setup()
        spec = self.cluster.node(self.node_id)
        assert spec is not None
        port = self.config.port if self.config.port is not None else _url_port(spec[1].url)
        site = web.TCPSite(
            self._runner, self.config.host, port, ssl_context=ssl_ctx, shutdown_timeout=SHUTDOWN_DRAIN_S
        )
        await site.start()
        scheme = "https" if ssl_ctx else "http"
        self.url = f"{scheme}://{self.config.host}:{port}"
        log.info(
            "listening",
            node=self.node_id,
            role=self.state.node.role,
            group=self.state.group.name,
            url=self.url,
            partitions=len(self.state.partitions),
        )

    async def stop(self) -> None:
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        self._closing = True
        # held long polls answer at once; then the runner stops accepting and drains the rest
        for events in self._waiters.values():
            for ev in events:
                ev.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._replicator is not None:
            await self._replicator.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.state.stop()
        await self._client.close()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.storage.flush_all)
        except (OSError, StorageError) as exc:
            log.error("final fsync failed", node=self.node_id, error=str(exc))
        finally:
            await loop.run_in_executor(None, self.storage.close)
        log.info("stopped", node=self.node_id)

    async def _expiry_loop(self) -> None:
        default = self.config.session_timeout_ms / 1000
        while True:
            await asyncio.sleep(max(0.025, self.groups.min_session_timeout(default) / 4))
            self.groups.expire()

    async def _stats_prune_loop(self) -> None:
        while True:
            await asyncio.sleep(STATS_PRUNE_INTERVAL_S)
            self.stats.prune()

    async def _offsets_pull_loop(self) -> None:
        while True:
            await asyncio.sleep(OFFSETS_PULL_INTERVAL_S)
            try:
                await self._pull_slave_offsets(self._client_timeout_s())
            except Exception:
                log.exception("pulling committed offsets from slaves failed")

    def _client_timeout_s(self) -> float:
        return max(0.5, self.config.liveness_timeout_ms / 1000)

    async def _pull_slave_offsets(self, timeout: float) -> None:
        """Max-merge the committed offsets of every live slave into this master's store."""
        slaves = self.state.live_slaves()
        answers = await asyncio.gather(
            *(self._client.replica_offsets(s.url, timeout=timeout) for s in slaves), return_exceptions=True
        )
        for slave, answer in zip(slaves, answers, strict=True):
            if isinstance(answer, BrokerError):
                log.debug("cannot pull committed offsets from slave", slave=slave.id, error=str(answer))
                continue
            if isinstance(answer, BaseException):
                raise answer
            try:
                if await self.groups.merge(answer):
                    log.info("merged committed offsets from slave", slave=slave.id)
            except ValueError as exc:
                log.error("malformed committed offsets from slave", slave=slave.id, error=str(exc))
            except GroupError as exc:
                log.error("cannot store committed offsets merged from slave", slave=slave.id, error=str(exc))

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.storage.fsync_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await loop.run_in_executor(None, self.storage.flush_all)
            except (OSError, StorageError) as exc:
                log.error("fsync failed", error=str(exc))

    async def _retention_loop(self) -> None:
        interval = self.config.storage.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.storage.apply_retention(fmt.now_ms())
            except (OSError, StorageError) as exc:
                log.error("retention failed", error=str(exc))

    # -- wake-ups ----------------------------------------------------------------------------------

    def notify_append(self, topic: str, partition: int) -> None:
        """Wake every fetch long-polling on this partition (after a produce or a replica append)."""
        events = self._waiters.get((topic, partition))
        if events:
            for ev in events:
                ev.set()

    def _wake_acks(self) -> None:
        # a slave going down shrinks the set acks=all waits for
        for events in self._ack_waiters.values():
            for ev in events:
                ev.set()

    def _record_replica_progress(self, slave: str, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        progress = self._replicated[key]
        if progress.get(slave) != offset:  # may go down after a slave truncated
            progress[slave] = offset
            for ev in self._ack_waiters.get(key, ()):
                ev.set()

    async def _wait_replicated(self, topic: str, partition: int, needed: int, timeout: float) -> bool:
        key = (topic, partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ev = asyncio.Event()
        self._ack_waiters[key].add(ev)
        try:
            while True:
                progress = self._replicated.get(key, {})
                if all(progress.get(s.id, -1) >= needed for s in self.state.live_slaves()):
                    return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                ev.clear()
                try:
                    await asyncio.wait_for(ev.wait(), remaining)
                except TimeoutError:
                    pass
        finally:
            self._ack_waiters[key].discard(ev)
            if not self._ack_waiters[key]:
                del self._ack_waiters[key]

    # -- middleware --------------------------------------------------------------------------------

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.name
        if route:
            self.stats.requests[route] += 1
        try:
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.limits.max_request_bytes
            return ApiError(413, "too_large", f"request body larger than {limit} bytes").response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
            return ApiError(exc.status, code, exc.reason).response()
        except (StorageError, GroupError) as exc:
            log.error("storage failure", route=route, error=str(exc))
            return ApiError(500, "storage_error", str(exc)).response()
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("request failed", route=route)
            return ApiError(500, "internal_error", "the node failed to handle the request").response()

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        token = self.config.auth_token
        if token and request.path != "/v1/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise ApiError(401, "unauthorized", "missing or wrong bearer token")
        return await handler(request)

    # -- simple endpoints --------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "node": self.node_id,
                "role": self.state.node.role,
                "group": self.state.group.name,
                "status": "stopping" if self._closing else "ok",
            }
        )

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(self.state.metadata())

    async def _openapi(self, request: web.Request) -> web.Response:
        spec = self._openapi_spec
        if spec is None:
            raise ApiError(500, "internal_error", "openapi.yaml is not installed with this node")
        return web.Response(body=spec, content_type="application/yaml")

    async def _get_stats(self, request: web.Request) -> web.Response:
        body = self.stats.as_json(self.node_id)
        if self._replicator is not None:
            body["replication"] = self._replicator.status()
        return web.json_response(body)

    def _known(self, topic: str, partition: int) -> None:
        if self.state.group_of(topic, partition) is None:
            raise ApiError(
                404,
                "unknown_partition",
                f"no partition {topic}/{partition} in the cluster",
                topic=topic,
                partition=partition,
            )

    # -- produce -----------------------------------------------------------------------------------

    async def _produce(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        raw_partition = request.match_info["partition"]
        # ASCII digits only: int() alone also takes "1_0", " 1", "+1" and non-ASCII digits (U+0661),
        # which would write to a partition the path does not name
        if _PARTITION_RE.fullmatch(raw_partition) is None:
            _bad(f"partition must be an integer, got {raw_partition!r}")
        try:
            partition = int(raw_partition)
        except ValueError:  # more digits than int() parses
            _bad(f"partition must be an integer, got {raw_partition[:40]!r}")
        acks = request.query.get("acks", "master")
        if acks not in ("master", "all"):
            _bad(f"acks must be 'master' or 'all', got {acks!r}")
        group = self.state.group_of(topic, partition)
        if group is None:
            raise ApiError(
                404,
                "unknown_partition",
                f"no partition {topic}/{partition} in the cluster",
                topic=topic,
                partition=partition,
            )
        master = group.master
        if master.id != self.node_id:
            if not self.state.alive(master.id):
                raise ApiError(
                    503,
                    "master_unavailable",
                    f"master {master.id} of group {group.name} is down: writes fail until it is back",
                    master=master.id,
                    master_url=master.url,
                )
            raise ApiError(
                421,
                "not_master",
                f"{self.node_id} is not the master of {topic}/{partition}",
                master=master.id,
                master_url=master.url,
            )
        if self._closing:
            raise ApiError(503, "shutting_down", "the node is stopping")
        limit = self.config.limits.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, "too_large", f"request body larger than {limit} bytes")
        ctype = request.headers.get("Content-Type", BATCH_CONTENT_TYPE).split(";")[0].strip()
        if ctype not in (BATCH_CONTENT_TYPE, "application/octet-stream"):
            raise ApiError(415, "bad_content_type", f"expected {BATCH_CONTENT_TYPE}, got {ctype}")
        body = await request.read()
        try:
            infos = fmt.validate(body)
        except fmt.BatchError as exc:
            raise ApiError(400, "malformed_batch", str(exc)) from None
        plog = self._log(topic, partition)
        first, last = plog.append(body, infos)
        self.notify_append(topic, partition)
        if acks == "all" and self.state.group.slaves:
            timeout = self.config.acks_all_timeout_ms / 1000
            if not await self._wait_replicated(topic, partition, last + 1, timeout):
                raise ApiError(
                    504,
                    "replication_timeout",
                    f"slaves did not replicate offset {last} within {timeout}s (the records stay written)",
                    base_offset=first,
                    last_offset=last,
                )
        return web.json_response(
            {
                "topic": topic,
                "partition": partition,
                "base_offset": first,
                "last_offset": last,
                "count": last - first + 1,
                "max_offset": plog.max_offset,
            }
        )

    def _log(self, topic: str, partition: int) -> PartitionLog:
        plog = self.storage.get(topic, partition)
        if plog is None:
            raise ApiError(500, "storage_error", f"partition {topic}/{partition} is not open on this node")
        return plog

    # -- fetch -------------------------------------------------------------------------------------

    def _parse_fetch(self, body: dict[str, Any], default_max: int) -> list[_FetchItem]:
        limit = self.config.limits.max_partitions_per_fetch
        raw = _list(body, "partitions", limit=limit)
        items = []
        for i, p in enumerate(raw):
            where = f"partitions[{i}]."
            p = _obj(p, f"partitions[{i}]")
            items.append(
                _FetchItem(
                    _str(p, "topic", where),
                    _int(p, "partition", where, maximum=2**31 - 1),
                    _int(p, "offset", where),
                    _int(p, "max_bytes", where, default=default_max, minimum=1),
                )
            )
        return items

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        client_id = _str(body, "client_id", default="", empty=True)
        limits = self.config.limits
        max_wait = min(_int(body, "max_wait_ms", default=500), limits.max_wait_ms)
        min_bytes = _int(body, "min_bytes", default=1)
        max_bytes = min(
            _int(body, "max_bytes", default=limits.max_fetch_bytes, minimum=1), limits.max_fetch_bytes
        )
        items = self._parse_fetch(body, max_bytes)
        self.stats.count(client_id, "fetch")
        self.stats.fetch_partitions += len(items)
        self.stats.fetch_started(client_id)
        try:
            return await self._answer_fetch(request, items, max_wait, min_bytes, max_bytes, replica=False)
        finally:
            self.stats.fetch_done(client_id)

    async def _replica_fetch(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        slave = _str(body, "node")
        found = self.cluster.node(slave)
        if found is None or found[0].name != self.state.group.name or found[1].role != "slave":
            _bad(f"node {slave!r} is not a slave of group {self.state.group.name}")
        limits = self.config.limits
        max_wait = min(_int(body, "max_wait_ms", default=500), limits.max_wait_ms)
        min_bytes = _int(body, "min_bytes", default=1)
        max_bytes = min(
            _int(body, "max_bytes", default=limits.max_fetch_bytes, minimum=1), limits.max_fetch_bytes
        )
        items = self._parse_fetch(body, max_bytes)
        if self.state.is_master:
            for it in items:
                if self.state.holds(it.topic, it.partition):
                    self._record_replica_progress(slave, it.topic, it.partition, it.offset)
        return await self._answer_fetch(request, items, max_wait, min_bytes, max_bytes, replica=True)

    async def _answer_fetch(
        self,
        request: web.Request,
        items: list[_FetchItem],
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        *,
        replica: bool,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        event = asyncio.Event()
        keys = {(it.topic, it.partition) for it in items}
        for key in keys:
            self._waiters[key].add(event)
        try:
            while True:
                # planning finds byte ranges from the indexes only; nothing is read until ready
                entries, plans, ready = self._collect(items, min_bytes, max_bytes, replica)
                remaining = deadline - loop.time()
                if ready or remaining <= 0 or self._closing:
                    break
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    pass
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]
        # no await between planning and reading: a plan's file descriptors stay valid until then
        head, data = self._read_answer(entries, plans)
        response = web.StreamResponse(headers={"Content-Type": FETCH_CONTENT_TYPE})
        response.content_length = len(head) + data.nbytes
        await response.prepare(request)
        await response.write(head)
        if data.nbytes:
            await response.write(data)
        await response.write_eof()
        return response

    def _read_answer(
        self, entries: list[dict[str, Any]], plans: list[tuple[PartitionLog, ReadPlan] | None]
    ) -> tuple[bytes, memoryview]:
        """Read every planned range into one buffer (the only copy of the stored bytes before the
        socket); returns the framed head and that buffer."""
        # np.empty, not bytearray: the reads fill every byte, so zeroing it first is a wasted pass
        view = np.empty(sum(plan.size for _, plan in filter(None, plans)), dtype=np.uint8).data
        chunks: list[memoryview] = []
        at = 0
        for planned in plans:
            if planned is None:
                chunks.append(view[at:at])
                continue
            plog, plan = planned
            chunk = view[at : at + plan.size]
            plog.read_into(plan, chunk)
            chunks.append(chunk)
            at += plan.size
        parts = encode_fetch_answer(self.node_id, entries, chunks)  # type: ignore[arg-type]
        return b"".join(parts[:3]), view

    def _collect(
        self, items: list[_FetchItem], min_bytes: int, max_bytes: int, replica: bool
    ) -> tuple[list[dict[str, Any]], list[tuple[PartitionLog, ReadPlan] | None], bool]:
        """Plan every partition once; ``ready`` when the answer should go out without waiting."""
        entries: list[dict[str, Any]] = []
        plans: list[tuple[PartitionLog, ReadPlan] | None] = []
        total = 0
        urgent = False  # a status the client must act on now (moved offset, not served)
        for it in items:
            budget = min(it.max_bytes, max_bytes - total)
            entry, planned, waitable = self._plan_partition(it, budget, total == 0, replica)
            entries.append(entry)
            plans.append(planned)
            if planned is not None:
                total += planned[1].size
            urgent = urgent or not waitable
        return entries, plans, urgent or (total > 0 and total >= min_bytes) or min_bytes == 0

    def _plan_partition(
        self, it: _FetchItem, budget: int, first: bool, replica: bool
    ) -> tuple[dict[str, Any], tuple[PartitionLog, ReadPlan] | None, bool]:
        topic, partition, offset = it.topic, it.partition, it.offset
        entry: dict[str, Any] = {"topic": topic, "partition": partition}
        plog = self.storage.get(topic, partition) if self.state.holds(topic, partition) else None
        if plog is None or (replica and not self.state.is_master):
            group = self.state.group_of(topic, partition)
            if group is None:
                error = "unknown_partition"
            elif replica:
                error = "not_master"
            else:
                error = f"not_served: partition lives on group {group.name}"
            entry.update(
                status=Status.NOT_SERVED.value,
                next_offset=offset,
                min_offset=0,
                max_offset=0,
                suggest=None,
                error=error,
            )
            return entry, None, False
        lo, hi = plog.min_offset, plog.max_offset
        authoritative = replica or self.state.is_master or self.config.offset_check_in_slave
        planned: tuple[PartitionLog, ReadPlan] | None = None
        waitable = False
        if hi == 0:
            status = Status.NO_MESSAGE_IN_QUEUE
            next_offset = 0 if authoritative else offset
            waitable = next_offset == offset
        elif offset < lo:
            status = Status.OFFSET_TOO_SMALL
            next_offset = lo if authoritative else offset
        elif offset == hi:
            status = Status.OFFSET_OVERFLOW_ONE
            next_offset = offset
            waitable = True
        elif offset > hi:
            status = Status.OFFSET_OVERFLOW_BADLY
            next_offset = (0 if lo == 0 else hi) if authoritative else offset
            waitable = not authoritative  # a lagging slave may still get there
        else:
            status = Status.FOUND
            next_offset = offset
            waitable = True
            if budget > 0 or first:
                plan = plog.plan_read(offset, max(budget, 1))
                if plan is not None and (plan.size <= budget or first):
                    planned = (plog, plan)
                    next_offset = plan.next_offset
        entry.update(
            status=status.value,
            next_offset=next_offset,
            min_offset=lo,
            max_offset=hi,
            suggest=None if replica else self._suggest(plog, status, offset, next_offset),
        )
        return entry, planned, waitable

    def _suggest(self, plog: PartitionLog, status: Status, offset: int, next_offset: int) -> str | None:
        threshold = self.config.slave_suggest_lag_bytes
        if self.state.is_master:
            if status is not Status.FOUND or plog.bytes_behind(offset) <= threshold:
                return None
            progress = self._replicated.get((plog.topic, plog.partition), {})
            for slave in self.state.live_slaves():
                end = progress.get(slave.id, -1)
                # the slave must hold where the consumer goes next and be close enough to the head
                # that it will not send the consumer straight back (its lag below half the threshold)
                if end > next_offset and plog.bytes_behind(end) <= threshold // 2:
                    return slave.id
            return None
        # a slave keeps only consumers that are far behind; the rest (near the head, or at an offset
        # this replica cannot judge: too small, too big, empty) go back to the authoritative master
        master = self.state.group.master
        if not self.state.alive(master.id):
            return None
        if status is Status.FOUND and plog.bytes_behind(next_offset) > threshold // 2:
            return None
        return master.id

    # -- offsets -----------------------------------------------------------------------------------

    async def _offsets(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        out = []
        for i, p in enumerate(_list(body, "partitions", limit=self.config.limits.max_partitions_per_fetch)):
            where = f"partitions[{i}]."
            p = _obj(p, f"partitions[{i}]")
            topic = _str(p, "topic", where)
            partition = _int(p, "partition", where, maximum=2**31 - 1)
            spec = _str(p, "spec", where)
            if spec not in ("earliest", "latest", "timestamp"):
                _bad(f"{where}spec: must be earliest, latest or timestamp, got {spec!r}")
            ts = _int(p, "timestamp", where, minimum=-MAX_OFFSET) if spec == "timestamp" else 0
            entry: dict[str, Any] = {"topic": topic, "partition": partition, "offset": None, "error": None}
            plog = self.storage.get(topic, partition) if self.state.holds(topic, partition) else None
            if plog is None:
                entry["error"] = (
                    "unknown_partition" if self.state.group_of(topic, partition) is None else "not_served"
                )
            elif spec == "earliest":
                entry["offset"] = plog.min_offset
            elif spec == "latest":
                entry["offset"] = plog.max_offset
            else:
                entry["offset"] = plog.offset_for_timestamp(ts)
            out.append(entry)
        return web.json_response({"partitions": out})

    # -- groups ------------------------------------------------------------------------------------

    def _coordinator_check(self, request: web.Request) -> str:
        group = request.match_info["group"]
        if not group or len(group) > 255:
            _bad("group name must be 1..255 characters")
        coord = self.state.coordinator(group)
        if coord.id != self.node_id:
            raise ApiError(
                421,
                "not_coordinator",
                f"{self.node_id} is not the coordinator of {group}",
                coordinator=coord.id,
                coordinator_url=coord.url,
            )
        return group

    async def _heartbeat(self, request: web.Request) -> web.Response:
        group = self._coordinator_check(request)
        body = await _json_body(request)
        client_id = _str(body, "client_id")
        topics = _list(body, "topics", default=[], limit=10_000)
        for i, t in enumerate(topics):
            if not isinstance(t, str) or not t:
                _bad(f"topics[{i}]: must be a non-empty string")
        timeout_ms = _int(
            body,
            "session_timeout_ms",
            default=self.config.session_timeout_ms,
            minimum=100,
            maximum=MAX_SESSION_TIMEOUT_MS,
        )
        self.stats.count(client_id, "heartbeat")
        members, version = self.groups.heartbeat(group, client_id, topics, timeout_ms)
        return web.json_response({"members": members, "version": version, "coordinator": self.node_id})

    async def _leave(self, request: web.Request) -> web.Response:
        group = self._coordinator_check(request)
        body = await _json_body(request)
        members, version = self.groups.leave(group, _str(body, "client_id"))
        return web.json_response({"members": members, "version": version})

    def _partition_list(self, raw: list[Any], with_offset: bool) -> list[tuple[str, int, int]]:
        out = []
        for i, p in enumerate(raw):
            where = f"partitions[{i}]." if not with_offset else f"offsets[{i}]."
            p = _obj(p, where.rstrip("."))
            topic = _str(p, "topic", where)
            partition = _int(p, "partition", where, maximum=2**31 - 1)
            self._known(topic, partition)
            out.append((topic, partition, _int(p, "offset", where) if with_offset else 0))
        return out

    async def _commit(self, request: web.Request) -> web.Response:
        group = self._coordinator_check(request)
        body = await _json_body(request)
        client_id = _str(body, "client_id", default="", empty=True)
        force = body.get("force", False)
        if not isinstance(force, bool):
            _bad("force: must be a boolean")
        offsets = self._partition_list(_list(body, "offsets"), with_offset=True)
        self.stats.count(client_id, "commit")
        committed = await self.groups.commit(group, offsets, force)
        return web.json_response({"committed": committed})

    async def _committed(self, request: web.Request) -> web.Response:
        group = self._coordinator_check(request)
        body = await _json_body(request)
        wanted = self._partition_list(_list(body, "partitions", default=[]), with_offset=False)
        return web.json_response({"offsets": self.groups.committed(group, [(t, p) for t, p, _ in wanted])})

    async def _replica_offsets(self, request: web.Request) -> web.Response:
        return web.json_response({"groups": self.groups.offsets_snapshot()})


def _url_port(url: str) -> int:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


# -- process entry point ------------------------------------------------------------------------------


async def _serve(config: BrokerConfig, cluster: ClusterConfig) -> None:
    node = BrokerNode(config, cluster)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            await node.start()
        except (StorageError, GroupError, OSError) as exc:
            # a clear line instead of a traceback: data dir unusable, port taken, ...
            log.error("cannot start", node=config.node_id, error=str(exc))
            raise SystemExit(1) from None
        print(f"mqd broker {config.node_id} listening on {node.url}", flush=True)
        await stop.wait()
        log.info("stopping", node=config.node_id)
    finally:
        await node.stop()


def run_node(config_path: Path) -> None:
    """The ``mqd broker --config`` command: run one node until SIGTERM/SIGINT."""
    import uvloop

    from mqd import log as mqd_log

    config, cluster = load_broker_config(config_path)
    mqd_log.configure(config.log_level, config.log_format)
    started = time.monotonic()
    uvloop.run(_serve(config, cluster))
    log.info("exited", node=config.node_id, uptime_s=round(time.monotonic() - started, 1))
