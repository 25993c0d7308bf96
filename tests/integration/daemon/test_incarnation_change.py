"""Reused offsets are never dropped (issue 12, case 1), end to end with real brokers.

Before: when a partition's log got shorter (a master's data dir replaced, a topic recreated) the
new acknowledged records got offsets the landing already held; the consumer followed the broker
back with one warning and the sink cut them as "already published", silently: 1,000 landed, the
log replaced, 600 new records produced, 0 of them landed. Now every log has an incarnation: the
daemon sees the change, logs and counts it, shows it in status, and lands the new incarnation's
records as new records (file names and rows carry it). A seek back within one incarnation still
deduplicates, and what it cuts is counted.
"""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
from support.daemon import daemon_config, produce_numbered
from support.harness import Cluster, fetch_all

from mqd.consumer import TopicPartition
from mqd.operator.views import render_summary
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient

TP0 = TopicPartition("events", 0)


def landed_rows(root: Path) -> list[tuple[int, str | None, int, bytes]]:
    """(partition, incarnation, offset, value) of every landed record."""
    out: list[tuple[int, str | None, int, bytes]] = []
    for path in sorted(root.glob("topic=*/dt=*/hour=*/part-*.parquet")):
        t = pq.read_table(path)
        incs = t.column("incarnation").to_pylist() if "incarnation" in t.column_names else [None] * len(t)
        out.extend(
            zip(
                t.column("partition").to_pylist(),
                incs,
                t.column("offset").to_pylist(),
                t.column("value").to_pylist(),
                strict=True,
            )
        )
    return out


async def test_a_replaced_log_lands_its_new_records_and_says_so(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """1,000 records per partition landed; partition 0's log is replaced (its folder removed while
    the master is down); 600 new records are produced there. All 600 land under the new
    incarnation beside the old 1,000; the change and the 1,000 reused offsets are in the status;
    partition 1 is untouched. Then a seek back to 0 within the new incarnation lands nothing twice
    and counts the 600 records it cut."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    master = cluster.master(0)
    root = tmp_path / "landing"
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 2, 1000, per_batch=250)
        daemon = Daemon(daemon_config(cluster, tmp_path, max_age=0.2))
        stop = asyncio.Event()
        run = asyncio.create_task(daemon.run(stop.wait()))
        try:
            await wait_until(lambda: len(landed_rows(root)) == 2000, 60, "first 2,000 records landed")
            [old_inc] = {inc for p, inc, _, _ in landed_rows(root) if p == 0}

            await asyncio.to_thread(cluster.stop_node, master)
            shutil.rmtree(cluster.nodes[master].data_dir / "logs" / "events-0")
            await asyncio.to_thread(cluster.start_node, master)
            url = cluster.url(master)
            for lo in range(0, 600, 200):
                raw = fmt.encode_batch([b"new:%d" % i for i in range(lo, lo + 200)])
                await client.produce(url, "events", 0, raw)

            await wait_until(lambda: len(landed_rows(root)) == 2600, 60, "the 600 new records landed")
            rows = landed_rows(root)
            part0 = Counter(inc for p, inc, _, _ in rows if p == 0)
            new_inc = next(inc for inc in part0 if inc != old_inc)
            assert old_inc is not None and new_inc is not None
            assert part0 == {old_inc: 1000, new_inc: 600}
            assert sorted(o for p, inc, o, _ in rows if inc == new_inc) == list(range(600))
            assert {v for p, inc, _, v in rows if inc == new_inc} == {b"new:%d" % i for i in range(600)}
            assert sum(1 for p, _, _, _ in rows if p == 1) == 1000
            status = daemon.status()["consumer"]
            entry = status["assignment"]["events/0"]
            assert entry["incarnation"] == new_inc and entry["incarnation_changes"] == 1
            assert entry["reused_offsets"] == 1000 and status["totals"]["reused_offsets"] == 1000
            assert status["assignment"]["events/1"]["incarnation_changes"] == 0
            assert "log incarnation changed 1 times (1000 reused offsets" in render_summary(daemon.status())
            assert any(p.name.startswith(f"part-00000-{new_inc}-") for p in root.rglob("*.parquet"))

            # a replay within the new incarnation: cut at the landed floor, counted, nothing twice
            cut_before = daemon.sink.stats.cut
            daemon.consumer.seek(TP0, 0)
            await wait_until(lambda: daemon.sink.stats.cut - cut_before >= 600, 60, "the replay was cut")
            assert daemon.sink.stats.cut - cut_before == 600
            assert len(landed_rows(root)) == 2600
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
    rows = landed_rows(root)
    assert len(rows) == len({(p, inc, o) for p, inc, o, _ in rows}) == 2600


async def test_a_log_that_lost_the_newest_incarnation_lands_nothing_twice(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Chaos seed 587328, with real brokers: 1,000 records landed under A; the slave down, the
    master restarted uncleanly begins B at 1,000 and the daemon follows it (nothing fetched is
    affected); the master then loses its data dir and takes A's records back from the slave, which
    never learnt B, as C at 1,000. The daemon's next fetch names B and, beside it, A up to 1,000: the
    master answers 1,000, so no offset is reused and the 300 records produced next land once, under
    C (or, had the partition been assigned again from the landing meanwhile, A's name is asked
    for and known: the same answer). Before, the master answered 0 for the unknown B and the daemon
    landed all 1,000 again."""
    cluster = cluster_factory(topics={"events": 1}, groups=1, slaves=1)
    master, slave = cluster.master(0), cluster.slaves(0)[0]
    root = tmp_path / "landing"
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 1, 1000, per_batch=250)
        await wait_until(
            lambda: len(fetch_all(cluster.url(slave), "events", 0)) == 1000, 30, "the slave holds 1,000"
        )
        daemon = Daemon(daemon_config(cluster, tmp_path, max_age=0.2))
        stop = asyncio.Event()
        run = asyncio.create_task(daemon.run(stop.wait()))

        def followed(first: str | None) -> bool:
            # with the only master down the session may expire and the partition be revoked, so
            # the entry can be missing for a while, and a new assignment counts its changes afresh
            consumer = daemon.status()["consumer"]
            entry = consumer["assignment"].get("events/0")
            return (
                entry is not None
                and entry["incarnation"] not in (None, first)
                and consumer["totals"]["incarnation_changes"] >= 1
            )

        try:
            await wait_until(lambda: len(landed_rows(root)) == 1000, 60, "the first 1,000 landed")
            [first] = {inc for _, inc, _, _ in landed_rows(root)}

            await asyncio.to_thread(cluster.stop_node, slave)  # it will not learn B
            await asyncio.to_thread(cluster.kill, master)  # unclean: B begins at the log end
            await asyncio.to_thread(cluster.start_node, master)
            await wait_until(lambda: followed(first), 30, "the daemon followed B")
            assert daemon.status()["consumer"]["totals"]["reused_offsets"] == 0

            await asyncio.to_thread(cluster.kill, master)
            shutil.rmtree(cluster.nodes[master].data_dir)
            await asyncio.to_thread(cluster.start_node, slave)
            await asyncio.to_thread(cluster.start_node, master)  # takes A's records back as C
            assert "master recovered records from a slave" in cluster.log(master)
            url = cluster.url(master)
            for lo in range(0, 300, 100):
                await client.produce(
                    url, "events", 0, fmt.encode_batch([b"new:%d" % i for i in range(lo, lo + 100)])
                )

            await wait_until(lambda: len(landed_rows(root)) >= 1300, 60, "the 300 new records landed")
            # since start, not per assignment: while both nodes were down the partition may have
            # been revoked and assigned again from the landing (which names A), so the per-partition
            # count of changes may be 1 or 2
            assert daemon.status()["consumer"]["totals"]["reused_offsets"] == 0
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
    rows = landed_rows(root)
    values = Counter(v for _, _, _, v in rows)
    assert [v for v, n in values.items() if n > 1] == []
    assert len(rows) == 1300
    by_inc = Counter(inc for _, inc, _, _ in rows)
    assert by_inc[first] == 1000 and sorted(by_inc.values()) == [300, 1000]
