"""The daemon against real brokers: exactly-once landing, conflicts, max_age, disk errors."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support.daemon import (
    assert_exactly_once,
    committed,
    daemon_config,
    produce_numbered,
)
from support.landing import read_manifest

from mqd.consumer import TopicPartition
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient
from mqd.wire.format import now_ms


async def test_burst_lands_everything_once_and_commits_after_publication(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """8 partitions on 2 broker groups -> daemon in burst mode: run() returns by itself, every
    record is in exactly one landing file, the manifest lists every file, and the committed offsets
    equal the log ends. A second burst run resumes from the landing dir and adds only new records."""
    cluster = cluster_factory(topics={"events": 8}, groups=2)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 8, 2500, per_batch=500)
        cfg = daemon_config(cluster, tmp_path, max_records=3000)
        d = Daemon(cfg, burst=True)
        await asyncio.wait_for(d.run(), 60)
        assert d.state == "stopped" and d.stats["records_published"] == 20_000
        assert_exactly_once(tmp_path / "landing", 8, 2500)
        manifest = read_manifest(tmp_path / "landing")
        assert sum(r.count for r in manifest) == 20_000 and len(manifest) == d.stats["files_published"]
        assert await committed(client, cluster, "landing") == {p: 2500 for p in range(8)}

        # a restart with the broker commit lost (other group) still resumes from the landing dir
        await produce_numbered(client, cluster, 8, 100, start=2500, per_batch=100)
        cfg2 = daemon_config(cluster, tmp_path, consumer={"group": "fresh-group"})
        d2 = Daemon(cfg2, burst=True)
        await asyncio.wait_for(d2.run(), 60)
        assert d2.stats["records_published"] == 800
        assert_exactly_once(tmp_path / "landing", 8, 2600)


async def test_two_daemons_owning_the_same_partitions_never_duplicate(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """Broadcast mode: two daemons both own every partition and land into one directory at once.
    Conditional publication makes the losers drop and re-seek: no duplicates, no losses."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 4, 3000, per_batch=200)
        daemons = [
            Daemon(
                daemon_config(
                    cluster,
                    tmp_path,
                    max_records=400,
                    consumer={
                        "mode": "broadcast",
                        "offset_file": tmp_path / f"state{i}" / "offsets.json",
                        "max_queued_records": 400,
                    },
                ),
                burst=True,
            )
            for i in range(2)
        ]
        await asyncio.wait_for(asyncio.gather(*(d.run() for d in daemons)), 90)
        assert_exactly_once(tmp_path / "landing", 4, 3000)
        total = sum(d.stats["records_published"] for d in daemons)
        assert total == 12_000
        assert sum(d.stats["publish_conflicts"] for d in daemons) >= 1
        for i in range(2):  # the loser of a conflict commits the landed end it learned, too
            stored = json.loads((tmp_path / f"state{i}" / "offsets.json").read_text())
            assert stored["offsets"] == {"events": {str(p): 3000 for p in range(4)}}


async def test_assignment_commits_the_landed_position_with_nothing_new_to_land(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """A group whose broker commits are behind the landing directory (lost, or a new group on the
    same landing dir) commits the landed position as soon as it is assigned, without waiting to
    publish something new: the broker's view catches up with the source of truth."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 2, 700, per_batch=100)
        await asyncio.wait_for(Daemon(daemon_config(cluster, tmp_path), burst=True).run(), 60)
        assert await committed(client, cluster, "landing") == {0: 700, 1: 700}
        late = Daemon(daemon_config(cluster, tmp_path, consumer={"group": "late"}), burst=True)
        await asyncio.wait_for(late.run(), 60)
        assert late.stats["records_published"] == 0
        assert await committed(client, cluster, "late") == {0: 700, 1: 700}


async def test_idle_partition_lands_within_max_age(cluster_factory: Any, tmp_path: Path) -> None:
    """One record on an otherwise idle topic is published within max_age (+1 s) of its produce,
    and its offset is committed only after that."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        d = Daemon(daemon_config(cluster, tmp_path, max_age=1.0))
        stop = asyncio.Event()
        run = asyncio.create_task(d.run(stop.wait()))
        try:
            await wait_until(lambda: len(d.consumer.assignment()) == 2, 10, "assignment")
            t0 = time.monotonic()
            await produce_numbered(client, cluster, 1, 1)
            await wait_until(lambda: d.stats["records_published"] == 1, 2.0, "max_age flush")
            assert time.monotonic() - t0 <= 2.0
            assert_exactly_once(tmp_path / "landing", 1, 1)
            await wait_until(
                lambda: (
                    d.consumer.status()["assignment"]["events/0"]["committed"] == 1
                    if "events/0" in d.consumer.status()["assignment"]
                    else False
                ),
                5,
                "commit",
            )
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)


async def test_small_sink_publishes_while_fetching_and_stop_lands_everything(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """With landing.max_bytes far below the backlog, the working loop cuts many files and keeps
    fetching while they are published (publication tasks, not awaited). Still every record lands
    exactly once, a burst run ends by itself and commits the log ends; and a graceful stop of a
    running daemon (max_age far away) publishes what it holds, in-flight publications included,
    and commits."""
    cluster = cluster_factory(topics={"events": 4}, groups=2)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 4, 3000, per_batch=200)
        d = Daemon(daemon_config(cluster, tmp_path, max_bytes=32 * 1024), burst=True)
        await asyncio.wait_for(d.run(), 60)
        assert d.state == "stopped" and d.stats["records_published"] == 12_000
        assert d.stats["files_published"] > 8  # cut by size, not one file per partition
        assert_exactly_once(tmp_path / "landing", 4, 3000)
        assert await committed(client, cluster, "landing") == {p: 3000 for p in range(4)}

        await produce_numbered(client, cluster, 4, 1000, start=3000, per_batch=100)
        d2 = Daemon(daemon_config(cluster, tmp_path, max_bytes=16 * 1024, max_age=60.0))
        stop = asyncio.Event()
        run = asyncio.create_task(d2.run(stop.wait()))
        try:
            await wait_until(
                lambda: d2.consumer.caught_up() and d2.stats["files_published"] > 0,
                20,
                "fetched to the log end",
            )
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
        assert d2.state == "stopped" and d2.stats["records_published"] == 4000
        assert_exactly_once(tmp_path / "landing", 4, 4000)
        assert await committed(client, cluster, "landing") == {p: 4000 for p in range(4)}


async def test_buffers_due_by_age_are_cut_under_memory_pressure(cluster_factory: Any, tmp_path: Path) -> None:
    """With a budget the sink's buffers fill (4 MiB, records produced while the daemon runs), the
    buffers and open files due by age are published besides the biggest ones the pressure cuts.
    Before, pressure replaced the age cut: a due open file nobody cut kept the working loop from
    ever suspending, heartbeats starved, the member was expelled and its buffers dropped, over and
    over, and nothing landed."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    d = Daemon(daemon_config(cluster, tmp_path, max_age=0.5, consumer={"max_buffered_bytes": 4 << 20}))
    stop = asyncio.Event()
    run = asyncio.create_task(d.run(stop.wait()))
    try:
        await wait_until(lambda: len(d.consumer.assignment()) == 4, 10, "assignment")
        async with BrokerClient(request_timeout=10) as client:
            await produce_numbered(client, cluster, 4, 2000, per_batch=100)
        await wait_until(lambda: d.stats["records_published"] >= 8000, 30, "every record landed")
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert_exactly_once(tmp_path / "landing", 4, 2000)
    assert d.stats["records_dropped"] == 0
    assert d.consumer.snapshot().totals.rebalances == 1  # never expelled


async def test_unwritable_landing_pauses_fetching_and_recovers(cluster_factory: Any, tmp_path: Path) -> None:
    """While the landing directory cannot be written the daemon is degraded with the reason,
    fetching is paused and nothing is committed; once it is writable again everything lands
    exactly once and health returns to ok, without a restart."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    root = tmp_path / "landing"
    root.mkdir()
    blocker = root / "topic=events"
    blocker.write_bytes(b"in the way")  # mkdir of the topic folder fails (works as root, unlike chmod)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 2, 500, per_batch=100)
        d = Daemon(daemon_config(cluster, tmp_path, max_age=0.2, disk_retry_interval=0.2))
        stop = asyncio.Event()
        run = asyncio.create_task(d.run(stop.wait()))
        try:
            await wait_until(lambda: any(r.startswith("landing:") for r in d.health()[1]), 10, "degraded")
            assert d.health()[0] == "degraded"
            await wait_until(
                lambda: d.consumer.paused() == d.consumer.assignment() != frozenset(), 5, "paused"
            )
            assert d.status()["landing"]["error"]
            # only the start positions resolved from consume_from, made durable before any fetch
            assert await committed(client, cluster, "landing") == {0: 0, 1: 0}
            assert d.stats["records_published"] == 0
            blocker.unlink()
            await wait_until(lambda: d.stats["records_published"] == 1000, 15, "recovery")
            await wait_until(lambda: d.health()[0] == "ok", 5, "healthy")
            assert not d.consumer.paused()
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
        assert_exactly_once(root, 2, 500)
        assert await committed(client, cluster, "landing") == {0: 500, 1: 500}


async def test_pause_resume_and_status(cluster_factory: Any, tmp_path: Path) -> None:
    """Operator pause keeps a partition from landing until resumed; status() is JSON-able and
    shows the state and pauses; reload applies new landing thresholds and refuses a new dir."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        cfg = daemon_config(cluster, tmp_path, max_age=0.2)
        d = Daemon(cfg)
        stop = asyncio.Event()
        run = asyncio.create_task(d.run(stop.wait()))
        try:
            await wait_until(lambda: len(d.consumer.assignment()) == 2, 10, "assignment")
            d.pause([("events", 1)])
            await produce_numbered(client, cluster, 2, 50, per_batch=50)
            await wait_until(lambda: d.stats["records_published"] == 50, 10, "partition 0 landed")
            assert TopicPartition("events", 1) in d.consumer.paused()
            st = json.loads(json.dumps(d.status()))
            assert st["state"] == "running" and st["user_paused"] == ["events/1"]
            # reload: a new threshold applies at once; a new landing dir is refused, nothing changes
            with pytest.raises(ValueError, match=r"landing\.dir"):
                await d.reload(
                    cfg.model_copy(
                        update={"landing": cfg.landing.model_copy(update={"dir": tmp_path / "elsewhere"})}
                    )
                )
            await d.reload(
                cfg.model_copy(update={"landing": cfg.landing.model_copy(update={"max_records": 7})})
            )
            d.resume([("events", 1)])
            await wait_until(lambda: d.stats["records_published"] == 100, 10, "partition 1 landed")
            counts = [r.count for r in read_manifest(tmp_path / "landing") if r.partition == 1]
            assert max(counts) <= 7 and sum(counts) == 50
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
        assert d.state == "stopped"
        await d.stop()  # idempotent
        assert_exactly_once(tmp_path / "landing", 2, 50)


async def test_completeness_markers_for_whole_hours(cluster_factory: Any, tmp_path: Path) -> None:
    """Records stamped two hours ago on one partition, nothing on the other: once both are landed
    or idle at the log end, that hour folder gets _COMPLETE; the current hour does not."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    hour_ms = 3_600_000
    old = (now_ms() // hour_ms - 2) * hour_ms + 5
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 1, 20, per_batch=20, timestamp=old)
        await produce_numbered(client, cluster, 1, 5, start=20, per_batch=5)  # current hour
        d = Daemon(daemon_config(cluster, tmp_path), burst=True)
        await asyncio.wait_for(d.run(), 60)
    markers = sorted(
        p.parent.relative_to(tmp_path / "landing").as_posix()
        for p in (tmp_path / "landing").rglob("_COMPLETE")
    )
    t = datetime.fromtimestamp(old / 1000, UTC)
    assert markers == [f"topic=events/dt={t:%Y-%m-%d}/hour={t:%H}"]
    assert d.stats["markers"] == 1


async def test_rebalance_hands_partitions_over_without_loss_or_duplicates(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """A second daemon joins the group while the first is landing: partitions move (revoked ones
    drop their unpublished records, new owners resume from the landing dir) and every record
    still lands exactly once; both daemons published some of it."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    landing = tmp_path / "landing"
    async with BrokerClient(request_timeout=10) as client:
        a = Daemon(daemon_config(cluster, tmp_path, max_age=0.3, max_records=300))
        b = Daemon(daemon_config(cluster, tmp_path, max_age=0.3, max_records=300))
        stop = asyncio.Event()
        run_a = asyncio.create_task(a.run(stop.wait()))
        run_b: asyncio.Task[None] | None = None
        try:
            await wait_until(lambda: len(a.consumer.assignment()) == 4, 10, "a owns everything")
            await produce_numbered(client, cluster, 4, 1000, per_batch=100)
            run_b = asyncio.create_task(b.run(stop.wait()))
            await wait_until(lambda: len(b.consumer.assignment()) == 2, 15, "b takes its share")
            await produce_numbered(client, cluster, 4, 1000, start=1000, per_batch=100)
            await wait_until(lambda: sum(r.count for r in read_manifest(landing)) >= 8000, 30, "all landed")
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(run_a, *([run_b] if run_b else [])), 30)
        assert_exactly_once(landing, 4, 2000)
        assert a.stats["records_published"] > 0 and b.stats["records_published"] > 0
        assert await committed(client, cluster, "landing") == {p: 2000 for p in range(4)}
