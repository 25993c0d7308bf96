"""BrokerOffsetStore: a consumer group's committed offsets on its coordinator broker (cluster mode)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from mqd import metrics
from mqd.client import BrokerClient, BrokerError
from mqd.consumer.errors import ConsumerError
from mqd.consumer.offset_store import OffsetStore
from mqd.sources.mqd_broker.coordinator import GroupCoordinator
from mqd.topic_partition import TopicPartition


class BrokerOffsetStore(OffsetStore):
    """Cluster mode: offsets committed on the group's coordinator broker."""

    def __init__(self, client: BrokerClient, coordinator: GroupCoordinator) -> None:
        super().__init__()
        self._client = client
        self._coordinator = coordinator
        self._lock = asyncio.Lock()  # one commit at a time keeps them ordered

    async def load(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        group = self._coordinator.group
        body = [{"topic": tp.topic, "partition": tp.partition} for tp in tps]
        try:
            rows = await self._coordinator.call(lambda url: self._client.committed(url, group, body))
        except BrokerError as exc:
            raise ConsumerError(f"cannot read committed offsets: {exc}", retriable=True) from exc
        wanted = set(tps)
        out: dict[TopicPartition, int] = {}
        for row in rows:
            try:
                tp = TopicPartition(str(row["topic"]), int(row["partition"]))
                offset = int(row["offset"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ConsumerError(f"malformed committed offset {row!r}", retriable=True) from exc
            if tp in wanted and offset >= 0:
                out[tp] = offset
                self._persisted[tp] = max(offset, self._persisted.get(tp, -1))
        return out

    async def persist(self, tps: Iterable[TopicPartition] | None = None) -> int:
        async with self._lock:
            todo = self.pending(tps)
            if not todo:
                return 0
            body = [{"topic": tp.topic, "partition": tp.partition, "offset": off} for tp, off in todo.items()]
            group, cid = self._coordinator.group, self._coordinator.client_id
            t0 = time.perf_counter()
            try:
                await self._coordinator.call(lambda url: self._client.commit(url, group, cid, body))
            except (BrokerError, ConsumerError) as exc:
                metrics.commits.labels("error").inc()
                self.last_error = str(exc)
                raise ConsumerError(f"offset commit failed: {exc}", retriable=True) from exc
            metrics.commit_latency.observe(time.perf_counter() - t0)
            metrics.commits.labels("ok").inc()
            self.last_error = None
            for tp, off in todo.items():
                self._persisted[tp] = max(off, self._persisted.get(tp, -1))
            return len(todo)
