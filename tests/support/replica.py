"""Replica calls from a test, signed as one node of a LocalCluster (its replica credentials).

Since issue 13 the replica routes answer only a node's proven peers; a test that reads a node's
committed offsets the way its peer does goes through here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mqd.broker.replica_client import ReplicaClient
from mqd.testing import LocalCluster


@asynccontextmanager
async def replica_client(cluster: LocalCluster, as_node: str) -> AsyncIterator[ReplicaClient]:
    """A started ReplicaClient signing as ``as_node``."""
    rc = ReplicaClient(cluster.replica_auth(as_node))
    await rc.start()
    try:
        yield rc
    finally:
        await rc.close()


async def replica_offsets(cluster: LocalCluster, as_node: str, of_node: str) -> dict[str, Any]:
    """``of_node``'s committed offsets (GET /v1/replica/offsets), asked by its peer ``as_node``."""
    async with replica_client(cluster, as_node) as rc:
        return await rc.offsets(cluster.node_spec(of_node))
