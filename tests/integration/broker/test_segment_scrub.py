"""The background CRC scrub of closed segments (mqd/broker/scrub.py) and the repairs it triggers.

Proves, on real broker processes: a byte flipped in a middle batch of a cleanly closed segment,
whose index is trusted at start (so no open-time check reads that batch), is found by the scrub
within a bounded wait; a fetch there answers DATA_LOST (never the bad bytes), health is degraded
and /v1/stats counts it. With a replica holding the good copy, the range is repaired at runtime
(master from its slave, slave from its master) and a fetch returns the original bytes. A master
copying back from a slave whose copy has a damaged batch in the middle keeps every intact batch
before and after it and fences exactly the damaged range, whether the slave's scrub has fenced it
already or not. A segment deleted by retention while the scrub reads it is skipped cleanly.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.harness import Cluster
from support.storage_node import flip_byte

from mqd.broker.scrub import SegmentScrubber
from mqd.broker.storage import Storage
from mqd.config import StorageConfig
from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd.wire.protocol import PartitionFetch

TOPIC = "events"
PER_BATCH = 5
BATCHES = 60
FAST = {"segment_bytes": 4096, "scrub_bytes_per_second": 4 * 1024 * 1024}


def _batch(i: int) -> bytes:
    return fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(PER_BATCH)])


def _get(url: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + path, timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _flip_middle_batch(cluster: Cluster, node_id: str) -> tuple[int, int]:
    """On a stopped node: flip a byte in the middle of a middle batch of the second segment, a
    closed one whose index files stay (trusted at the next start: its first and last batches are
    intact). Returns the batch's offsets."""
    folder = cluster.nodes[node_id].data_dir / "logs" / f"{TOPIC}-0"
    second = sorted(folder.glob("*.log"))[1]
    assert second.with_suffix(".index").exists()
    infos = fmt.scan(second.read_bytes())
    assert len(infos) >= 3
    victim = infos[len(infos) // 2]
    flip_byte(second, victim.position + victim.length // 2)
    return victim.base_offset, victim.next_offset - 1


async def _fetch(client: BrokerClient, url: str, offset: int, max_bytes: int = 1024) -> PartitionFetch:
    answer = await client.fetch(
        url, [{"topic": TOPIC, "partition": 0, "offset": offset, "max_bytes": max_bytes}], max_wait_ms=0
    )
    return answer.partitions[0]


async def _records(client: BrokerClient, url: str) -> dict[int, bytes]:
    """Every record the node serves, read on past each DATA_LOST range like a consumer; every
    batch CRC-checked."""
    out: dict[int, bytes] = {}
    offset = 0
    while True:
        p = await _fetch(client, url, offset, 1 << 20)
        if p.status == "DATA_LOST":
            offset = p.next_offset
            continue
        if p.status != "FOUND":
            return out
        data = bytes(p.data)
        for info in fmt.validate(data):
            for i, value in enumerate(fmt.to_arrow(data, info).column("value").to_pylist()):
                out[info.base_offset + i] = value
        offset = p.next_offset


async def _produce_all(client: BrokerClient, url: str) -> None:
    for i in range(BATCHES):
        await client.produce(url, TOPIC, 0, _batch(i), acks="all")


async def test_scrub_fences_damage_in_a_trusted_segment(cluster_factory: Callable[..., Cluster]) -> None:
    """A lone node restarted over a flipped byte in a trusted closed segment: the scrub finds it
    within 20 s; a fetch at the batch answers DATA_LOST with its range (on main: FOUND with the
    damaged bytes), reads before and after it are intact, health is degraded naming the offsets,
    /v1/stats counts the scrub's work."""
    cluster = cluster_factory(topics={TOPIC: 1}, node_settings={"storage": FAST})
    node = cluster.master(0)
    url = cluster.url(node)
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce_all(client, url)
        before = await _records(client, url)
    cluster.stop_node(node)
    lost = _flip_middle_batch(cluster, node)
    cluster.start_node(node)
    async with BrokerClient(request_timeout=10.0) as client:

        async def fenced() -> bool:
            return (await _fetch(client, url, lost[0])).status == "DATA_LOST"

        await wait_until(fenced, 20.0, "the scrub to fence the damaged batch")
        p = await _fetch(client, url, lost[0] + 1)
        assert (p.status, p.lost_first, p.lost_last, p.next_offset) == ("DATA_LOST", *lost, lost[1] + 1)
        assert len(p.data) == 0
        after = await _records(client, url)
    assert after == {o: v for o, v in before.items() if not lost[0] <= o <= lost[1]}
    health = _get(url, "/v1/health")
    assert health["status"] == "degraded"
    assert any(f"offsets {lost[0]}..{lost[1]} fenced" in r for r in health["reasons"]), health
    scrub = _get(url, "/v1/stats")["scrub"]
    assert scrub["damaged_found"] == 1 and scrub["batches_checked"] > 0 and scrub["bytes_scrubbed"] > 0
    assert "damaged batch in a closed log segment: fenced" in cluster.log(node)


@pytest.mark.parametrize("damaged", ["master", "slave"])
async def test_scrub_found_damage_is_repaired_from_a_replica(
    cluster_factory: Callable[..., Cluster], damaged: str
) -> None:
    """The flipped byte on the master (repaired from its slave) or on the slave (repaired from its
    master), found by the scrub after a restart: the range is fenced, then repaired at runtime,
    and the node serves the original batch again, byte-identical, with health ok (on main the
    damaged node serves the bad bytes)."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1, node_settings={"storage": FAST})
    master, slave = cluster.master(), cluster.slaves()[0]
    victim_node = master if damaged == "master" else slave
    url = cluster.url(victim_node)
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce_all(client, cluster.url(master))

        async def slave_has_all() -> bool:
            return len(await _records(client, cluster.url(slave))) == BATCHES * PER_BATCH

        await wait_until(slave_has_all, 20.0, "the slave to copy everything")
        whole = bytes((await _fetch(client, url, 0, 1 << 20)).data)
    good = {info.base_offset: whole[info.position : info.position + info.length] for info in fmt.scan(whole)}
    cluster.stop_node(victim_node)
    lost = _flip_middle_batch(cluster, victim_node)
    cluster.start_node(victim_node)

    async with BrokerClient(request_timeout=10.0) as client:

        async def repaired() -> bool:
            p = await _fetch(client, url, lost[0], 1)
            return p.status == "FOUND" and bytes(p.data) == good[lost[0]]

        await wait_until(repaired, 30.0, "the damaged batch to be fenced and repaired")
        assert bytes((await _fetch(client, url, 0, 1 << 20)).data) == whole
    log_text = cluster.log(victim_node)
    assert "damaged batch in a closed log segment: fenced" in log_text
    assert "fenced range repaired from a replica" in log_text
    health = _get(url, "/v1/health")
    assert health["status"] == "ok", health
    assert _get(url, "/v1/stats")["scrub"]["damaged_found"] == 1


@pytest.mark.parametrize("slave_scrub", [False, True], ids=["slave_unaware", "slave_fenced"])
async def test_copy_back_keeps_every_intact_batch_around_a_damaged_one(
    cluster_factory: Callable[..., Cluster], slave_scrub: bool
) -> None:
    """The master's data dir is replaced while its slave's copy has a damaged batch in the middle
    of a trusted closed segment, found by the slave's scrub or not (scrub off): the master copies
    back every intact batch before and after it and fences exactly the damaged batch's offsets
    (on main the copy stopped at the damaged batch and everything after it was left behind)."""
    storage = dict(FAST, scrub_bytes_per_second=FAST["scrub_bytes_per_second"] if slave_scrub else 0)
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1, node_settings={"storage": storage})
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    async with BrokerClient(request_timeout=10.0) as client:
        await _produce_all(client, murl)

        async def slave_has_all() -> bool:
            return len(await _records(client, surl)) == BATCHES * PER_BATCH

        await wait_until(slave_has_all, 20.0, "the slave to copy everything")
        acked = await _records(client, murl)
        cluster.stop_node(slave)
        lost = _flip_middle_batch(cluster, slave)
        cluster.start_node(slave)
        if slave_scrub:

            async def slave_fenced() -> bool:
                return "damaged batch in a closed log segment: fenced" in cluster.log(slave)

            await wait_until(slave_fenced, 20.0, "the slave's scrub to fence the batch")
    cluster.kill(master)
    shutil.rmtree(cluster.nodes[master].data_dir)
    cluster.start_node(master)
    async with BrokerClient(request_timeout=10.0) as client:
        p = await _fetch(client, murl, lost[0])
        assert (p.status, p.lost_first, p.lost_last) == ("DATA_LOST", *lost), p
        got = await _records(client, murl)
    assert got == {o: v for o, v in acked.items() if not lost[0] <= o <= lost[1]}
    assert max(got) == BATCHES * PER_BATCH - 1
    assert "master recovery: range fenced, the copy-back goes on after it" in cluster.log(master)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_segment_deleted_by_retention_mid_scrub_is_skipped(tmp_path: Path) -> None:
    """Retention deletes the segment the scrub is reading (between two of its chunks): the scrub
    skips it cleanly (counted, nothing fenced, no error), goes on with the log, and the fd it read
    through is closed."""
    config = StorageConfig(segment_bytes=1 << 20, retention_bytes=1 << 20, fsync="never")
    storage = Storage(tmp_path, config)
    storage.open([(TOPIC, 0)])
    plog = storage.get(TOPIC, 0)
    assert plog is not None
    batch = fmt.encode_batch([b"x" * 1000] * 10)
    while plog.segment_count < 4:
        plog.append(batch, fmt.validate(batch))
    fds_before = _open_fds()
    # 512 KiB/s: a 256 KiB chunk, then half a second asleep, so the deletion lands mid-segment
    scrubber = SegmentScrubber(storage, 512 * 1024)
    await scrubber.start()
    try:
        await wait_until(lambda: scrubber.counters.bytes_scrubbed > 0, 10.0, "the first chunk")
        assert scrubber.counters.segments_scrubbed == 0
        assert plog.apply_retention(fmt.now_ms()) == 3
        await wait_until(lambda: scrubber.counters.segments_skipped >= 1, 10.0, "the skip")
    finally:
        await scrubber.stop()
        await scrubber.stop()  # idempotent
    assert scrubber.counters.damaged_found == 0 and plog.fenced_ranges() == []
    # the three deleted segments' fds went with them, and the scrub's dup too
    assert _open_fds() == fds_before - 3
    storage.close()
