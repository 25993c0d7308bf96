"""The daemon landing into object storage (landing.dir = "s3://bucket/prefix", SeaweedFS): 100,000
records of 4 partitions land exactly once, read back through the store; a second burst with the
broker commit lost resumes from the store's heads and adds only the new records."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from support.daemon import daemon_config, produce_numbered
from support.seaweedfs import fresh_uri

from mqd.config import LandingS3Config
from mqd.landing.s3_objects import S3Objects
from mqd.landing.store import LandingStore
from mqd.process.daemon import Daemon
from mqd.testing.seaweedfs import SeaweedFS
from mqd.wire.client import BrokerClient

PARTITIONS = 4
PER_PARTITION = 25_000


def landed(store: LandingStore) -> Counter[tuple[int, int]]:
    """(partition, offset) -> how many visible files hold it, read through the store."""
    seen: Counter[tuple[int, int]] = Counter()
    for key in store.visible_files():
        got = store.objects.get(key)
        assert got is not None, key
        t = pq.read_table(io.BytesIO(got[0]), columns=["partition", "offset"])
        seen.update(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))
    return seen


@pytest.mark.slow
async def test_daemon_lands_100k_records_into_s3_exactly_once(
    cluster_factory: Any, tmp_path: Path, seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Burst run into s3://: every record once in the visible files, the manifest lists exactly
    them, the heads are the log ends; a rerun under another group (broker commit lost) lands only
    the 400 new records."""
    for k, v in seaweedfs.env().items():
        monkeypatch.setenv(k, v)  # boto3's standard credential chain, as a deployment would
    uri = fresh_uri(seaweedfs)
    s3 = LandingS3Config(endpoint_url=seaweedfs.endpoint, region="us-east-1")
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=1)
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=5000)
        cfg = daemon_config(cluster, tmp_path, max_records=20_000)
        cfg = cfg.model_copy(update={"landing": cfg.landing.model_copy(update={"dir": uri, "s3": s3})})
        d = Daemon(cfg, burst=True)
        await asyncio.wait_for(d.run(), 240)
        assert d.stats["records_published"] == PARTITIONS * PER_PARTITION

        store = LandingStore(S3Objects(uri, client=seaweedfs.client()))
        seen = landed(store)
        assert len(seen) == PARTITIONS * PER_PARTITION and set(seen.values()) == {1}
        assert set(seen) == {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}
        manifest = store.manifest("events")
        assert sorted(r.path for r in manifest) == store.visible_files()
        assert sum(r.count for r in manifest) == PARTITIONS * PER_PARTITION
        assert [store.head("events", p).last_offset for p in range(PARTITIONS)] == [PER_PARTITION - 1] * 4

        await produce_numbered(client, cluster, PARTITIONS, 100, start=PER_PARTITION, per_batch=100)
        cfg2 = cfg.model_copy(update={"consumer": cfg.consumer.model_copy(update={"group": "other"})})
        d2 = Daemon(cfg2, burst=True)
        await asyncio.wait_for(d2.run(), 120)
        assert d2.stats["records_published"] == PARTITIONS * 100
        seen = landed(store)
        assert len(seen) == PARTITIONS * (PER_PARTITION + 100) and set(seen.values()) == {1}
