"""Every row of the fetch offset table (DESIGN.md §1) on a master, a slave, and a slave with
offset_check_in_slave; plus the offsets endpoint (earliest, latest, by timestamp)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import pytest
from support.harness import Cluster, records_of

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.protocol import PartitionFetch

BIG, SMALL, EMPTY = 0, 1, 2  # partitions: retention moved the start / three small batches / nothing


@dataclass
class Layout:
    cluster: Cluster
    views: dict[str, str]  # view name -> url


async def _prepare(cluster: Cluster) -> None:
    master = cluster.url(cluster.master())
    async with BrokerClient() as client:
        for i in range(3):  # SMALL: offsets 0..5, timestamps 1000i+1000, 1000i+1001
            ts = [1000 * (i + 1), 1000 * (i + 1) + 1]
            values = [b"s%d" % (2 * i), b"s%d" % (2 * i + 1)]
            await client.produce(master, "events", SMALL, fmt.encode_batch(values, timestamps=ts))
        for i in range(40):  # BIG: ~40 KB over 4 KB segments with 8 KB retention: the start moves
            await client.produce(master, "events", BIG, fmt.encode_batch([b"%04d" % i + b"x" * 900]))
        latest = await client.list_offsets(
            master, [{"topic": "events", "partition": p, "spec": "latest"} for p in (BIG, SMALL)]
        )
        want = {BIG: latest[0]["offset"], SMALL: latest[1]["offset"]}
        deadline = time.monotonic() + 20
        for node in cluster.node_ids:
            url = cluster.url(node)
            while True:
                got = await client.list_offsets(
                    url,
                    [
                        {"topic": "events", "partition": BIG, "spec": "earliest"},
                        {"topic": "events", "partition": BIG, "spec": "latest"},
                        {"topic": "events", "partition": SMALL, "spec": "latest"},
                    ],
                )
                if got[0]["offset"] > 1 and got[1]["offset"] == want[BIG] and got[2]["offset"] == want[SMALL]:
                    break
                assert time.monotonic() < deadline, f"{node} never caught up / applied retention: {got}"
                await asyncio.sleep(0.05)


@pytest.fixture(scope="module")
def layout(module_cluster_factory: Any) -> Layout:
    cluster = module_cluster_factory(
        topics={"events": 3},
        slaves=2,
        node_settings={
            "storage": {"segment_bytes": 4096, "retention_bytes": 8192, "retention_check_interval_ms": 100}
        },
        overrides={"broker-a-2": {"offset_check_in_slave": True}},
    )
    asyncio.run(_prepare(cluster))
    return Layout(
        cluster,
        {
            "master": cluster.url("broker-a-0"),
            "slave": cluster.url("broker-a-1"),
            "checked_slave": cluster.url("broker-a-2"),
        },
    )


VIEWS = ["master", "slave", "checked_slave"]


async def _one(client: BrokerClient, url: str, partition: int, offset: int, **kw: Any) -> PartitionFetch:
    answer = await client.fetch(
        url, [{"topic": "events", "partition": partition, "offset": offset, **kw}], max_wait_ms=0
    )
    assert len(answer.partitions) == 1
    return answer.partitions[0]


def _corrects(view: str) -> bool:
    return view != "slave"


@pytest.mark.parametrize("view", VIEWS)
async def test_empty_queue(layout: Layout, client: BrokerClient, view: str) -> None:
    """Empty queue: NO_MESSAGE_IN_QUEUE; next 0 from a master, the requested offset from a slave."""
    url = layout.views[view]
    p = await _one(client, url, EMPTY, 0)
    assert (p.status, p.next_offset, p.min_offset, p.max_offset) == ("NO_MESSAGE_IN_QUEUE", 0, 0, 0)
    p = await _one(client, url, EMPTY, 7)
    assert p.status == "NO_MESSAGE_IN_QUEUE"
    assert p.next_offset == (0 if _corrects(view) else 7)
    assert len(p.data) == 0


@pytest.mark.parametrize("view", VIEWS)
async def test_offset_too_small(layout: Layout, client: BrokerClient, view: str) -> None:
    """offset < min: OFFSET_TOO_SMALL; next = min from a master, the requested offset from a slave."""
    p = await _one(client, layout.views[view], BIG, 1)
    assert p.min_offset > 1
    assert p.status == "OFFSET_TOO_SMALL"
    assert p.next_offset == (p.min_offset if _corrects(view) else 1)
    assert len(p.data) == 0


@pytest.mark.parametrize("view", VIEWS)
async def test_offset_overflow_one(layout: Layout, client: BrokerClient, view: str) -> None:
    """offset == max: OFFSET_OVERFLOW_ONE and next = the requested offset everywhere."""
    p = await _one(client, layout.views[view], SMALL, 6)
    assert (p.status, p.next_offset, p.min_offset, p.max_offset) == ("OFFSET_OVERFLOW_ONE", 6, 0, 6)


@pytest.mark.parametrize("view", VIEWS)
async def test_offset_overflow_badly(layout: Layout, client: BrokerClient, view: str) -> None:
    """offset > max: OFFSET_OVERFLOW_BADLY; a master answers 0 when min == 0 else max; a slave keeps."""
    url = layout.views[view]
    p = await _one(client, url, SMALL, 10)
    assert (p.status, p.min_offset) == ("OFFSET_OVERFLOW_BADLY", 0)
    assert p.next_offset == (0 if _corrects(view) else 10)
    p = await _one(client, url, BIG, 10_000)
    assert p.status == "OFFSET_OVERFLOW_BADLY" and p.min_offset > 0
    assert p.next_offset == (p.max_offset if _corrects(view) else 10_000)


@pytest.mark.parametrize("view", VIEWS)
async def test_found(layout: Layout, client: BrokerClient, view: str) -> None:
    """min <= offset < max: FOUND, whole batches from the one holding offset, next after the last."""
    url = layout.views[view]
    p = await _one(client, url, SMALL, 3)
    assert p.status == "FOUND" and p.next_offset == 6
    assert records_of(p.data, 3) == [(3, b"s3"), (4, b"s4"), (5, b"s5")]
    assert records_of(p.data)[0][0] == 2  # the batch holding 3 starts at 2: the client cuts
    # a tiny per-partition max_bytes still returns the first batch whole
    p = await _one(client, url, SMALL, 3, max_bytes=1)
    assert p.status == "FOUND" and p.next_offset == 4
    assert records_of(p.data, 3) == [(3, b"s3")]


async def test_partition_and_request_byte_limits(layout: Layout, client: BrokerClient) -> None:
    """Per-partition max_bytes and the request max_bytes bound the answer; only the first partition
    with data may exceed them (by its first batch)."""
    url = layout.views["master"]
    small_batch = len(fmt.encode_batch([b"s0", b"s1"], timestamps=[1, 2]))
    answer = await client.fetch(
        url,
        [
            {"topic": "events", "partition": SMALL, "offset": 0, "max_bytes": 1},
            {"topic": "events", "partition": SMALL, "offset": 2, "max_bytes": 1},
        ],
        max_wait_ms=0,
    )
    first, second = answer.partitions
    assert [o for o, _ in records_of(first.data)] == [0, 1] and first.next_offset == 2
    # the second partition entry gets nothing: its first batch would exceed its max_bytes
    assert second.status == "FOUND" and len(second.data) == 0 and second.next_offset == 2
    answer = await client.fetch(
        url,
        [
            {"topic": "events", "partition": SMALL, "offset": 0},
            {"topic": "events", "partition": SMALL, "offset": 0},
        ],
        max_wait_ms=0,
        max_bytes=small_batch * 3 + small_batch // 2,
    )
    a, b = answer.partitions
    assert len(a.data) == 3 * small_batch and a.next_offset == 6
    assert len(b.data) == 0  # the request budget is spent


@pytest.mark.parametrize("view", VIEWS)
async def test_offsets_endpoint(layout: Layout, client: BrokerClient, view: str) -> None:
    """earliest/latest are the log bounds; timestamp gives the first offset of the first batch whose
    max_timestamp >= the time (the log end when none), on masters and slaves alike."""
    url = layout.views[view]

    def q(spec: str, ts: int | None = None, partition: int = SMALL) -> dict[str, Any]:
        d: dict[str, Any] = {"topic": "events", "partition": partition, "spec": spec}
        if ts is not None:
            d["timestamp"] = ts
        return d

    got = await client.list_offsets(
        url,
        [
            q("earliest"),
            q("latest"),
            q("timestamp", 0),
            q("timestamp", 1001),
            q("timestamp", 1500),
            q("timestamp", 2001),
            q("timestamp", 2002),
            q("timestamp", 99_999),
            q("earliest", partition=BIG),
            q("latest", partition=EMPTY),
            q("timestamp", 0, partition=EMPTY),
        ],
    )
    assert [g["offset"] for g in got[:8]] == [0, 6, 0, 0, 2, 2, 4, 6]
    assert got[8]["offset"] > 1
    assert got[9]["offset"] == 0 and got[10]["offset"] == 0
    assert all(g["error"] is None for g in got)
