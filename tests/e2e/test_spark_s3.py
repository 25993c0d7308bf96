"""The Spark job on an ``s3://`` landing (SeaweedFS on 127.0.0.1), through the Python data source
mqd.spark.landing_source: a real daemon lands records into the store, ``mqd spark --once`` (the
job's ``run``, in-process) appends each exactly once, a second run after more records adds only
those (Spark's checkpoint of the chain offsets), and neither a staged object nor a voided claim
ever reaches the table."""

from __future__ import annotations

import asyncio
import io
import secrets
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import structlog.testing
from support.daemon import daemon_config, produce_numbered
from support.delta import read_delta
from support.landing import stage as stage_table
from support.seaweedfs import fresh_uri, object_store
from support.spark_s3 import assert_once, s3_config, table_keys
from support.spark_s3 import s3_spark as s3_spark  # the module's Spark session with the store's env

from mqd.landing import Publisher, layout
from mqd.landing.claim_chain import ChainState, Claim
from mqd.landing.publisher import file_range
from mqd.landing.store import LandingStore
from mqd.process.daemon import Daemon
from mqd.spark import job
from mqd.spark.table_format import existing_format
from mqd.testing.seaweedfs import SeaweedFS
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.mark.slow
async def test_daemon_lands_into_s3_and_spark_reads_each_record_once(
    cluster_factory: Any, tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 records of 4 partitions landed by a daemon into s3:// are in the table exactly once
    after ``--once`` (at most 3 files per trigger: several micro-batches); 400 more, landed by a
    second daemon run, are all that the second ``--once`` adds."""
    partitions, per_partition = 4, 5_000
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)
    uri = fresh_uri(seaweedfs)
    cfg = s3_config(tmp_path / "spark", uri, seaweedfs.endpoint, max_files_per_trigger=3)
    cluster = cluster_factory(topics={"events": partitions}, groups=1)
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, partitions, per_partition, per_batch=1000)
        dcfg = daemon_config(cluster, tmp_path, max_records=1_500)
        dcfg = dcfg.model_copy(
            update={"landing": dcfg.landing.model_copy(update={"dir": uri, "s3": cfg.landing.s3})}
        )
        d = Daemon(dcfg, burst=True)
        await asyncio.wait_for(d.run(), 240)
        assert d.stats["records_published"] == partitions * per_partition

        assert await asyncio.to_thread(job.run, cfg, once=True) == 0
        assert_once(table_keys(s3_spark, cfg.spark.output_dir), partitions, per_partition)

        await produce_numbered(client, cluster, partitions, 100, start=per_partition, per_batch=100)
        d2 = Daemon(dcfg, burst=True)
        await asyncio.wait_for(d2.run(), 120)
        assert d2.stats["records_published"] == partitions * 100
        assert await asyncio.to_thread(job.run, cfg, once=True) == 0
        assert_once(table_keys(s3_spark, cfg.spark.output_dir), partitions, per_partition + 100)


def publish(pub: Publisher, partition: int, first: int, n: int, ts: int) -> None:
    raw = fmt.encode_batch([b"v%d" % i for i in range(n)], timestamps=[ts] * n, base_offset=first)
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    last = pub.store.head("events", partition).last_offset
    pub.publish("events", partition, pa.Table.from_batches([rb]), last)


def stage_claim_then_lose_it(store: LandingStore, partition: int, first: int, n: int, ts: int) -> str:
    """A publisher that claimed a staged file and died, and the janitor took the staged bytes:
    the claim can never be promoted (claim_chain.py voids it). Returns the staged key."""
    raw = fmt.encode_batch([b"lost%d" % i for i in range(n)], timestamps=[ts] * n, base_offset=first)
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    rng = file_range("events", partition, records)
    staged = stage_table(store, layout.landing_table("events", partition, records), rng, "snappy")
    chain = store.chain("events", partition)
    seq, st = chain.head()
    claim = Claim(
        seq=seq + 1,
        nonce=secrets.token_hex(16),
        prev=st,
        state=ChainState(rng.last_offset, None, st.files + 1, st.watermark_ms),
        range=staged.range,
        staged=staged.location,
        created=layout.iso_now(),
    )
    store.objects.put(chain.claim_key(claim.seq), claim.to_bytes(), if_absent=True)
    store.objects.delete(staged.location)
    return staged.location


def test_staged_objects_and_void_claims_never_reach_the_table(
    tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any
) -> None:
    """A staged object nobody claimed, a claim whose staged bytes are gone (not shown by the job's
    read-only reader; voided by the next publisher, its range published again after it) and a
    foreign object in a data folder:
    the table holds exactly the published files' records, the quarantine (JSON mode) none."""
    store = object_store(seaweedfs)
    uri = store.location
    cfg = s3_config(tmp_path, uri, seaweedfs.endpoint, max_files_per_trigger=2)
    pub = Publisher(store)
    publish(pub, 0, 0, 10, T0)
    publish(pub, 1, 0, 7, T0 + 3_600_000)
    # an orphan staged object (a publisher that died before claiming)
    raw = fmt.encode_batch([b"orphan"], timestamps=[T0], base_offset=10)
    orphan = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    stage_table(store, layout.landing_table("events", 0, orphan), file_range("events", 0, orphan), "snappy")
    stage_claim_then_lose_it(store, 0, 10, 5, T0)
    buf = io.BytesIO()
    pq.write_table(pa.table({"a": [1]}), buf)
    store.objects.put("topic=events/dt=2026-01-01/hour=00/foreign.parquet", buf.getvalue())

    assert job.run(cfg, once=True) == 0
    assert store.voided == 0  # nobody voided it yet: the job only reads (chain_reader.py)
    keys = table_keys(s3_spark, cfg.spark.output_dir)
    assert sorted(map(tuple, keys.tolist())) == sorted(
        [(0, o) for o in range(10)] + [(1, o) for o in range(7)]
    )

    publish(pub, 0, 10, 5, T0)  # the publisher voids the lost claim, then lands the range again
    assert store.voided == 1
    assert job.run(cfg, once=True) == 0
    keys = table_keys(s3_spark, cfg.spark.output_dir)
    assert sorted(map(tuple, keys.tolist())) == sorted(
        [(0, o) for o in range(15)] + [(1, o) for o in range(7)]
    )
    values = {r.value for r in read_delta(s3_spark, cfg.spark.output_dir).select("value").collect()}
    assert not any(v.startswith(b"lost") or v == b"orphan" for v in values)


def test_json_mode_quarantines_with_the_objects_uri(
    tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any
) -> None:
    """value_format = "json" on an s3:// landing: good values become columns, a bad one goes to
    the dead-letter table with its error class and the s3:// URI of the file it came from."""
    store = object_store(seaweedfs)
    cfg = s3_config(tmp_path, store.location, seaweedfs.endpoint, value_format="json", value_schema="n INT")
    values = [b'{"n": %d}' % i for i in range(5)] + [b"{not json"]
    raw = fmt.encode_batch(values, timestamps=[T0] * len(values), base_offset=0)
    rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
    rng = Publisher(store).publish("events", 0, pa.Table.from_batches([rb]), None)
    assert job.run(cfg, once=True) == 0
    good = read_delta(s3_spark, cfg.spark.output_dir)
    assert sorted(r.n for r in good.select("n").collect()) == list(range(5))
    [bad] = read_delta(s3_spark, cfg.spark.quarantine_dir).collect()
    assert bad.offset == 5 and bad.error_class == "not_json" and bad.error_message
    assert bad.source_file == f"{store.location}/{rng.path}"


def test_a_claimed_file_that_is_gone_fails_the_job_naming_it(
    tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any
) -> None:
    """A published file deleted behind the chain's back (not the head: nobody voids it) is not
    skipped: the job exits 1 with spark_unreadable_file naming its s3:// URI, every run, and the
    table gets none of the batch."""
    store = object_store(seaweedfs)
    cfg = s3_config(tmp_path, store.location, seaweedfs.endpoint)
    pub = Publisher(store)
    publish(pub, 0, 0, 3, T0)
    gone = store.manifest()[0]
    publish(pub, 0, 3, 3, T0)
    store.objects.delete(gone.path)
    with structlog.testing.capture_logs() as logs:
        assert job.run(cfg, once=True) == 1
    [failed] = [e for e in logs if e["event"] == "spark_unreadable_file"]
    assert failed["file"] == f"{store.location}/{gone.path}"
    assert existing_format(Path(cfg.spark.output_dir)) is None  # no batch committed, in no format
