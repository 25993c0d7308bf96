"""The Kafka source through the daemon and the engine against answers a buggy or hostile broker
gives (issue 31, items 3 and 4), served by the scripted broker (tests/support/fake_kafka.py: each
partition's log a list of raw batches from aiokafka's builder, an answer every batch from the one
holding the fetch offset on, in log order, so batches that overlap or go behind reach the
client as they are): no offset lands twice, and a decode failure parks only its partition."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.consumer import FAST, new_consumer
from support.fake_kafka import FakeKafka, build, recrc, values
from support.kafka import kafka_daemon_config

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer import TopicPartition
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until

T = "events"


def landed(landing: Path) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every landed record, in file then row order."""
    rows: list[tuple[int, int, bytes]] = []
    for path in sorted(landing.rglob("part-*.parquet")):
        t = pq.read_table(path, columns=["partition", "offset", "value"])
        rows.extend(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))
    return rows


def out_of_order(partition: int) -> float:
    labels = {"topic": T, "partition": str(partition)}
    return metrics.REGISTRY.get_sample_value("mqd_kafka_out_of_order_records_total", labels) or 0.0


@pytest.mark.parametrize("fetch_version", [4, 13])
async def test_overlapping_and_backward_batches_land_each_offset_once(
    fetch_version: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0's log as a broker bug serves it: a0..a9 at 0-9, c2..c4 again at 2-4 (behind),
    b5..b14 at 5-14 (overlapping 5-9), all in one answer. The daemon lands offsets 0-14 exactly
    once, each as first delivered (a0..a9, b10..b14); the 8 records dropped are counted, and a
    warning names the partition and the broker's address. Partition 1, served soundly, lands as is.
    Before: b5..b9 landed beside a5..a9, 20 rows for 15 offsets."""
    fake = await FakeKafka(T, 2, fetch_version=fetch_version).start()
    before = out_of_order(0)
    try:
        fake.logs[0] = [
            values(0, *[b"a%d" % i for i in range(10)]),
            values(2, *[b"c%d" % i for i in range(2, 5)]),
            values(5, *[b"b%d" % i for i in range(5, 15)]),
        ]
        fake.logs[1] = [values(0, *[b"p%d" % i for i in range(4)]), values(4, b"p4")]
        d = Daemon(kafka_daemon_config(fake.bootstrap, tmp_path, max_age=0.2))
        stop = asyncio.Event()
        run = asyncio.create_task(d.run(stop.wait()))
        try:
            await wait_until(lambda: d.stats["records_published"] >= 20, 30, "20 records published")
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
    finally:
        await fake.stop()
    rows = landed(tmp_path / "landing")
    p0 = sorted((o, v) for p, o, v in rows if p == 0)
    assert p0 == [(i, b"a%d" % i) for i in range(10)] + [(i, b"b%d" % i) for i in range(10, 15)]
    assert sorted((o, v) for p, o, v in rows if p == 1) == [(i, b"p%d" % i) for i in range(5)]
    assert d.stats["records_published"] == 20
    assert out_of_order(0) - before == 8
    warned = [r.getMessage() for r in caplog.records if "overlapping or backward" in r.getMessage()]
    assert warned and all(f"127.0.0.1:{fake.port}" in m and "partition=0" in m for m in warned), warned


def kafka_config(fake: FakeKafka, tmp_path: Path) -> ConsumerConfig:
    return ConsumerConfig(
        **{
            **FAST,
            "source": "kafka",
            "mode": "broadcast",
            "consume_from": "first",
            "client_id": f"hostile-{time.monotonic_ns() % 10**6}",
            "bootstrap": [fake.bootstrap],
            "topics": [T],
            "offset_file": tmp_path / "offsets.json",
        }
    )


async def test_a_decoder_error_after_a_bad_header_key_parks_only_its_partition(tmp_path: Path) -> None:
    """Issue 31 item 4 through the engine: partition 0 holds a good record, a batch whose header key
    is not UTF-8, then a batch whose record length runs past it (CRCs made right). The good record
    is delivered and partition 0 is parked naming the header key at offset 1; partition 1, in the
    same answers, is delivered. Before: a KernelError escaped the decoder into the fetcher's
    catch-all, which dropped every answer whole (partition 1 too) and never parked partition 0."""
    good = build(0, [(None, b"g0", [("ok", b"1")])])
    bad = bytearray(build(1, [(None, b"v", [("k\xc3", b"2")])]))
    bad[bytes(bad).rindex(b"k\xc3") + 1] = 0xFF
    later = bytearray(build(2, [(b"k", b"value", [])]))
    later[61] = 0x7E  # the record length varint: far past the batch
    fake = await FakeKafka(T, 2).start()
    tp0, tp1 = TopicPartition(T, 0), TopicPartition(T, 1)
    try:
        fake.logs[0] = [good, recrc(bad), recrc(later)]
        fake.logs[1] = [values(0, b"q0", b"q1")]
        got: dict[TopicPartition, list[bytes | None]] = {tp0: [], tp1: []}
        async with new_consumer(kafka_config(fake, tmp_path)) as c:

            def parked() -> str | None:
                return next(p for p in c.snapshot().partitions if p.tp == tp0).parked

            def drained() -> bool:
                for b in c.fetched_batches():
                    got[b.tp].extend(b.records.column("value").to_pylist())
                    c.mark_consumed(b.tp, b.next_offset)
                return parked() is not None and len(got[tp1]) == 2

            await wait_until(drained, 15, "partition 0 parked and partition 1 delivered")
            reason = parked()
    finally:
        await fake.stop()
    assert got == {tp0: [b"g0"], tp1: [b"q0", b"q1"]}
    assert reason is not None and "offset 1" in reason and "header key is not valid UTF-8" in reason
