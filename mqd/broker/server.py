"""One broker node's lifecycle: what it builds, the order it starts and stops in, its background loops.

A node serves the HTTP API of docs/protocol.md (:mod:`mqd.broker.http_api`) over its partition logs
(:mod:`mqd.broker.storage`). Each mechanism has its own file: long polling (long_poll.py), acks=all
and slave progress (replica_progress.py), fetch planning (fetch_plan.py, with the offset table of
offset_check.py and the pull suggestion of pull_suggestion.py), consumer groups and committed
offsets (consumer_groups.py), replication on a slave (replication.py), committed offsets pulled
from the slaves on a master (offsets_pull.py), liveness of the peers (cluster_state.py).

This file starts them in order (consumer groups and storage, then the master's first pull of its
slaves' committed offsets, liveness, replication, then the listening socket) and stops them in the
reverse order, and runs the periodic work: consumer-group expiry, client-stats pruning, fsync on an
interval, retention, giving memory back after a burst of long polls (memory_trim.py), and the CRC
scrub of closed segments (scrub.py), whose fenced ranges it hands to the repair path of its role.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from mqd.broker.client_stats import ClientStats
from mqd.broker.cluster_state import ClusterState
from mqd.broker.consumer_groups import ConsumerGroupError, ConsumerGroupStore
from mqd.broker.http_api import BrokerApi
from mqd.broker.long_poll import LongPoll
from mqd.broker.master_recovery import MasterRecovery
from mqd.broker.node_marker import check_marker, read_marker, write_marker
from mqd.broker.offsets_pull import SlaveOffsetsPull
from mqd.broker.rejected_requests import ParserErrorLog
from mqd.broker.replica_auth import ReplicaAuth, load_credentials, peers_of
from mqd.broker.replica_client import ReplicaClient
from mqd.broker.replica_floor import ReplicaFloor
from mqd.broker.replica_progress import ReplicaProgress
from mqd.broker.replication import Replicator
from mqd.broker.scrub import SegmentScrubber
from mqd.broker.storage import PartitionLog, Storage, StorageError
from mqd.config import BrokerConfig, ClusterConfig, ConfigError, load_broker_config
from mqd.header_deadline import BoundedAppRunner
from mqd.memory_trim import TRIM_CHECK_INTERVAL_S, burst_ended, trim_heap
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient

log = structlog.get_logger(__name__)

SHUTDOWN_DRAIN_S = 5.0  # how long in-flight requests may take to finish on stop
STATS_PRUNE_INTERVAL_S = 60.0
# an idle keep-alive connection is closed after this (aiohttp: 3630 s, one fd each that long);
# above the clients' own 15 s pool keep-alive so a client never reuses a socket the node is closing
KEEPALIVE_TIMEOUT_S = 75.0


class BrokerNode:
    """A broker node. ``start()`` opens storage and binds the HTTP server; ``stop()`` is the ordered,
    idempotent shutdown (stop accepting, let in-flight requests finish, stop tasks, close storage)."""

    def __init__(self, config: BrokerConfig, cluster: ClusterConfig) -> None:
        if (config.tls_cert is None) != (config.tls_key is None):
            raise ConfigError("tls_cert and tls_key must be given together")
        self.config = config
        self.cluster = cluster
        self.node_id = config.node_id
        # liveness probes only: no client token, a process squatting a peer's port learns nothing
        self._client = BrokerClient(request_timeout=10.0, ca_file=config.tls_ca_file)
        self.state = ClusterState(config, cluster, self._client, on_liveness_change=self._on_liveness_change)
        self.replica_auth = self._replica_auth()
        self._replica_client: ReplicaClient | None = None
        if self.replica_auth is not None:
            self._replica_client = ReplicaClient(self.replica_auth, ca_file=config.tls_ca_file)
        # a slave re-copies its master's history after a crash: no incarnation of its own for it
        self.storage = Storage(
            config.data_dir, config.storage, new_incarnation_after_crash=self.state.is_master
        )
        self.consumer_groups = ConsumerGroupStore(config.data_dir)
        self.stats = ClientStats()
        self.long_poll = LongPoll(max_held=config.limits.max_long_polls)
        self.replica_progress = ReplicaProgress(self.state.live_slaves, config.liveness_timeout_ms / 1000)
        self._offsets_pull: SlaveOffsetsPull | None = None
        self._recovery: MasterRecovery | None = None
        if self.state.is_master and self.state.broker_group.slaves:
            assert self._replica_client is not None  # _replica_auth() requires credentials here
            timeout = max(0.5, config.liveness_timeout_ms / 1000)
            self._offsets_pull = SlaveOffsetsPull(
                self.state, self._replica_client, self.consumer_groups, timeout_s=timeout
            )
            self._recovery = MasterRecovery(
                node_id=self.node_id,
                cluster_id=self.replica_auth.cluster_id if self.replica_auth else None,
                storage=self.storage,
                partitions=self.state.partitions,
                slaves=self.state.broker_group.slaves,
                client=self._replica_client,
            )
        self._replicator: Replicator | None = None
        self._floor = ReplicaFloor(config.data_dir)
        if not self.state.is_master:
            assert self._replica_client is not None
            self._replicator = Replicator(
                node_id=self.node_id,
                broker_group=self.state.broker_group,
                storage=self.storage,
                partitions=self.state.partitions,
                client=self._replica_client,
                consumer_groups=self.consumer_groups,
                floor=self._floor,
                on_append=self.long_poll.notify,  # wakes fetches held on a slave
                wait_ms=config.replica_wait_ms,
            )
        self.scrubber = SegmentScrubber(
            self.storage,
            config.storage.scrub_bytes_per_second,
            on_fenced=self._on_scrub_fenced,
            good_copy=self._recovery.good_copy if self._recovery is not None else None,
        )
        self.api = BrokerApi(
            config=config,
            cluster=cluster,
            state=self.state,
            storage=self.storage,
            consumer_groups=self.consumer_groups,
            stats=self.stats,
            long_poll=self.long_poll,
            replica_progress=self.replica_progress,
            replication_status=self._replication_status,
            replica_auth=self.replica_auth,
            writes_refused=self._writes_refused,
            node_problems=self._node_problems,
            scrub_status=self.scrubber.status,
        )
        self._app = (
            self.api.app
        )  # what the node serves (tests/integration/broker/test_openapi.py reads its routes)
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._started = False
        self._stopped = False
        self.url: str | None = None

    def _replica_auth(self) -> ReplicaAuth | None:
        """This node's replica signer; None for a lone master. A group of 2+ nodes needs credentials:
        without them anyone could report replica progress or pose as the master (issue 13)."""
        group = self.state.broker_group
        peers = peers_of(group, self.node_id)
        path = self.config.replica_credentials
        if path is None:
            if len(group.nodes) > 1:
                raise ConfigError(
                    f"node {self.node_id} is in broker group {group.name} with {len(group.nodes)} nodes: "
                    f"replica_credentials is required (generate them with "
                    f"`mqd broker-credentials --cluster <cluster file> --out-dir <dir>`)"
                )
            return None
        return ReplicaAuth(load_credentials(path, self.node_id, peers), peers)

    def _check_marker(self) -> None:
        """Refuse a data dir of another node or cluster; mark a new one, except on a master with
        slaves: that one must consult them first (master_recovery.py)."""
        data_dir = self.config.data_dir
        cluster_id = self.replica_auth.cluster_id if self.replica_auth else None
        marker = read_marker(data_dir)
        if marker is not None:
            check_marker(marker, data_dir, self.node_id, cluster_id)
        elif self._recovery is None:
            write_marker(data_dir, self.node_id, cluster_id, "provisioned")

    # -- lifecycle ---------------------------------------------------------------------------------

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
        await loop.run_in_executor(None, self.consumer_groups.load)
        await loop.run_in_executor(None, self.storage.open, self.state.partitions)
        await loop.run_in_executor(None, self._check_marker)
        await loop.run_in_executor(None, self._floor.load)
        await self._client.start()
        if self._replica_client is not None:
            await self._replica_client.start()
        if self._offsets_pull is not None and self._recovery is not None:
            # before serving, at once (each bounded): take the commits a slave took as coordinator
            # while this master was down, and copy back from the slaves what this log lacks
            await asyncio.gather(self._offsets_pull.start(), self._recovery.start())
        await self.state.start()
        if self._replicator is not None:
            await self._replicator.start()
        self._tasks.append(asyncio.create_task(self._expiry_loop(), name="group-expiry"))
        self._tasks.append(asyncio.create_task(self._stats_prune_loop(), name="stats-prune"))
        self._tasks.append(asyncio.create_task(self._memory_trim_loop(), name="memory-trim"))
        if self.config.storage.fsync == "interval":
            self._tasks.append(asyncio.create_task(self._flush_loop(), name="fsync"))
        if self.config.storage.retention_bytes >= 0 or self.config.storage.retention_ms >= 0:
            self._tasks.append(asyncio.create_task(self._retention_loop(), name="retention"))
        await self.scrubber.start()
        # handler_cancellation: a fetch held for a client that went away is cancelled at once, so
        # its waiter and in-flight count go with it instead of lasting until max_wait_ms
        # logger: a request aiohttp's parser refuses (URL over 8 KiB, ...) is a counted, rate-limited
        # warning, not an error-level traceback per request; lingering_time: a body left unread after
        # an early answer (415, 421...) is drained for body_timeout_ms at most (aiohttp: 10 s);
        # BoundedAppRunner: headers not received within header_timeout_ms are cut (408)
        self._runner = BoundedAppRunner(
            self._app,
            header_timeout_s=self.config.limits.header_timeout_ms / 1000,
            rejected=self.api.rejected,
            shutdown_timeout=SHUTDOWN_DRAIN_S,
            access_log=None,
            handler_cancellation=True,
            logger=ParserErrorLog(self.api.rejected),
            lingering_time=self.config.limits.body_timeout_ms / 1000,
            keepalive_timeout=KEEPALIVE_TIMEOUT_S,
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
            group=self.state.broker_group.name,
            url=self.url,
            partitions=len(self.state.partitions),
        )

    async def stop(self) -> None:
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        self.api.closing = True
        # held long polls answer at once; then the runner stops accepting and drains the rest
        self.long_poll.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._replicator is not None:
            await self._replicator.stop()
        if self._offsets_pull is not None:
            await self._offsets_pull.stop()
        if self._recovery is not None:
            await self._recovery.stop()
        await self.scrubber.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.state.stop()
        await self._client.close()
        if self._replica_client is not None:
            await self._replica_client.close()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.storage.flush_all)
        except (OSError, StorageError) as exc:
            log.error("final fsync failed", node=self.node_id, error=str(exc))
        finally:
            await loop.run_in_executor(None, self.storage.close)
        log.info("stopped", node=self.node_id)

    # -- wiring ------------------------------------------------------------------------------------

    def _on_liveness_change(self) -> None:
        # a slave going down shrinks the set acks=all waits for
        self.replica_progress.wake_all()

    def _on_scrub_fenced(self, plog: PartitionLog, fenced: tuple[int, int]) -> None:
        # a master asks its slaves at once; a slave's replicator asks its master between two
        # fetch rounds whenever its log has fenced ranges (replication.py), so it needs no call
        if self._recovery is not None:
            self._recovery.repair_soon()

    def _replication_status(self) -> dict[str, Any] | None:
        return self._replicator.status() if self._replicator is not None else None

    def _writes_refused(self) -> str | None:
        return self._recovery.writes_refused if self._recovery is not None else None

    def _node_problems(self) -> list[str]:
        """Health reasons beyond the disk: writes refused, replication parked or unverified."""
        out = []
        refused = self._writes_refused()
        if refused is not None:
            out.append(refused)
        if self._replicator is not None:
            out.extend(self._replicator.health_problems())
        return out

    # -- background loops --------------------------------------------------------------------------

    async def _expiry_loop(self) -> None:
        default = self.config.session_timeout_ms / 1000
        while True:
            await asyncio.sleep(max(0.025, self.consumer_groups.min_session_timeout(default) / 4))
            self.consumer_groups.expire()

    async def _stats_prune_loop(self) -> None:
        while True:
            await asyncio.sleep(STATS_PRUNE_INTERVAL_S)
            self.stats.prune()

    async def _memory_trim_loop(self) -> None:
        while True:
            await asyncio.sleep(TRIM_CHECK_INTERVAL_S)
            if burst_ended(self.long_poll.take_peak(), self.long_poll.held):
                trim_heap()

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
        except (StorageError, ConsumerGroupError, OSError) as exc:
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
