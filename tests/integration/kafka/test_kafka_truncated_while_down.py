"""A Kafka log truncated while no daemon ran (issue 14): the landing keeps the source's leader epoch
of the last landed record (FileRange / claim chain / PartitionHead ``leader_epoch``), and a
restarted daemon validates its landed position with it before fetching after it, through
OffsetsForLeaderEpoch or a Fetch v12 diverging epoch. Against the scripted broker
(tests/support/fake_kafka.py): Tansu has one leader epoch and no OffsetsForLeaderEpoch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.fake_kafka import FakeKafka, values
from support.kafka import kafka_daemon_config

from mqd.landing.backends import open_store
from mqd.process.daemon import Daemon
from mqd.sources.kafka.log_incarnation import derived
from mqd.waiting import wait_until

T = "events"


def landed(landing: Path) -> list[tuple[int, str, bytes]]:
    """(offset, incarnation, value) of every landed record, sorted."""
    rows: list[tuple[int, str, bytes]] = []
    for path in landing.rglob("part-*.parquet"):
        t = pq.read_table(path, columns=["offset", "incarnation", "value"])
        rows.extend(zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True))
    return sorted(rows)


async def run_until(d: Daemon, published: int) -> tuple[int, int]:
    """Run ``d`` until ``published`` records landed; (incarnation changes, reused offsets) of
    partition 0 before it stops."""
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: d.stats["records_published"] >= published, 30, f"{published} published")
        snap = next(p for p in d.consumer.snapshot().partitions if p.tp.partition == 0)
        return snap.incarnation_changes, snap.reused_offsets
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


@pytest.mark.parametrize(
    ("fetch_version", "epoch_api"),
    [
        pytest.param(4, True, id="offsets-for-leader-epoch"),
        pytest.param(12, False, id="fetch-v12-diverging"),
    ],
)
async def test_a_log_truncated_while_the_daemon_was_down_lands_the_new_records(
    fetch_version: int, epoch_api: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """a0-a9 land in leader epoch 0 (the head keeps epoch 0); the daemon stops. A new leader
    (epoch 1) kept only 0-4 and wrote t5-t11 (longer than the landed end). The restarted daemon
    starts at 10 under the landed incarnation, checks epoch 0 against the log (OffsetsForLeaderEpoch,
    or the v12 Fetch's diverging epoch where the broker has no OffsetsForLeaderEpoch), finds the cut
    at 5 and lands t5-t11 under a new incarnation: the 5 reused offsets counted and logged, nothing
    cut at the landed floor, a0-a9 kept."""
    fake = await FakeKafka(T, 1, fetch_version=fetch_version, offsets_for_leader_epoch=epoch_api).start()
    try:
        fake.logs[0] = [
            values(0, *[b"a%d" % i for i in range(5)]),
            values(5, *[b"a%d" % i for i in range(5, 10)]),
        ]
        config = kafka_daemon_config(fake.bootstrap, tmp_path, max_age=0.2)
        await run_until(Daemon(config), 10)
        head = open_store(tmp_path / "landing").head(T, 0)
        assert (head.last_offset, head.incarnation, head.leader_epoch) == (9, fake.topic_id, 0)

        fake.logs[0] = [fake.logs[0][0], values(5, *[b"t%d" % i for i in range(5, 12)], epoch=1)]
        fake.leader_epoch[0] = 1
        d = Daemon(config)
        assert await run_until(d, 7) == (1, 5)
        assert d.stats["records_cut"] == 0
    finally:
        await fake.stop()
    new = derived(fake.topic_id, fake.topic_id, 0, 5)
    old = [(o, fake.topic_id, b"a%d" % o) for o in range(10)]
    assert landed(tmp_path / "landing") == sorted(old + [(o, new, b"t%d" % o) for o in range(5, 12)])
    head = open_store(tmp_path / "landing").head(T, 0)
    assert (head.last_offset, head.incarnation, head.leader_epoch) == (11, new, 1)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("reused_offsets=5" in m and new in m for m in errors), errors


@pytest.mark.parametrize(
    ("fetch_version", "epoch_api"),
    [
        pytest.param(4, True, id="offsets-for-leader-epoch"),
        pytest.param(12, False, id="fetch-v12-diverging"),
    ],
)
async def test_a_restart_on_a_log_that_only_changed_leader_goes_on(
    fetch_version: int, epoch_api: bool, tmp_path: Path
) -> None:
    """a0-a9 land in epoch 0; while the daemon is down a new leader (epoch 1) keeps all of them and
    appends b10-b11. The restart validates epoch 0 (its end, 10, is not below the position 10): the
    same incarnation, nothing reused, b10-b11 land after a0-a9."""
    fake = await FakeKafka(T, 1, fetch_version=fetch_version, offsets_for_leader_epoch=epoch_api).start()
    try:
        fake.logs[0] = [values(0, *[b"a%d" % i for i in range(10)])]
        config = kafka_daemon_config(fake.bootstrap, tmp_path, max_age=0.2)
        await run_until(Daemon(config), 10)
        fake.logs[0].append(values(10, b"b10", b"b11", epoch=1))
        fake.leader_epoch[0] = 1
        assert await run_until(Daemon(config), 2) == (0, 0)
        assert fake.epoch_checks == ([{0: 0}] if epoch_api else [])
    finally:
        await fake.stop()
    inc = fake.topic_id
    want = [(o, inc, b"a%d" % o) for o in range(10)] + [(10, inc, b"b10"), (11, inc, b"b11")]
    assert landed(tmp_path / "landing") == want
