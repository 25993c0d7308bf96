"""Finding a consumer group's coordinator: the one FindCoordinator call both group protocols make
(group.py, classic; consumer_group_protocol.py, KIP-848) before their requests, which go on a
connection of their own (aiokafka's COORDINATION group: never behind a long-polling fetch)."""

from __future__ import annotations

import asyncio

from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.protocol.coordination import FindCoordinatorRequest

COORDINATION = ConnectionGroup.COORDINATION


async def find_coordinator(client: AIOKafkaClient, group: str, timeout: float) -> tuple[int, int]:
    """(error code, coordinator node id) of ``group``, asked of any node (key type 0: a group),
    within ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        resp = await client.send(client.get_random_node(), FindCoordinatorRequest(group, 0))
    return resp.error_code, resp.coordinator_id


__all__ = ["COORDINATION", "find_coordinator"]
