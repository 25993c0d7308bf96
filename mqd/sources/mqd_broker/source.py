"""MqdBrokerSource: the mqd HTTP broker behind the consumer engine's source seam.

Maps the broker's wire shapes (mqd.wire.client, mqd.wire.protocol, mqd.wire.format) onto mqd.consumer.source:
metadata from ``GET /v1/metadata`` (MetadataCache), fetches as one ``POST /v1/fetch`` per node
(status 1:1 from mqd.wire.protocol.Status), offset lookups, the consumer group (heartbeats to the
coordinator broker, the allocation strategy run in the member) and its broker offset store.

Log incarnations (issue 12): every fetch entry names the incarnation its offset belongs to once the
engine knows it; the answer's ``incarnation``, ``diverged_at`` (INCARNATION_CHANGED) and
``lost_first``/``lost_last`` (DATA_LOST) map 1:1 onto the seam's fields. An older broker answers no
incarnation (None: the engine keeps today's behaviour).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Coroutine
from typing import Any

from mqd.config import ConsumerConfig
from mqd.consumer.errors import ConsumerError
from mqd.consumer.source import (
    Cluster,
    ConsumerGroup,
    FetchRequest,
    FetchResult,
    FetchStatus,
    GroupSettings,
    Node,
    PartitionResult,
    PartitionRoute,
    SourceError,
)
from mqd.sources.mqd_broker.coordinator import GroupCoordinator
from mqd.sources.mqd_broker.decode import decode_batches
from mqd.sources.mqd_broker.metadata_cache import MetadataCache
from mqd.sources.mqd_broker.offset_store import BrokerOffsetStore
from mqd.topic_partition import TopicPartition
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.incarnation import MAX_LINEAGE, is_valid_id
from mqd.wire.metadata import ClusterMetadata
from mqd.wire.protocol import FetchAnswer, ProtocolError


def to_cluster(md: ClusterMetadata) -> Cluster:
    """The engine's view of one metadata answer ("slave" becomes "replica")."""
    return Cluster(
        nodes={
            n.id: Node(n.id, n.alive, "master" if n.role == "master" else "replica")
            for n in md.nodes.values()
        },
        partitions={tp: PartitionRoute(p.master, p.replicas) for tp, p in md.partitions.items()},
        topics=md.topics,
    )


def source_error(exc: BrokerError | ProtocolError) -> SourceError:
    """The fetch failure as the engine sees it; the message is the broker error's own."""
    if isinstance(exc, BrokerError):
        kind = "transport" if exc.status is None else f"http_{exc.status}"
        down = exc.status is None or exc.status >= 500
        return SourceError(str(exc), kind=kind, node_down=down, retriable=exc.retriable)
    return SourceError(str(exc), kind="protocol", node_down=False, retriable=True)


class MqdBrokerSource:
    """The mqd broker cluster named by ``config.bootstrap`` (mqd.consumer.source.Source)."""

    # a cancelled fetch closes its connection, and the broker drops the fetch it held with it
    # (handler_cancellation): the next request goes on another connection at once
    cuts_long_polls = True

    def __init__(self, config: ConsumerConfig, *, client: BrokerClient | None = None) -> None:
        self._own_client = client is None
        self.client = client or BrokerClient(
            request_timeout=config.request_timeout,
            auth_token=config.auth_token,
            ca_file=config.tls_ca_file,
        )
        self.client_id = config.effective_client_id
        self.metadata = MetadataCache(
            self.client,
            config.bootstrap,
            refresh_interval=config.metadata_refresh_interval,
            error_backoff=config.error_backoff_ms / 1000,
            request_timeout=min(config.request_timeout, 5.0),
        )
        self._converted: tuple[ClusterMetadata, Cluster] | None = None
        # per node: the last requests list and its encoded JSON (the fetcher reuses an unchanged one)
        self._encoded: dict[str, tuple[list[FetchRequest], bytes]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, timeout: float) -> None:
        if self._own_client:
            await self.client.start()
        await self.metadata.start(timeout=timeout)

    async def stop(self) -> None:
        await self.metadata.stop()
        if self._own_client:
            await self.client.close()

    # -- metadata --------------------------------------------------------------------------------

    @property
    def cluster(self) -> Cluster | None:
        md = self.metadata.current
        return None if md is None else self._convert(md)

    def _convert(self, md: ClusterMetadata) -> Cluster:
        # once per metadata answer, however many readers
        if self._converted is None or self._converted[0] is not md:
            self._converted = (md, to_cluster(md))
        return self._converted[1]

    @property
    def metadata_error(self) -> str | None:
        return self.metadata.last_error

    def add_metadata_listener(self, fn: Callable[[Cluster], None]) -> None:
        def convert(md: ClusterMetadata) -> None:
            fn(self._convert(md))

        self.metadata.add_listener(convert)

    def request_refresh(self) -> None:
        self.metadata.request_refresh()

    # -- fetch -----------------------------------------------------------------------------------

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Coroutine[Any, Any, FetchResult]:
        md = self.metadata.current
        node = md.nodes.get(node_id) if md is not None else None
        if node is None:
            raise SourceError(f"{node_id}: not in the metadata", kind="metadata", node_down=False)
        last = self._encoded.get(node_id)
        if last is not None and last[0] is requests:
            return self._fetch(node.url, last[1], max_wait_ms, min_bytes, max_bytes)
        body: list[dict[str, Any]] = []
        for r in requests:
            entry: dict[str, Any] = {
                "topic": r.tp.topic,
                "partition": r.tp.partition,
                "offset": r.offset,
                "max_bytes": r.max_bytes,
            }
            if r.incarnation is not None:
                entry["incarnation"] = r.incarnation
            if r.lineage:
                entry["lineage"] = [{"id": i, "end": end} for i, end in r.lineage[-MAX_LINEAGE:]]
            body.append(entry)
        encoded = json.dumps(body, separators=(",", ":")).encode()
        self._encoded[node_id] = (requests, encoded)
        return self._fetch(node.url, encoded, max_wait_ms, min_bytes, max_bytes)

    async def _fetch(
        self, url: str, body: bytes, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> FetchResult:
        try:
            answer = await self.client.fetch(
                url,
                body,
                client_id=self.client_id,
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                changes_only=True,  # a partition left out had nothing new (FetchManager.handle_answer)
            )
        except (BrokerError, ProtocolError) as exc:
            raise source_error(exc) from exc
        try:
            return self._result(answer)
        except ProtocolError as exc:
            raise source_error(exc) from exc

    @staticmethod
    def _result(answer: FetchAnswer) -> FetchResult:
        for pf in answer.partitions:
            # it names landed files: never let a malformed one reach the landing
            if pf.incarnation is not None and not is_valid_id(pf.incarnation):
                raise ProtocolError(
                    f"{pf.topic}/{pf.partition}: malformed incarnation {pf.incarnation!r:.80}"
                )
        return FetchResult(
            [
                PartitionResult(
                    tp=TopicPartition(pf.topic, pf.partition),
                    status=FetchStatus(pf.status.value),
                    next_offset=pf.next_offset,
                    log_start=pf.min_offset,
                    log_end=pf.max_offset,
                    suggested_node=pf.suggest,
                    incarnation=pf.incarnation,
                    error=pf.error,
                    decode=functools.partial(decode_batches, pf.data),
                    diverged_at=pf.diverged_at,
                    lost_first=pf.lost_first,
                    lost_last=pf.lost_last,
                )
                for pf in answer.partitions
            ],
            body=answer.buffer,
            nbytes=len(answer.buffer),
        )

    # -- offsets ---------------------------------------------------------------------------------

    async def list_offsets(
        self, node_id: str, tps: list[TopicPartition], spec: str, timestamp: int | None = None
    ) -> dict[TopicPartition, int]:
        md = self.metadata.current
        node = md.nodes.get(node_id) if md is not None else None
        if node is None:
            raise ConsumerError(f"{node_id}: no such node (metadata)", retriable=True)
        body: list[dict[str, Any]] = []
        for tp in tps:
            entry: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition, "spec": spec}
            if spec == "timestamp":
                entry["timestamp"] = timestamp
            body.append(entry)
        try:
            rows = await self.client.list_offsets(node.url, body)
        except BrokerError as exc:
            raise source_error(exc) from exc
        out: dict[TopicPartition, int] = {}
        for row in rows:
            try:
                tp = TopicPartition(str(row["topic"]), int(row["partition"]))
                if row.get("error"):
                    raise ConsumerError(f"{tp}: offset lookup: {row['error']}", retriable=True)
                out[tp] = int(row["offset"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ConsumerError(f"malformed offsets answer {row!r}", retriable=True) from exc
        return out

    # -- consumer group --------------------------------------------------------------------------

    def consumer_group(self, settings: GroupSettings, on_change: Callable[[], None]) -> ConsumerGroup:
        coordinator = GroupCoordinator.from_settings(
            settings, client=self.client, metadata=self.metadata, on_change=on_change
        )
        return ConsumerGroup(coordinator, BrokerOffsetStore(self.client, coordinator))
