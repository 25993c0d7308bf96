"""BrokerOffsetStore: a consumer group's committed offsets on its coordinator broker (cluster mode)."""

from __future__ import annotations

from mqd.consumer.errors import ConsumerError
from mqd.consumer.offset_store import CoordinatorOffsetStore
from mqd.sources.mqd_broker.coordinator import GroupCoordinator
from mqd.topic_partition import TopicPartition
from mqd.wire.client import BrokerClient, BrokerError


class BrokerOffsetStore(CoordinatorOffsetStore):
    """Cluster mode: offsets committed on the group's coordinator broker."""

    commit_errors = (BrokerError, ConsumerError)

    def __init__(self, client: BrokerClient, coordinator: GroupCoordinator) -> None:
        super().__init__()
        self._client = client
        self._coordinator = coordinator

    async def _read_committed(self, tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        group = self._coordinator.group
        body = [{"topic": tp.topic, "partition": tp.partition} for tp in tps]
        try:
            rows = await self._coordinator.call(lambda url: self._client.committed(url, group, body))
        except BrokerError as exc:
            raise ConsumerError(f"cannot read committed offsets: {exc}", retriable=True) from exc
        out = []
        for row in rows:
            try:
                out.append((TopicPartition(str(row["topic"]), int(row["partition"])), int(row["offset"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ConsumerError(f"malformed committed offset {row!r}", retriable=True) from exc
        return out

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        body = [{"topic": tp.topic, "partition": tp.partition, "offset": off} for tp, off in offsets.items()]
        group, cid = self._coordinator.group, self._coordinator.client_id
        await self._coordinator.call(lambda url: self._client.commit(url, group, cid, body))
