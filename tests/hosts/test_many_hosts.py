"""Issue 33's cases on the many-hosts rig (mqd/testing/hosts.py): three Apache Kafka brokers, three
``mqd run`` daemons in one group, SeaweedFS, a Spark standalone master (with the ``mqd spark``
driver) and two Spark workers, each on its own network host, faulted by host while a producer
writes acks=all into a topic replicated three times.

Every test ends with the chaos run's ledger check (mqd_dev.chaos.check.check_payloads): each record
Kafka acknowledged is in the landing (read back from S3 across the bridge) exactly once, at the
partition and offset it was acknowledged at, none lost, none duplicated; and the landing is
Kafka's log, offset by offset (check.compare). The Spark case checks the Delta table the same way,
read by delta-rs (not Spark). One rig serves the module,
each test on a stream (topic, group, landing prefix) of its own.

Needs root, nftables and libfaketime; skips elsewhere, saying what is missing."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from mqd_dev.chaos import check
from mqd_dev.chaos.kafka_source import KafkaLoad, read_kafka_log
from mqd_dev.chaos.ledger import SCHEMA as LEDGER_SCHEMA
from mqd_dev.chaos.ledger import Ledger, read_ledger
from mqd_dev.chaos.load import record_value

from mqd.testing.hosts import HostRig
from mqd.testing.hosts_net import missing_requirements
from mqd.waiting import wait_until

pytestmark = pytest.mark.skipif(
    bool(missing_requirements(clock=True)),
    reason="the many-hosts rig needs " + ", ".join(missing_requirements(clock=True)),
)

SESSION = 3.0  # the daemons' group session (HostRig's default)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[HostRig]:
    with HostRig(tmp_path_factory.mktemp("rig"), session_timeout=SESSION, spark_workers=2) as r:
        yield r
        if request.session.testsfailed:
            print(r.dump_logs(), file=sys.stderr)


@pytest.fixture(autouse=True)
def healed(rig: HostRig) -> Iterator[None]:
    yield
    rig.heal()


async def wait_assigned(rig: HostRig, members: set[str], timeout: float) -> float:
    """Until the group is stable with exactly ``members`` owning every partition; the seconds taken."""
    started = time.monotonic()

    def settled() -> bool:
        a = rig.assignment()
        owned = set().union(*a.values()) if a else set()
        return set(a) == members and owned == set(range(rig.partitions))

    await wait_until(
        lambda: asyncio.to_thread(settled), timeout, f"the group to be {sorted(members)}", interval=0.2
    )
    return time.monotonic() - started


class Run:
    """The steady load of the chaos run (acks=all, idempotent) into the rig's stream, its ledger."""

    def __init__(self, rig: HostRig, root: Path, interval: float = 0.2, records: int = 20) -> None:
        self.rig = rig
        self.ledger = Ledger(root / f"{rig.topic}-ledger.tsv")
        self.load = KafkaLoad(
            rig.bootstrap,
            rig.topic,
            rig.partitions,
            batch_records=records,
            interval=interval,
            ledger=self.ledger,
        )

    async def start(self) -> None:
        self.load.start()
        await wait_until(lambda: self.load.acknowledged > 0, 30, "the first acknowledged records")

    async def landed(self, timeout: float = 90.0) -> None:
        """Until every partition landed what was acknowledged so far."""
        await asyncio.to_thread(self.rig.wait_landed, dict(self.load.acked_end), timeout)

    async def landed_beyond(self, mark: dict[int, int], timeout: float = 90.0) -> None:
        """Until every partition landed past ``mark`` (records acknowledged after it are landed)."""
        await wait_until(
            lambda: self.load.acknowledged and all(self.load.acked_end[p] > m for p, m in mark.items()),
            timeout,
            "records past the mark",
            interval=0.1,
        )
        await asyncio.to_thread(
            self.rig.wait_landed, {p: m + 1 for p, m in mark.items()}, timeout, "the landing past the mark"
        )

    async def finish(self) -> check.PayloadCheck:
        """Stop the load, wait until the landing holds every acknowledged record, check it."""
        await self.load.stop()
        await self.landed()
        self.ledger.close()
        ledger = read_ledger(self.ledger.path)
        landing = await asyncio.to_thread(self.rig.read_landing)
        log = await asyncio.to_thread(
            read_kafka_log, self.rig.bootstrap, self.rig.topic, dict(self.load.acked_end)
        )
        vs_log = check.compare(log, landing)
        res = check.check_payloads(ledger, landing)
        assert vs_log.ok, (
            f"the landing against Kafka's log: {vs_log}; against the ledger: {res}; load {self.load.errors}"
        )
        assert res.acknowledged == self.load.acknowledged > 0
        return res


def exact(res: check.PayloadCheck) -> None:
    assert (res.lost, res.duplicates, res.moved, res.foreign) == (0, 0, 0, 0), res.examples
    assert res.distinct == res.acknowledged + res.unacknowledged


async def test_a_daemon_cut_from_the_coordinator_publishes_nothing_its_successor_publishes(
    rig: HostRig, tmp_path: Path
) -> None:
    """d1 loses the group coordinator's broker (only that pair is cut: it still reaches S3 and the
    other brokers) for three sessions while records flow. The coordinator hands its partitions to
    d0 and d2, which land them; d1, a zombie that may still hold files for them, cannot publish
    over them (the claim chain fences it). After the cut heals d1 rejoins; the landing holds every
    acknowledged record exactly once."""
    rig.use_stream("zombie", 6)
    await asyncio.to_thread(rig.start_daemons)
    run = Run(rig, tmp_path)
    await run.start()
    await wait_assigned(rig, {"d0", "d1", "d2"}, 30)
    await run.landed()
    coordinator = await asyncio.to_thread(rig.coordinator_host)
    d1 = rig.host("d1")
    d1.cut(coordinator)
    cut_at = time.monotonic()
    took = await wait_assigned(rig, {"d0", "d2"}, 30)
    print(f"d1 cut from {coordinator.name}: its partitions handed on in {took:.1f}s")
    assert rig.daemons[1].running  # still up, still reaching S3: a zombie
    await run.landed_beyond(dict(run.load.acked_end))  # its successors publish meanwhile
    assert time.monotonic() - cut_at > SESSION
    rig.heal()
    await wait_assigned(rig, {"d0", "d1", "d2"}, 60)
    exact(await run.finish())


def big_records(
    rig: HostRig, per_partition: int, key_bytes: int, first_seq: int = 0
) -> list[tuple[int, int]]:
    """acks=all records whose values are chaos payloads and whose keys are ``key_bytes`` random
    bytes (the landing's files grow past a multipart part fast); (partition, offset) per payload
    sequence number, in order."""
    from confluent_kafka import Producer

    acked: list[tuple[int, int, bytes]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))

    producer = Producer(
        {"bootstrap.servers": rig.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 20}
    )
    for seq in range(first_seq, first_seq + per_partition):
        for p in range(rig.partitions):
            producer.produce(
                rig.topic,
                value=record_value(p, seq),
                key=os.urandom(key_bytes),
                partition=p,
                on_delivery=delivered,
            )
        producer.poll(0)
    assert producer.flush(60) == 0
    return [(p, o) for p, o, _ in acked]


def ledger_of(rig: HostRig, acks: list[tuple[int, int]], per_partition: int, first_seq: int) -> pa.Table:
    """The ledger (mqd_dev.chaos.ledger's columns) of records produced by :func:`big_records`."""
    by_partition: dict[int, list[int]] = {}
    for p, o in acks:
        by_partition.setdefault(p, []).append(o)
    rows: dict[str, list[Any]] = {c: [] for c in LEDGER_SCHEMA.names}
    for p, offsets in by_partition.items():
        assert len(offsets) == per_partition
        for i, o in enumerate(sorted(offsets)):
            rows["topic"].append(rig.topic)
            rows["partition"].append(p)
            rows["offset"].append(o)
            rows["payload"].append(record_value(p, first_seq + i))
            rows["generation"].append(0)
    return pa.table(rows, schema=LEDGER_SCHEMA)


def uploads_in_progress(rig: HostRig) -> dict[int, int]:
    """partition -> multipart uploads under way for the stream's staged files."""
    assert rig.s3 is not None
    r = rig.s3.client().list_multipart_uploads(Bucket="landing", Prefix=f"{rig.topic}/_staging/")
    out: dict[int, int] = {}
    for u in r.get("Uploads", []):
        p = int(u["Key"].split("/")[3])
        out[p] = out.get(p, 0) + 1
    return out


async def test_a_daemon_cut_from_s3_mid_multipart_upload_loses_nothing(rig: HostRig) -> None:
    """Records with 2 KiB keys make each landing file a multipart upload (8 MiB parts) within
    seconds. Once d1 has parts up, its host loses S3 mid-upload, then vanishes altogether
    (isolated): d0 and d2 own its partitions within about one session (measured from the host's
    loss; printed), land them, and when d1 comes back nothing is lost or landed twice, its
    half-done upload notwithstanding."""
    per_partition, key_bytes = 6000, 2048
    rig.use_stream("multipart", 3, {"landing": {"max_age": 30.0, "max_bytes": 256 * 1024 * 1024}})
    await asyncio.to_thread(rig.start_daemons)
    await wait_assigned(rig, {"d0", "d1", "d2"}, 30)
    (mine,) = (ps for c, ps in rig.assignment().items() if c == "d1")
    acks = await asyncio.to_thread(big_records, rig, per_partition, key_bytes)
    await wait_until(
        lambda: asyncio.to_thread(lambda: bool(set(uploads_in_progress(rig)) & mine)),
        60,
        "d1 to have a multipart upload under way",
        interval=0.2,
    )
    d1 = rig.host("d1")
    d1.cut(rig.host("s3"))
    await asyncio.sleep(1.0)  # the fault's window: d1's next part's PUT goes nowhere
    d1.isolate()
    took = await wait_assigned(rig, {"d0", "d2"}, 30)
    print(
        f"d1 lost S3 mid-upload, then vanished: its partitions {sorted(mine)} owned by others in {took:.1f}s"
    )
    assert took <= 2 * SESSION + 2.0
    more = await asyncio.to_thread(big_records, rig, 200, 64, per_partition)
    rig.heal()
    await wait_assigned(rig, {"d0", "d1", "d2"}, 60)
    ends = {p: 0 for p in range(rig.partitions)}
    for p, o in acks + more:
        ends[p] = max(ends[p], o + 1)
    await asyncio.to_thread(rig.wait_landed, ends, 120)
    ledger = pa.concat_tables(
        [ledger_of(rig, acks, per_partition, 0), ledger_of(rig, more, 200, per_partition)]
    )
    exact(check.check_payloads(ledger, await asyncio.to_thread(rig.read_landing)))


async def test_the_whole_group_killed_and_restarted_at_once(rig: HostRig, tmp_path: Path) -> None:
    """Every daemon host's processes SIGKILLed at the same moment under load, mid-file, and all
    started again together: the group forms anew from the committed positions and the landing's
    heads, and every acknowledged record is landed exactly once."""
    rig.use_stream("restart", 6)
    await asyncio.to_thread(rig.start_daemons)
    run = Run(rig, tmp_path)
    await run.start()
    await wait_assigned(rig, {"d0", "d1", "d2"}, 30)
    await run.landed()
    for i in range(3):
        rig.host(f"d{i}").kill()
    down = run.load.acknowledged
    await wait_until(
        lambda: run.load.acknowledged > down + 200, 30, "records acknowledged while no daemon runs"
    )
    await asyncio.to_thread(rig.start_daemons)
    took = await wait_assigned(rig, {"d0", "d1", "d2"}, 60)
    print(f"the group formed again in {took:.1f}s after the restart")
    exact(await run.finish())


@pytest.mark.parametrize("step", [600, -600])
async def test_one_hosts_clock_stepped_ten_minutes(rig: HostRig, tmp_path: Path, step: int) -> None:
    """d1's processes run with their wall clock ``step`` seconds off (libfaketime; the other hosts
    keep the machine's), restarted so under load: its files carry skewed times, and its janitor
    judges upload ages by its own clock, yet nothing that decides what is landed reads a clock,
    so every acknowledged record lands exactly once, whichever daemon lands it."""
    rig.use_stream(f"clock{'ahead' if step > 0 else 'behind'}", 6)
    await asyncio.to_thread(rig.start_daemons)
    run = Run(rig, tmp_path)
    await run.start()
    await run.landed()
    d1 = rig.host("d1")
    d1.step_clock(step)
    try:
        await asyncio.to_thread(rig.restart_daemon, 1)
        await wait_assigned(rig, {"d0", "d1", "d2"}, 60)
        await run.landed_beyond(dict(run.load.acked_end))  # d1 lands with its skewed clock
        await asyncio.to_thread(rig.restart_daemon, 0)  # its partitions move while d1 runs skewed
        await wait_assigned(rig, {"d0", "d1", "d2"}, 60)
        await run.landed_beyond(dict(run.load.acked_end))
        exact(await run.finish())
    finally:
        d1.step_clock(0)


def running_jobs(rig: HostRig) -> int:
    """Spark jobs the driver runs right now (its REST API on the spark host; 0 when it does not
    answer)."""
    import json
    import urllib.request

    assert rig.spark is not None
    base = f"http://{rig.spark.master_host.address}:4040/api/v1/applications"
    try:
        with urllib.request.urlopen(base, timeout=2) as r:
            apps = json.loads(r.read())
        with urllib.request.urlopen(f"{base}/{apps[0]['id']}/jobs?status=running", timeout=2) as r:
            return len(json.loads(r.read()))
    except (OSError, ValueError, IndexError, KeyError):
        return 0


def batches_done(log: Path) -> int:
    try:
        return log.read_bytes().count(b"spark_batch_done")
    except OSError:
        return 0


@pytest.mark.timeout(900)
async def test_a_spark_worker_killed_mid_batch(rig: HostRig, tmp_path: Path) -> None:
    """``mqd spark`` streams the landing into a Delta table on the standalone cluster (driver on
    the spark host, executors on w0 and w1) while records flow. While a batch's job runs, w0's
    host loses its power (its worker and executor SIGKILLed): that batch finishes on w1 (its lost
    tasks run again there); w0 comes back. The table, read by delta-rs, holds every acknowledged record
    exactly once, and what the killed executor left on disk is in the rig's folder."""
    assert rig.spark is not None
    spark = {"trigger_interval": 1, "ui": True, "ui_port": 4040, "max_files_per_trigger": 8}
    # files of a few seconds each: two one-core executors keep up with the landing
    rig.use_stream("spark", 4, {"spark": spark, "landing": {"max_age": 3.0}})
    driver = rig.spark_driver()
    driver.start()
    await asyncio.to_thread(rig.start_daemons)
    run = Run(rig, tmp_path, interval=0.5)
    await run.start()
    try:
        # the first batch waits for the executors to fetch the job's jars from the driver (~0.6 GB,
        # the AWS SDK bundle most of it): minutes on a loaded 2-core machine
        await wait_until(lambda: batches_done(driver.log_path) >= 1, 480, "the first batch", interval=0.5)
        await wait_until(
            lambda: asyncio.to_thread(running_jobs, rig), 120, "a batch's job running", interval=0.1
        )
        done = batches_done(driver.log_path)
        rig.host("w0").kill()
        print(f"w0 killed while batch {done + 1}'s job ran")
        # what the killed executor leaves (its scratch, its copy of the jars) is in the rig's
        # folder, not the machine's /tmp
        assert any((rig.spark.root / "local-w0").iterdir())
        # the batch w0 died in finishes on w1 (its lost tasks run again there)
        await wait_until(
            lambda: batches_done(driver.log_path) >= done + 1,
            480,
            "the batch w0 died in to finish",
            interval=0.5,
        )
        await asyncio.to_thread(rig.spark.restart_worker, 0)
        landing = await run.finish()
        exact(landing)
        ledger = read_ledger(run.ledger.path)

        def table_complete() -> check.PayloadCheck | None:
            res = check.check_payloads(ledger, check.read_table_output(rig.table_path(), rig.topic))
            return res if res.distinct >= res.acknowledged else None

        res = await wait_until(
            lambda: asyncio.to_thread(table_complete), 300, "the table to hold every record", interval=1.0
        )
        exact(res)
        assert driver.running
    finally:
        driver.stop(signal.SIGTERM, 60)


def _keys(table: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in table.items():
        out |= _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return out


def test_the_readmes_three_host_config_is_what_the_rig_runs(rig: HostRig, tmp_path: Path) -> None:
    """The README's "Three hosts" file passes ``mqd config check`` as printed, and every key it sets,
    the rig's daemons set too (their values differ: host names, test-sized timers)."""
    import subprocess
    import tomllib

    from support import REPO_ROOT

    section = (REPO_ROOT / "README.md").read_text().split("### Three hosts", 1)[1]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "mqd.toml"
    path.write_text(block)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQD_")}
    res = subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    readme = _keys(tomllib.loads(block))
    ours = _keys({k: v for k, v in rig.daemon_config(0).items()})
    assert readme - ours == set()
