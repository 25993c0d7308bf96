"""The landing's lifecycle with the real Spark job (mqd/landing/lifecycle.py): ``mqd spark --once``
registers its queries and records what each committed from its checkpoint; the cleaner then
deletes exactly the committed files (never ones landed after, never a chain's newest); a second
``--once`` still works on the cleaned landing and the table holds every record exactly once. On a
local landing (Spark's file source, JSON mode: main and quarantine queries) and on an ``s3://``
landing (SeaweedFS, mqd's data source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support.seaweedfs import object_store
from support.spark_s3 import assert_once, s3_config, s3_spark, table_keys

from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing import LocalStore, Publisher, lifecycle
from mqd.landing.store import LandingStore
from mqd.spark import job
from mqd.testing.seaweedfs import SeaweedFS
from mqd.wire import format as fmt

pytestmark = pytest.mark.spark
__all__ = ["s3_spark"]  # the module's Spark session fixture (tests/support/spark_s3.py)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
PER_FILE = 5


def land(store: LandingStore, partitions: int, files: int) -> list[list[str]]:
    """``files`` more files of PER_FILE JSON records on each partition of topic ``events``."""
    pub = Publisher(store)
    out: list[list[str]] = []
    for p in range(partitions):
        paths = []
        for _ in range(files):
            last = store.head("events", p).last_offset
            first = 0 if last is None else last + 1
            values = [b'{"n": %d}' % (first + i) for i in range(PER_FILE)]
            raw = fmt.encode_batch(values, timestamps=[T0] * PER_FILE, base_offset=first)
            rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
            paths.append(pub.publish("events", p, pa.Table.from_batches([rb]), last).path)
        out.append(paths)
    return out


def present(store: LandingStore, paths: list[str]) -> list[bool]:
    return [store.objects.head(p) is not None for p in paths]


def check_lifecycle(cfg: MqdConfig, store: LandingStore, spark: Any, queries: list[str]) -> None:
    first = land(store, 2, 3)
    assert job.run(cfg, once=True) == 0
    recs = lifecycle.records(store)
    assert sorted(recs) == sorted(queries)
    assert all(r.committed == {"events/0": 3, "events/1": 3} for r in recs.values()), recs
    later = land(store, 2, 2)  # landed after the job committed: kept
    got = lifecycle.Cleaner(store).clean()
    assert got.deleted == 2 * 3 and got.expired == 0
    for p in range(2):
        assert present(store, first[p]) == [False, False, False]
        assert present(store, later[p]) == [True, True]
    assert job.run(cfg, once=True) == 0  # Spark copes with the deleted, already-read files
    assert all(r.committed == {"events/0": 5, "events/1": 5} for r in lifecycle.records(store).values())
    assert lifecycle.Cleaner(store).clean().deleted == 2  # the newest of each chain stays
    assert_once(table_keys(spark, Path(cfg.spark.output_dir)), 2, 5 * PER_FILE)


def test_local_json_mode_cleans_what_both_queries_committed(tmp_path: Path, s3_spark: Any) -> None:
    """Local landing, JSON mode: both queries (main, quarantine) register and record; the cleaner
    deletes exactly what both committed; a second run and the table are intact. Then a
    registered quarantine query that falls behind (here: its record reset, as a query that has
    not committed anything) holds every file back."""
    cfg = MqdConfig(
        landing=LandingConfig(dir=tmp_path / "landing"),
        spark=SparkConfig(
            output_dir=tmp_path / "out",
            checkpoint_dir=tmp_path / "ckpt",
            quarantine_dir=tmp_path / "quarantine",
            shuffle_partitions=2,
            max_files_per_trigger=2,
            value_format="json",
            value_schema="n INT",
        ),
    )
    store = LocalStore(Path(cfg.landing.dir))
    store.open()
    check_lifecycle(cfg, store, s3_spark, [job.query_name(cfg), job.query_name(cfg, quarantine=True)])
    quarantine = job.query_name(cfg, quarantine=True)
    lifecycle.record_committed(store, quarantine, {}, None)
    new = land(store, 2, 2)
    lifecycle.record_committed(store, job.query_name(cfg), {"events/0": 7, "events/1": 7}, 9)
    assert lifecycle.Cleaner(store).clean().deleted == 0
    assert all(present(store, new[0] + new[1]))


def test_s3_landing_cleans_what_the_query_committed(
    tmp_path: Path, seaweedfs: SeaweedFS, s3_spark: Any
) -> None:
    """s3:// landing (mqd's data source, offsets per chain in the checkpoint): the job's record
    comes from the checkpoint's offset log; cleaning and a second run as on the local landing."""
    store = object_store(seaweedfs)
    assert isinstance(store, LandingStore)
    cfg = s3_config(tmp_path, store.location, seaweedfs.endpoint, max_files_per_trigger=2)
    check_lifecycle(cfg, store, s3_spark, [job.query_name(cfg)])
