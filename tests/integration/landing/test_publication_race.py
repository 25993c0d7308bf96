"""A publication task that outlives its partition's incarnation, then loses a conflict.

The race: the daemon creates the publication task of a partition; before the task takes the
buffer (it waits for a worker slot), the partition is revoked and assigned again, the new
incarnation buffers records from the landed head, and another owner lands a shorter range first.
The task then takes the NEW incarnation's buffer and loses the conditional publication. The sink
drops that buffer and moves its expected end to what the other owner landed, so the consumer
must re-seek right after that landed end; otherwise it fetches on past the dropped records and
the next file lands behind a gap (records lost for good: the head moved past them).

Ownership used to be judged by the consumer's assignment generation captured when the task was
created (the old incarnation's, so no re-seek); now it is the sink's epoch, captured when the
buffer is taken (the new incarnation's, so the re-seek happens). The test proves the daemon
lands every record exactly once through that race, with a real broker cluster, a real landing
directory, a real rebalance (a reload that drops the topic and then adds it back) and a real
second publisher into the same directory.

Deterministic, no sleeps: the only internal it touches is the sink's worker-slot semaphore,
held by the test to stand in for publications of other partitions occupying every worker; each
step waits on a condition (mqd.waiting.wait_until). The working loop is not running until the
end: the test drives its two steps (drain, then start what is due) by hand.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from support.harness import Cluster

from mqd.config import AdminConfig, ConsumerConfig, DaemonSection, LandingConfig, MqdConfig
from mqd.consumer import TopicPartition
from mqd.landing import LandingSink
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient

TOPIC = "events"
TP = TopicPartition(TOPIC, 0)
FIRST = 10  # records in the partition when the race happens
OTHER_LANDS = 4  # the other owner lands offsets 0..3, fewer than the task's buffer holds
LATER = 5  # records produced after the race: they land in the next file

_ids = itertools.count()


def _config(cluster: Cluster, root: Path, topics: list[str]) -> MqdConfig:
    return MqdConfig(
        consumer=ConsumerConfig(
            mode="broadcast",  # no group membership to wait for: every partition is ours
            client_id=f"race{next(_ids)}-{time.monotonic_ns() % 10**6}",
            bootstrap=[cluster.bootstrap],
            topics=topics,
            consume_from="first",
            offset_file=root / "state" / "offsets.json",
            fetch_max_wait_ms=200,
            metadata_refresh_interval=1.0,
            rebalance_interval=2.0,
            commit_interval=0.3,
            request_timeout=5.0,
            error_backoff_ms=50,
            error_backoff_max_ms=400,
        ),
        # one micro-batch of FIRST records is due by size; max_age never cuts during the test
        landing=LandingConfig(dir=root / "landing", max_records=FIRST, max_age=60.0),
        admin=AdminConfig(enabled=False),
        daemon=DaemonSection(
            state_dir=root / "state",
            pid_file=root / "state" / "mqd.pid",
            log_file=root / "state" / "mqd.log",
            shutdown_timeout=10.0,
        ),
    )


async def _produce(client: BrokerClient, cluster: Cluster, first: int, count: int) -> None:
    url = cluster.url(cluster.master(cluster.broker_group_of(TP.partition)))
    raw = fmt.encode_batch([b"r%d" % i for i in range(first, first + count)])
    await client.produce(url, TOPIC, TP.partition, raw)


def _landed_offsets(root: Path) -> list[int]:
    """Offsets of partition 0 in every visible landing data file, one entry per record."""
    out: list[int] = []
    for path in sorted(root.rglob("*.parquet")):
        if any(part.startswith(("_", ".")) for part in path.relative_to(root).parts):
            continue
        out.extend(pq.read_table(path, columns=["offset"]).column("offset").to_pylist())
    return sorted(out)


async def test_task_created_before_a_reassignment_re_seeks_after_losing_a_conflict(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """Revoke and re-assign between a publication task's creation and its taking the buffer, then
    a conflict lost to a shorter landed range: every record still lands exactly once (the
    consumer re-seeks after the landed end instead of fetching on past the dropped records)."""
    cluster = cluster_factory(topics={TOPIC: 1, "other": 1}, groups=1)
    cfg = _config(cluster, tmp_path, [TOPIC])
    daemon = Daemon(cfg, burst=True)
    other = LandingSink(cfg.landing)  # another owner landing into the same directory
    async with BrokerClient(request_timeout=10) as client:
        await _produce(client, cluster, 0, FIRST)
        await daemon.start()
        await other.start()
        try:
            consumer, sink = daemon.consumer, daemon.sink
            await wait_until(lambda: consumer.positions().get(TP) == FIRST, 30, "first incarnation fetched")
            drained = consumer.fetched_batches()
            for batch in drained:
                sink.add(batch)
            assert sink.pending() == {(TOPIC, 0): FIRST}
            first_epoch = consumer.assignment_epoch(TP)

            # every worker slot is taken: the task about to be created waits before taking a buffer
            for _ in range(sink.workers):
                await sink._slots.acquire()
            try:
                await daemon._publish_due()  # creates the publication task of TP
                assert sink.busy(TP) and sink.pending() == {(TOPIC, 0): FIRST}

                # revoke, then assign again: the new incarnation resumes from the (empty) landing
                await daemon.reload(
                    cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"topics": ["other"]})})
                )
                await wait_until(lambda: TP not in consumer.assignment(), 30, "revoke")
                assert sink.pending() == {}
                await daemon.reload(cfg)
                await wait_until(lambda: TP in consumer.assignment(), 30, "re-assignment")
                await wait_until(
                    lambda: consumer.positions().get(TP) == FIRST, 30, "second incarnation fetched"
                )
                daemon._drain()
                assert sink.pending() == {(TOPIC, 0): FIRST}
                assert sink.busy(TP)  # the task still waits for a slot
                assert consumer.assignment_epoch(TP) != first_epoch  # a new assignment

                # the other owner lands 0..3 first
                table = pa.Table.from_batches([b.records for b in drained]).slice(0, OTHER_LANDS)
                outcome = await other.run_blocking(
                    other.publisher.stream, TOPIC, 0, table.to_batches(), None, None
                )
                assert outcome.conflict is None and outcome.error is None
                assert [(r.first_offset, r.last_offset) for r in outcome.published] == [(0, OTHER_LANDS - 1)]
            finally:
                for _ in range(sink.workers):
                    sink._slots.release()

            # the task takes the new incarnation's buffer (0..9) and loses: the landing holds 0..3
            await wait_until(lambda: not sink.busy(TP), 30, "the publication task to end")
            assert daemon.stats["publish_conflicts"] == 1 and daemon.stats["files_published"] == 0
            assert daemon.stats["records_dropped"] == 2 * FIRST  # the revoked buffer, the lost one
            assert sink.pending() == {}

            # more records, then the working loop in burst mode lands everything and stops
            await _produce(client, cluster, FIRST, LATER)
            await asyncio.wait_for(daemon.run(), 60)
        finally:
            await other.close()
            await daemon.stop()

    total = FIRST + LATER
    landed = _landed_offsets(tmp_path / "landing")
    missing = sorted(set(range(total)) - set(landed))
    assert not missing, f"records lost behind a gap: offsets {missing} never landed"
    assert landed == list(range(total)), "duplicate records"
