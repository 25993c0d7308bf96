"""``changes_only`` fetches on a real node (docs/protocol.md): an idle consumer's long poll is
answered with no entry for a partition with nothing new, an append answers with that partition
alone, and a request without the flag (an older client) still gets every partition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
import pytest
from support.harness import Cluster, records_of

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.protocol import FetchAnswer

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(module_cluster_factory: Callable[..., Cluster]) -> Cluster:
    return module_cluster_factory(topics={"events": PARTITIONS}, groups=1, slaves=0)


async def _heads(client: BrokerClient, url: str) -> list[tuple[int, str]]:
    """Every partition's (log end, incarnation), as a consumer learns them from a first answer."""
    for p in range(PARTITIONS):
        await client.produce(url, "events", p, fmt.encode_batch([b"x"]))
    first = await client.fetch(
        url,
        [{"topic": "events", "partition": p, "offset": 0} for p in range(PARTITIONS)],
        max_wait_ms=0,
        changes_only=True,
    )
    assert [e.partition for e in first.partitions] == list(range(PARTITIONS))  # no incarnation named
    out = []
    for e in first.partitions:
        assert e.incarnation is not None
        out.append((e.max_offset, e.incarnation))
    return out


def _at(heads: list[tuple[int, str]]) -> list[dict[str, object]]:
    return [
        {"topic": "events", "partition": p, "offset": end, "incarnation": inc}
        for p, (end, inc) in enumerate(heads)
    ]


async def test_idle_partitions_are_left_out(cluster: Cluster, client: BrokerClient) -> None:
    """At the log end under the known incarnation, every partition is left out of the answer after
    the long poll; the same request without ``changes_only`` answers each OFFSET_OVERFLOW_ONE."""
    url = cluster.url(cluster.master())
    heads = await _heads(client, url)
    started = time.monotonic()
    idle = await client.fetch(url, _at(heads), max_wait_ms=300, changes_only=True)
    assert time.monotonic() - started >= 0.29  # held like any fetch with nothing new
    assert idle.partitions == []
    old = await client.fetch(url, _at(heads), max_wait_ms=0)
    assert [(e.partition, e.status) for e in old.partitions] == [
        (p, "OFFSET_OVERFLOW_ONE") for p in range(PARTITIONS)
    ]


async def test_an_append_answers_with_that_partition_alone(cluster: Cluster, client: BrokerClient) -> None:
    """A held changes_only fetch woken by an append carries the appended partition (FOUND, with
    its record) and nothing for the others; a partition behind its log end is always answered."""
    url = cluster.url(cluster.master())
    heads = await _heads(client, url)
    task: asyncio.Task[FetchAnswer] = asyncio.create_task(
        client.fetch(url, _at(heads), max_wait_ms=10_000, changes_only=True)
    )
    deadline = time.monotonic() + 10
    while (await client.stats(url))["inflight_fetch"].get("", 0) < 1:
        assert time.monotonic() < deadline, "fetch never got held"
        await asyncio.sleep(0.01)
    r = await client.produce(url, "events", 2, fmt.encode_batch([b"hello"]))
    answer = await asyncio.wait_for(task, 10)
    assert [(e.partition, e.status) for e in answer.partitions] == [(2, "FOUND")]
    assert records_of(answer.partitions[0].data, heads[2][0]) == [(r.base_offset, b"hello")]
    behind = _at(heads)
    behind[1]["offset"] = 0
    some = await client.fetch(url, behind, max_wait_ms=0, changes_only=True)
    assert sorted(e.partition for e in some.partitions) == [1, 2]


async def test_a_wrong_flag_is_a_400(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    """``changes_only`` must be a boolean: anything else is refused with the reason."""
    url = cluster.url(cluster.master())
    async with http.post(url + "/v1/fetch", json={"partitions": [], "changes_only": "yes"}) as resp:
        assert resp.status == 400
        assert "changes_only" in (await resp.json())["reason"]
