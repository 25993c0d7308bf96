"""A source whose fetches wait until the test answers them, for tests that run the real node
fetchers on the loop (tests/unit/consumer/test_fetch_budget_starvation.py, test_fetch_poll_cut.py,
test_fetch_flow_polls.py): the mqd broker source on a given layout, every request written down by
node."""

from __future__ import annotations

import asyncio
from typing import Any

from mqd.config import ConsumerConfig
from mqd.consumer import TopicPartition
from mqd.consumer.source import FetchRequest, FetchResult
from mqd.sources.mqd_broker import MqdBrokerSource
from mqd.wire.metadata import ClusterMetadata
from mqd.wire.protocol import Status, decode_fetch_answer, encode_fetch_answer


class HeldSource(MqdBrokerSource):
    """Every fetch is written down by node and answered only when the test says so (``answer``)."""

    def __init__(self, config: ConsumerConfig, layout: dict[str, Any]) -> None:
        super().__init__(config)
        self.metadata.current = ClusterMetadata.parse(layout)
        self.sent: list[tuple[str, int]] = []  # (node, the request's max_bytes)
        self.asked: list[tuple[str, list[TopicPartition]]] = []  # (node, its partitions in order)
        self.waits: list[tuple[str, int, int]] = []  # (node, max_wait_ms, min_bytes)
        self.pending: dict[str, asyncio.Future[FetchResult]] = {}

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Any:
        self.sent.append((node_id, max_bytes))
        self.waits.append((node_id, max_wait_ms, min_bytes))
        self.asked.append((node_id, [r.tp for r in requests]))
        answer = self.pending[node_id] = asyncio.get_running_loop().create_future()
        return self._wait(answer)

    @staticmethod
    async def _wait(answer: asyncio.Future[FetchResult]) -> FetchResult:
        return await answer

    def answer(
        self,
        node_id: str,
        tp: TopicPartition,
        status: Status,
        next_offset: int,
        log_end: int,
        data: bytes = b"",
        suggest: str | None = None,
    ) -> None:
        """The request in flight to ``node_id`` ends with this answer for ``tp``."""
        entry = {
            "topic": tp.topic,
            "partition": tp.partition,
            "status": status.value,
            "next_offset": next_offset,
            "min_offset": 0,
            "max_offset": log_end,
            "suggest": suggest,
        }
        wire = b"".join(encode_fetch_answer(node_id, [entry], [data]))
        self.pending.pop(node_id).set_result(MqdBrokerSource._result(decode_fetch_answer(wire)))

    def answer_caught_up(self, node_id: str, tp: TopicPartition, end: int) -> None:
        """The long poll ends with nothing new: the partition is still at its log end."""
        self.answer(node_id, tp, Status.OFFSET_OVERFLOW_ONE, end, end)
