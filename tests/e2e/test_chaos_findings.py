"""Bugs the chaos run found, pinned as tests against real brokers behind the fault proxy.

``make chaos`` seed 7 (round 20, corrupted answers): a daemon's commit answer arrived with one byte
inverted; ``BrokerClient._request`` let the ``UnicodeDecodeError`` of ``json.loads`` escape instead
of raising a retriable ``BrokerError``, so the consumer's periodic commit task (which handles
``ConsumerError`` only) died silently, the daemon committed nothing more, and exited 1 on SIGTERM.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mqd_dev.chaos.proxy import FaultProxy, Faults
from support.harness import Cluster

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError


async def test_corrupted_json_answers_are_retriable_broker_errors(cluster_factory: Any) -> None:
    """Every JSON endpoint, answered through a proxy that inverts one byte of every answer chunk:
    each call either succeeds or raises BrokerError with ``retriable`` set, never a bare
    ValueError/KeyError (callers catch BrokerError; anything else kills their loop)."""
    cluster: Cluster = cluster_factory(topics={"events": 1})
    port = int(cluster.url(cluster.master()).rsplit(":", 1)[1])
    proxy = FaultProxy(port, seed=5)
    await proxy.start()
    url = proxy.url
    escaped: list[str] = []
    try:
        async with BrokerClient(request_timeout=5.0) as client:
            await client.produce(url, "events", 0, fmt.encode_batch([b"x"]))  # clean: a partition with data
            proxy.faults = Faults(corrupt=1.0)
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: client.metadata(url),
                lambda: client.commit(url, "g", "c1", [{"topic": "events", "partition": 0, "offset": 1}]),
                lambda: client.heartbeat(url, "g", "c1", ["events"], 10_000),
                lambda: client.committed(url, "g"),
                lambda: client.list_offsets(url, [{"topic": "events", "partition": 0, "spec": "latest"}]),
                lambda: client.produce(url, "events", 0, fmt.encode_batch([b"y"])),
            ]
            for _ in range(5):
                for call in calls:
                    try:
                        await call()
                    except BrokerError as exc:
                        assert exc.retriable or exc.status in (400, 404, 413), exc
                    except Exception as exc:  # what this test looks for
                        escaped.append(f"{type(exc).__name__}: {exc}")
    finally:
        await proxy.stop()
    assert proxy.stats.injected.get("corrupt", 0) > 0
    assert not escaped, f"{len(escaped)} non-BrokerError exceptions escaped BrokerClient: {escaped[:3]}"
