"""The Kafka source through the whole consumer engine against a scripted broker (tests/support/
fake_kafka.py, aiokafka's own protocol structs) for what Tansu cannot show: malformed batches,
aborted-transaction lists, OFFSET_OUT_OF_RANGE and NOT_LEADER_OR_FOLLOWER answers."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.consumer import new_consumer
from support.fake_kafka import TP0, TP1, FakeKafka, T, control, drain, kafka_config, recrc, values

from mqd.consumer import Consumer, TopicPartition
from mqd.waiting import wait_until


@pytest.fixture
async def fake() -> AsyncIterator[FakeKafka]:
    broker = await FakeKafka(T, 2).start()
    try:
        yield broker
    finally:
        await broker.stop()


def parked(consumer: Consumer, tp: TopicPartition) -> str | None:
    snap = next(p for p in consumer.snapshot().partitions if p.tp == tp)
    return snap.parked


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("crc", "CRC-32C mismatch"),
        ("magic", "magic 1"),
        ("records", "record 2: a record field runs past its record"),
    ],
)
async def test_malformed_batch_parks_one_partition(
    fake: FakeKafka, tmp_path: Path, damage: str, needle: str
) -> None:
    """A bad CRC, an old magic or records that lie about their count (CRC made right) park only the
    damaged partition, with an error naming it and the offset; the good batch before it and the
    other partition are delivered."""
    bad = bytearray(values(2, b"x", b"y"))
    if damage == "crc":
        bad[-1] ^= 0xFF
    elif damage == "magic":
        bad[16] = 1
    else:
        struct.pack_into(">i", bad, 57, 3)  # recordsCount 3, two records present
        bad = bytearray(recrc(bad))
    fake.logs[0] = [values(0, b"a", b"b"), values(2, b"c")]
    fake.logs[1] = [values(0, b"g0", b"g1"), bytes(bad)]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 3 and len(g.get(TP1, [])) == 2)
        assert got[TP1] == [b"g0", b"g1"]
        await wait_until(lambda: parked(c, TP1) is not None, 10, "partition 1 parked")
        reason = parked(c, TP1)
        assert reason is not None and needle in reason and str(TP1) in reason and "offset 2" in reason
        assert parked(c, TP0) is None


async def test_read_committed_drops_aborted_transactions(fake: FakeKafka, tmp_path: Path) -> None:
    """Under read_committed (the default) the answer's aborted-transaction list drops producer 7's
    aborted records; markers are skipped and the position passes them. read_uncommitted keeps them."""
    fake.logs[0] = [
        values(0, b"plain"),
        values(1, b"abort-1", b"abort-2", txn=True, pid=7),
        values(3, b"commit", txn=True, pid=8),
        control(4, 7, commit=False),
        control(5, 8, commit=True),
        values(6, b"after"),
    ]
    fake.aborted[0] = [(7, 1)]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        got = await drain(c, lambda g: b"after" in g.get(TP0, []))
        assert got[TP0] == [b"plain", b"commit", b"after"]
        assert c.positions()[TP0] == 7
    cfg = kafka_config(fake, tmp_path / "u", kafka={"isolation_level": "read_uncommitted"})
    async with new_consumer(cfg) as c:
        got = await drain(c, lambda g: b"after" in g.get(TP0, []))
        assert got[TP0] == [b"plain", b"abort-1", b"abort-2", b"commit", b"after"]


async def test_offset_out_of_range_follows_on_offset_reset(fake: FakeKafka, tmp_path: Path) -> None:
    """Kafka's OFFSET_OUT_OF_RANGE names no offset: the source looks the bounds up (ListOffsets) and
    the engine's on_offset_reset = "broker" moves a position past the end to the log end and one
    below the start to the log start, as it does for the mqd broker."""
    fake.logs[0] = [values(10, b"a", b"b")]
    fake.log_start[0] = 10
    fake.logs[1] = [values(0, b"z")]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        got = await drain(c, lambda g: len(g.get(TP0, [])) == 2)
        assert got[TP0] == [b"a", b"b"]
        c.seek(TP0, 500)  # beyond the end
        await wait_until(lambda: c.positions()[TP0] == 12, 10, "moved back to the log end")
        fake.logs[0].append(values(12, b"c"))
        got = await drain(c, lambda g: g.get(TP0) == [b"c"])
        c.seek(TP0, 3)  # below the start
        got = await drain(c, lambda g: g.get(TP0) == [b"a", b"b", b"c"])


async def test_not_leader_reroutes_that_partition_only(fake: FakeKafka, tmp_path: Path) -> None:
    """NOT_LEADER_OR_FOLLOWER on partition 0 refreshes the metadata and holds that partition back;
    partition 1 keeps flowing; partition 0 resumes when the broker serves it again."""
    fake.logs[0] = [values(0, b"a")]
    fake.logs[1] = [values(0, b"x")]
    fake.errors[0] = 6
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        got = await drain(c, lambda g: TP1 in g)
        assert TP0 not in got
        fake.logs[1].append(values(1, b"y"))
        got = await drain(c, lambda g: g.get(TP1) == [b"y"])
        snap = next(p for p in c.snapshot().partitions if p.tp == TP0)
        assert snap.last_error is not None and "NotLeaderForPartition" in snap.last_error.replace(
            "NotLeaderOrFollower", "NotLeaderForPartition"
        )
        fake.errors.pop(0)
        got = await drain(c, lambda g: g.get(TP0) == [b"a"])


async def test_one_fetch_per_node_with_a_rotating_partition_order(tmp_path: Path) -> None:
    """Four partitions on one node: every fetch is one request naming all fetchable partitions, and
    the order inside it rotates, so a broker filling answers in request order starves none."""
    broker = await FakeKafka(T, 4).start()
    try:
        for p in range(4):
            broker.logs[p] = [values(0, b"%d" % p)]
        async with new_consumer(kafka_config(broker, tmp_path)) as c:
            await drain(c, lambda g: len(g) == 4)
            await wait_until(lambda: len(broker.fetches) >= 4, 10, "a few more long polls")
        full = [list(f) for f in broker.fetches if len(f) == 4]
        assert len(full) >= 3
        assert len({order[0] for order in full}) > 1, f"the first partition never changes: {full}"
    finally:
        await broker.stop()
