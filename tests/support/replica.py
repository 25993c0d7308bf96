"""Replica calls from a test, signed as one node of a LocalCluster (its replica credentials).

Since issue 13 the replica routes answer only a node's proven peers; a test that reads a node's
committed offsets the way its peer does goes through here. :class:`FakeMaster` is the attacker of
issue 13 case 2: a process answering at a master's address without its secret.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from mqd.broker.replica_auth import HEADER_NODE
from mqd.broker.replica_client import ReplicaClient
from mqd.testing import LocalCluster
from mqd.wire.protocol import encode_fetch_answer


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


class FakeMaster:
    """A process at the master's address that does not know the master's secret: it records what
    the slave sends and answers every replica fetch with "the log is empty" (which made a slave on
    main truncate to 0) and every offsets pull with an empty snapshot, claiming to be ``node_id``."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self._runner: web.AppRunner | None = None

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((request.path, dict(request.headers), body))
        asked = json.loads(body)["partitions"]
        entries = [
            {
                "topic": p["topic"],
                "partition": p["partition"],
                "status": "OFFSET_OVERFLOW_BADLY",
                "next_offset": 0,
                "min_offset": 0,
                "max_offset": 0,
                "suggest": None,
            }
            for p in asked
        ]
        parts = encode_fetch_answer(self.node_id, entries, [b""] * len(entries))
        return web.Response(
            body=b"".join(parts),
            content_type="application/x-mqd-fetch",
            headers={HEADER_NODE: self.node_id, "X-Mqd-Replica-Signature": "0" * 64},
        )

    async def _offsets(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.headers), await request.read()))
        return web.json_response({"groups": {}})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def start(self, port: int) -> None:
        app = web.Application()
        app.router.add_post("/v1/replica/fetch", self._fetch)
        app.router.add_get("/v1/replica/offsets", self._offsets)
        app.router.add_get("/v1/health", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def fetched_replica(fake: FakeMaster) -> int:
    """How many replica fetches ``fake`` received."""
    return sum(1 for path, _, _ in fake.requests if path == "/v1/replica/fetch")
