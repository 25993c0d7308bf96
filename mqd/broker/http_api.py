"""The broker's HTTP API (docs/protocol.md, mqd/broker/openapi.yaml): routes, middlewares, handlers.

Each handler checks its request (:mod:`mqd.broker.request_parsing`), calls the mechanism that owns
the work (storage, long polling, replica progress, consumer groups) and builds the answer; errors
become JSON answers in one middleware. Produce is for masters only; ``acks=all`` waits for the
live slaves (:mod:`mqd.broker.replica_progress`). The node's lifecycle (binding, background loops,
shutdown order) is :mod:`mqd.broker.server`'s.

Replica routes (``/v1/replica/*``) do not take the client token: the caller proves it is a replica
peer of this node with a signature (:mod:`mqd.broker.replica_auth`), a master records progress only
for the slave that signed, and 200 answers are signed back so the caller knows who answered.

Handling is bounded: bodies are read within ``limits.body_timeout_ms`` (408), fetches held at once
are capped by ``limits.max_long_polls`` (429 with Retry-After), and 4xx answers are counted and
logged at most once per interval (:mod:`mqd.broker.rejected_requests`), never with a traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import structlog
from aiohttp import web

from mqd.broker.client_stats import ClientStats
from mqd.broker.cluster_state import ClusterState
from mqd.broker.consumer_groups import ConsumerGroupError, ConsumerGroupStore
from mqd.broker.fetch_plan import FetchItem, FetchPlan, FetchPlanner
from mqd.broker.long_poll import LongPoll, LongPollFull
from mqd.broker.rejected_requests import WARNED_STATUSES, RejectedRequests
from mqd.broker.replica_auth import HEADER_NONCE, ReplicaAuth, ReplicaAuthError
from mqd.broker.replica_progress import ReplicaProgress
from mqd.broker.request_parsing import (
    MAX_OFFSET,
    MAX_PARTITION,
    ApiError,
    bad,
    check_record_sizes,
    int_field,
    json_body,
    list_field,
    obj_value,
    read_body,
    str_field,
)
from mqd.broker.storage import PartitionLog, Storage, StorageError
from mqd.config import BrokerConfig, ClusterConfig
from mqd.topic_name import topic_name_problem
from mqd.wire import format as fmt
from mqd.wire.incarnation import MAX_LINEAGE, is_valid_id
from mqd.wire.protocol import BATCH_CONTENT_TYPE, FETCH_CONTENT_TYPE

log = structlog.get_logger(__name__)

MAX_SESSION_TIMEOUT_MS = 3_600_000
LONG_POLL_RETRY_AFTER_S = 1  # a held fetch ends within max_wait_ms; the client backs off with jitter too
_PARTITION_RE = re.compile(r"-?[0-9]+")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@functools.cache
def openapi_spec() -> bytes | None:
    """The OpenAPI description shipped in the package (mqd/broker/openapi.yaml), read once; None
    when the install lacks it (GET /v1/openapi.yaml then answers 500, the node still serves)."""
    try:
        return resources.files(__package__ or "mqd.broker").joinpath("openapi.yaml").read_bytes()
    except OSError as exc:
        log.error("openapi.yaml is missing from the mqd install", error=str(exc))
        return None


class BrokerApi:
    """The aiohttp application of one node over its mechanisms; :attr:`app` is what the node serves."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        cluster: ClusterConfig,
        state: ClusterState,
        storage: Storage,
        consumer_groups: ConsumerGroupStore,
        stats: ClientStats,
        long_poll: LongPoll,
        replica_progress: ReplicaProgress,
        replication_status: Callable[[], dict[str, Any] | None],
        replica_auth: ReplicaAuth | None = None,
        writes_refused: Callable[[], str | None] = lambda: None,
        node_problems: Callable[[], list[str]] = list,
        scrub_status: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.node_id = config.node_id
        self.state = state
        self.storage = storage
        self.consumer_groups = consumer_groups
        self._scrub_status = scrub_status
        self.stats = stats
        self.long_poll = long_poll
        self.replica_progress = replica_progress
        self._replication_status = replication_status
        self.replica_auth = replica_auth
        self._writes_refused = writes_refused
        self._node_problems = node_problems
        self._planner = FetchPlanner(config, state, storage, replica_progress)
        self._openapi_spec = openapi_spec()
        self._body_timeout_s = config.limits.body_timeout_ms / 1000
        self.rejected = RejectedRequests()
        self.closing = False  # the node is stopping: health says so, produce refuses
        self.app = self._build_app()

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

    # -- middleware --------------------------------------------------------------------------------

    @web.middleware
    async def _error_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.name
        if route:
            self.stats.requests[route] += 1
        try:
            return await handler(request)
        except ApiError as exc:
            resp = self._refuse(request, exc)
            if exc.close:
                # the unread rest of the body would otherwise be drained for lingering_time
                await resp.prepare(request)
                await resp.write_eof()
                request.protocol.force_close()  # closes once the answer is flushed
            return resp
        except LongPollFull as exc:
            return self._refuse(
                request,
                ApiError(
                    429,
                    "too_many_long_polls",
                    f"{exc}: retry after {LONG_POLL_RETRY_AFTER_S}s",
                    headers={"Retry-After": str(LONG_POLL_RETRY_AFTER_S)},
                    retry_after_ms=LONG_POLL_RETRY_AFTER_S * 1000,
                ),
            )
        except web.HTTPRequestEntityTooLarge:
            limit = self.config.limits.max_request_bytes
            return self._refuse(
                request, ApiError(413, "too_large", f"request body larger than {limit} bytes")
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
            return self._refuse(request, ApiError(exc.status, code, exc.reason))
        except (StorageError, ConsumerGroupError) as exc:
            log.error("storage failure", route=route, error=str(exc))
            return ApiError(500, "storage_error", str(exc)).response()
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("request failed", route=route)
            return ApiError(500, "internal_error", "the node failed to handle the request").response()

    def _refuse(self, request: web.Request, exc: ApiError) -> web.Response:
        """The error answer; a 4xx is counted, and the ones where the node protected itself are
        logged (rate-limited): a client's mistake must not cost the node a log line each."""
        if 400 <= exc.status < 500:
            if exc.status in WARNED_STATUSES:
                self.rejected.record(
                    exc.status, exc.reason, route=request.match_info.route.name, remote=request.remote
                )
            else:
                self.rejected.count(exc.status)
        return exc.response()

    async def _json(self, request: web.Request) -> dict[str, Any]:
        return await json_body(request, self._body_timeout_s)

    @web.middleware
    async def _auth_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/replica/"):
            # replica peers prove who they are by signature, never by the token every client holds
            await self._verify_replica(request)
            return await handler(request)
        token = self.config.auth_token
        if token and request.path != "/v1/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise ApiError(401, "unauthorized", "missing or wrong bearer token")
        return await handler(request)

    async def _verify_replica(self, request: web.Request) -> None:
        """Sets ``request["replica_peer"]`` to the node that signed the call; 401/403 otherwise."""
        auth = self.replica_auth
        if auth is None:
            raise ApiError(
                403, "replica_forbidden", f"{self.node_id} has no replica peers (no replica_credentials)"
            )
        body = await read_body(request, self._body_timeout_s)
        try:
            request["replica_peer"] = auth.verify_request(request.method, request.path, request.headers, body)
        except ReplicaAuthError as exc:
            code = "replica_forbidden" if exc.status == 403 else "replica_unauthorized"
            raise ApiError(exc.status, code, str(exc)) from None
        request["replica_nonce"] = request.headers[HEADER_NONCE]

    # -- simple endpoints --------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        # 200 even when degraded: the node still serves reads, so peers must keep it alive
        disk = self.storage.disk
        disk.probe_soon()  # answers from the last probe; a full or read-only disk shows within 1 s
        reasons = [] if disk.problem is None else [disk.problem]
        # a fenced range is data this node cannot serve: an operator must hear of it (issue 12)
        reasons += [
            f"{topic}-{partition}: offsets {first}..{last} fenced (damaged or missing, not repaired): "
            "fetches there answer DATA_LOST"
            for topic, partition, first, last in self.storage.fenced()
        ]
        reasons += self._node_problems()  # writes refused, replication parked or unverified
        body: dict[str, Any] = {
            "node": self.node_id,
            "role": self.state.node.role,
            "group": self.state.broker_group.name,
            "status": "stopping" if self.closing else "degraded" if reasons else "ok",
        }
        if reasons:
            body["reasons"] = reasons
        return web.json_response(body)

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(self.state.metadata())

    async def _openapi(self, request: web.Request) -> web.Response:
        spec = self._openapi_spec
        if spec is None:
            raise ApiError(500, "internal_error", "openapi.yaml is not installed with this node")
        return web.Response(body=spec, content_type="application/yaml")

    async def _get_stats(self, request: web.Request) -> web.Response:
        body = self.stats.as_json(self.node_id)
        body["rejected"] = self.rejected.as_json()
        body["long_polls_held"] = self.long_poll.held
        fenced = self.storage.fenced()
        body["fenced_offsets"] = sum(last - first + 1 for _, _, first, last in fenced)
        body["fenced"] = [
            {"topic": topic, "partition": partition, "first": first, "last": last}
            for topic, partition, first, last in fenced
        ]
        if self._scrub_status is not None:
            body["scrub"] = self._scrub_status()  # the segment scrub's counters (scrub.py)
        replication = self._replication_status()
        if replication is not None:
            body["replication"] = replication
        return web.json_response(body)

    def _known(self, topic: str, partition: int) -> None:
        if self.state.broker_group_of(topic, partition) is None:
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
            bad(f"partition must be an integer, got {raw_partition!r}")
        try:
            partition = int(raw_partition)
        except ValueError:  # more digits than int() parses
            bad(f"partition must be an integer, got {raw_partition[:40]!r}")
        acks = request.query.get("acks", "master")
        if acks not in ("master", "all"):
            bad(f"acks must be 'master' or 'all', got {acks!r}")
        broker_group = self.state.broker_group_of(topic, partition)
        if broker_group is None:
            raise ApiError(
                404,
                "unknown_partition",
                f"no partition {topic}/{partition} in the cluster",
                topic=topic,
                partition=partition,
            )
        master = broker_group.master
        if master.id != self.node_id:
            if not self.state.alive(master.id):
                raise ApiError(
                    503,
                    "master_unavailable",
                    f"master {master.id} of group {broker_group.name} is down: writes fail until it is back",
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
        if self.closing:
            raise ApiError(503, "shutting_down", "the node is stopping")
        refused = self._writes_refused()
        if refused is not None:
            raise ApiError(503, "data_dir_unverified", refused)
        limit = self.config.limits.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, "too_large", f"request body larger than {limit} bytes", close=True)
        ctype = request.headers.get("Content-Type", BATCH_CONTENT_TYPE).split(";")[0].strip()
        if ctype not in (BATCH_CONTENT_TYPE, "application/octet-stream"):
            raise ApiError(415, "bad_content_type", f"expected {BATCH_CONTENT_TYPE}, got {ctype}")
        body = await read_body(request, self._body_timeout_s)
        try:
            infos = fmt.validate(body)
        except fmt.BatchError as exc:
            raise ApiError(400, "malformed_batch", str(exc)) from None
        check_record_sizes(body, infos, self.config.limits.max_record_bytes)
        plog = self._log(topic, partition)
        first, last = plog.append(body, infos)
        self.long_poll.notify(topic, partition)
        if acks == "all" and self.state.broker_group.slaves:
            timeout = self.config.acks_all_timeout_ms / 1000
            if not await self.replica_progress.wait_replicated(topic, partition, last + 1, timeout):
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

    def _fetch_limits(self, body: dict[str, Any]) -> tuple[int, int, int]:
        """``(max_wait_ms, min_bytes, max_bytes)`` of a fetch, capped by the node's limits."""
        limits = self.config.limits
        max_wait = min(int_field(body, "max_wait_ms", default=500), limits.max_wait_ms)
        min_bytes = int_field(body, "min_bytes", default=1)
        max_bytes = min(
            int_field(body, "max_bytes", default=limits.max_fetch_bytes, minimum=1), limits.max_fetch_bytes
        )
        return max_wait, min_bytes, max_bytes

    def _parse_fetch(self, body: dict[str, Any], default_max: int) -> list[FetchItem]:
        raw = list_field(body, "partitions", limit=self.config.limits.max_partitions_per_fetch)
        items = []
        for i, p in enumerate(raw):
            where = f"partitions[{i}]."
            p = obj_value(p, f"partitions[{i}]")
            incarnation = p.get("incarnation")
            if incarnation is not None and not is_valid_id(incarnation):
                bad(f"{where}incarnation: 32 lowercase hex characters or null, got {incarnation!r:.80}")
            items.append(
                FetchItem(
                    str_field(p, "topic", where),
                    int_field(p, "partition", where, maximum=MAX_PARTITION),
                    int_field(p, "offset", where),
                    int_field(p, "max_bytes", where, default=default_max, minimum=1),
                    incarnation,
                    self._parse_lineage(p, where),
                )
            )
        return items

    @staticmethod
    def _parse_lineage(p: dict[str, Any], where: str) -> tuple[tuple[str, int], ...]:
        """A partition's optional ``lineage``: ``[{"id": ..., "end": ...}, ...]``, oldest first."""
        lineage = p.get("lineage", [])
        if not isinstance(lineage, list) or len(lineage) > MAX_LINEAGE:
            bad(f"{where}lineage: a list of at most {MAX_LINEAGE} entries, got {lineage!r:.80}")
        out = []
        for j, raw in enumerate(lineage):
            at = f"{where}lineage[{j}]"
            e = obj_value(raw, at)
            if not is_valid_id(e.get("id")):
                bad(f"{at}.id: 32 lowercase hex characters, got {e.get('id')!r:.80}")
            out.append((str(e["id"]), int_field(e, "end", f"{at}.")))
        return tuple(out)

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        client_id = str_field(body, "client_id", default="", empty=True)
        max_wait, min_bytes, max_bytes = self._fetch_limits(body)
        items = self._parse_fetch(body, max_bytes)
        changes_only = body.get("changes_only", False)
        if not isinstance(changes_only, bool):
            bad(f"changes_only: true or false, got {changes_only!r:.80}")
        self.stats.count(client_id, "fetch")
        self.stats.fetch_partitions += len(items)
        self.stats.fetch_started(client_id)
        try:
            return await self._answer_fetch(
                request, items, max_wait, min_bytes, max_bytes, replica=False, changes_only=changes_only
            )
        finally:
            self.stats.fetch_done(client_id)

    async def _replica_fetch(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        peer: str = request["replica_peer"]  # proved by its signature (_verify_replica)
        named = body.get("node", peer)
        if named != peer:
            raise ApiError(403, "replica_forbidden", f"node {peer!r} may not speak for node {named!r}")
        max_wait, min_bytes, max_bytes = self._fetch_limits(body)
        items = self._parse_fetch(body, max_bytes)
        nonce: str = request["replica_nonce"]
        auth = self.replica_auth
        assert auth is not None

        def sign(head: bytes, data: memoryview) -> dict[str, str]:
            return auth.sign_answer(nonce, 200, [head, data])

        if not self.state.is_master:
            # the master recovering its log (master_recovery.py) reads this slave's like a consumer
            return await self._answer_fetch(
                request, items, 0, min_bytes, max_bytes, replica=False, sign=sign, with_history=True
            )
        refused = self._writes_refused()
        if refused is not None:  # do not let slaves follow a log that is not yet recovered
            raise ApiError(503, "data_dir_unverified", refused)
        for it in items:
            if self.state.holds(it.topic, it.partition):
                self.replica_progress.record(peer, it.topic, it.partition, it.offset)
        return await self._answer_fetch(
            request, items, max_wait, min_bytes, max_bytes, replica=True, sign=sign
        )

    async def _answer_fetch(
        self,
        request: web.Request,
        items: list[FetchItem],
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        *,
        replica: bool,
        sign: Callable[[bytes, memoryview], dict[str, str]] | None = None,
        with_history: bool = False,
        changes_only: bool = False,
    ) -> web.StreamResponse:
        keys = [(it.topic, it.partition) for it in items]

        def attempt() -> tuple[FetchPlan, bool]:
            return self._planner.plan(items, min_bytes, max_bytes, replica, changes_only=changes_only)

        # replica fetches are not capped: there are only as many as slaves, and acks=all needs them
        plan = await self.long_poll.hold(keys, max_wait_ms / 1000, attempt, capped=not replica)
        if with_history:  # a slave answering its recovering master: which records its offsets name
            for i, entry in enumerate(plan.entries):
                plog = self.storage.get(entry.topic, entry.partition)
                if plog is not None and entry.history is None:
                    plan.entries[i] = dataclasses.replace(entry, history=tuple(plog.history))
        # no await between the last plan and reading it: its file descriptors stay valid until then
        head, data = self._planner.read(self.node_id, plan)
        headers = {"Content-Type": FETCH_CONTENT_TYPE}
        if sign is not None:
            headers.update(sign(head, data))
        response = web.StreamResponse(headers=headers)
        response.content_length = len(head) + data.nbytes
        await response.prepare(request)
        await response.write(head)
        if data.nbytes:
            await response.write(data)
        await response.write_eof()
        return response

    # -- offsets -----------------------------------------------------------------------------------

    async def _offsets(self, request: web.Request) -> web.Response:
        body = await self._json(request)
        out = []
        limit = self.config.limits.max_partitions_per_fetch
        for i, p in enumerate(list_field(body, "partitions", limit=limit)):
            where = f"partitions[{i}]."
            p = obj_value(p, f"partitions[{i}]")
            topic = str_field(p, "topic", where)
            partition = int_field(p, "partition", where, maximum=MAX_PARTITION)
            spec = str_field(p, "spec", where)
            if spec not in ("earliest", "latest", "timestamp"):
                bad(f"{where}spec: must be earliest, latest or timestamp, got {spec!r}")
            ts = int_field(p, "timestamp", where, minimum=-MAX_OFFSET) if spec == "timestamp" else 0
            entry: dict[str, Any] = {"topic": topic, "partition": partition, "offset": None, "error": None}
            plog = self.storage.get(topic, partition) if self.state.holds(topic, partition) else None
            if plog is None:
                unknown = self.state.broker_group_of(topic, partition) is None
                entry["error"] = "unknown_partition" if unknown else "not_served"
            elif spec == "earliest":
                entry["offset"] = plog.min_offset
            elif spec == "latest":
                entry["offset"] = plog.max_offset
            else:
                entry["offset"] = plog.offset_for_timestamp(ts)
            out.append(entry)
        return web.json_response({"partitions": out})

    # -- consumer groups ---------------------------------------------------------------------------

    def _coordinator_check(self, request: web.Request) -> str:
        consumer_group = request.match_info["group"]
        if not consumer_group or len(consumer_group) > 255:
            bad("group name must be 1..255 characters")
        coord = self.state.coordinator(consumer_group)
        if coord.id != self.node_id:
            raise ApiError(
                421,
                "not_coordinator",
                f"{self.node_id} is not the coordinator of {consumer_group}",
                coordinator=coord.id,
                coordinator_url=coord.url,
            )
        return consumer_group

    async def _heartbeat(self, request: web.Request) -> web.Response:
        consumer_group = self._coordinator_check(request)
        body = await self._json(request)
        client_id = str_field(body, "client_id")
        topics = list_field(body, "topics", default=[], limit=10_000)
        for i, t in enumerate(topics):
            problem = topic_name_problem(t)
            if problem is not None:
                bad(f"topics[{i}]: {problem}")
        timeout_ms = int_field(
            body,
            "session_timeout_ms",
            default=self.config.session_timeout_ms,
            minimum=100,
            maximum=MAX_SESSION_TIMEOUT_MS,
        )
        self.stats.count(client_id, "heartbeat")
        members, version = self.consumer_groups.heartbeat(consumer_group, client_id, topics, timeout_ms)
        return web.json_response({"members": members, "version": version, "coordinator": self.node_id})

    async def _leave(self, request: web.Request) -> web.Response:
        consumer_group = self._coordinator_check(request)
        body = await self._json(request)
        members, version = self.consumer_groups.leave(consumer_group, str_field(body, "client_id"))
        return web.json_response({"members": members, "version": version})

    def _partition_list(self, raw: list[Any], with_offset: bool) -> list[tuple[str, int, int]]:
        out = []
        for i, p in enumerate(raw):
            where = f"partitions[{i}]." if not with_offset else f"offsets[{i}]."
            p = obj_value(p, where.rstrip("."))
            topic = str_field(p, "topic", where)
            partition = int_field(p, "partition", where, maximum=MAX_PARTITION)
            self._known(topic, partition)
            out.append((topic, partition, int_field(p, "offset", where) if with_offset else 0))
        return out

    async def _commit(self, request: web.Request) -> web.Response:
        consumer_group = self._coordinator_check(request)
        body = await self._json(request)
        client_id = str_field(body, "client_id", default="", empty=True)
        force = body.get("force", False)
        if not isinstance(force, bool):
            bad("force: must be a boolean")
        offsets = self._partition_list(list_field(body, "offsets"), with_offset=True)
        self.stats.count(client_id, "commit")
        committed = await self.consumer_groups.commit(consumer_group, offsets, force)
        return web.json_response({"committed": committed})

    async def _committed(self, request: web.Request) -> web.Response:
        consumer_group = self._coordinator_check(request)
        body = await self._json(request)
        wanted = self._partition_list(list_field(body, "partitions", default=[]), with_offset=False)
        partitions = [(t, p) for t, p, _ in wanted]
        return web.json_response({"offsets": self.consumer_groups.committed(consumer_group, partitions)})

    async def _replica_offsets(self, request: web.Request) -> web.Response:
        auth = self.replica_auth
        assert auth is not None  # _verify_replica let the call through
        body = json.dumps({"groups": self.consumer_groups.offsets_snapshot()}).encode()
        headers = auth.sign_answer(request["replica_nonce"], 200, [body])
        return web.Response(body=body, content_type="application/json", headers=headers)
