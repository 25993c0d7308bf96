"""The Spark job reads an ``s3://`` landing with read-only credentials: `mqd spark --once` as its own
process, through a SeaweedFS gateway whose only keys for the job may Read and List (PutObject,
CopyObject and DeleteObject answer AccessDenied). A chain head whose promotion is not done is not
in the table and is left alone (no promotion, no void) until the next writer completes it; then
the next run adds it. The lifecycle records the job could not write are logged, never fatal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.cli import mqd
from support.half_claims import claim_unpromoted
from support.seaweedfs import object_store

from mqd.landing import Publisher
from mqd.testing.configfiles import to_toml
from mqd.testing.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS
from mqd.wire import format as fmt

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
READER_KEY, READER_SECRET = "mqd-reader", "mqd-reader-secret"


@pytest.fixture(scope="module")
def read_only_gateway(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A third gateway on the session's filer that authenticates: the tests' usual keys may do
    anything, the reader's keys only Read and List. Its endpoint URL."""
    identities = tmp_path_factory.mktemp("s3-identities") / "s3.json"
    identities.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "admin",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "List", "Write", "Tagging"],
                    },
                    {
                        "name": "reader",
                        "credentials": [{"accessKey": READER_KEY, "secretKey": READER_SECRET}],
                        "actions": ["Read", "List"],
                    },
                ]
            }
        )
    )
    yield seaweedfs.add_gateway(f"-config={identities}")


def publish(pub: Publisher, partition: int, n: int) -> None:
    last = pub.store.head("events", partition).last_offset
    first = 0 if last is None else last + 1
    raw = fmt.encode_batch([b"v"] * n, timestamps=np.full(n, T0, dtype=np.int64), base_offset=first)
    pub.publish("events", partition, pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])]), last)


def spark_once(root: Path, uri: str, endpoint: str) -> str:
    """`mqd spark --once` with the reader's keys; its output (rc 0 asserted)."""
    cfg = root / "spark.toml"
    cfg.write_text(
        to_toml(
            {
                "landing": {"dir": uri, "s3.endpoint_url": endpoint, "s3.region": REGION},
                "spark": {
                    "master": "local[2]",
                    "output_dir": str(root / "out"),
                    "checkpoint_dir": str(root / "ckpt"),
                    "quarantine_dir": str(root / "quarantine"),
                    "shuffle_partitions": 2,
                },
                "log": {"format": "json"},
            }
        )
    )
    env = {"AWS_ACCESS_KEY_ID": READER_KEY, "AWS_SECRET_ACCESS_KEY": READER_SECRET, "AWS_REGION": REGION}
    res = mqd("spark", "--once", "--config", str(cfg), timeout=240, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    return str(res.stdout) + str(res.stderr)


def table_keys(out: Path) -> list[tuple[int, int]]:
    from deltalake import DeltaTable

    t = DeltaTable(str(out)).to_pyarrow_table(columns=["partition", "offset"])
    return sorted(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))


def test_spark_reads_with_read_only_keys_and_leaves_a_half_promoted_head_alone(
    tmp_path: Path, seaweedfs: SeaweedFS, read_only_gateway: str
) -> None:
    """Two chains, one with a claimed but unpromoted head: the read-only job lands exactly the
    visible files; the half-done claim is neither promoted nor voided by it; once the publisher's
    next commit completes it, the next run adds it and the new file, each record once."""
    store = object_store(seaweedfs)
    pub = Publisher(store)
    publish(pub, 0, 10)
    publish(pub, 1, 7)
    half, staged = claim_unpromoted(store, "events", 0, 5)
    head = store.chain("events", 0).latest()[1]
    assert head is not None

    out = spark_once(tmp_path, store.location, read_only_gateway)
    assert table_keys(tmp_path / "out") == [(0, o) for o in range(10)] + [(1, o) for o in range(7)]
    assert store.objects.head(half.path) is None and store.objects.head(staged) is not None
    assert store.chain("events", 0).read_claim(head.seq + 1) is None  # not voided either
    assert "lifecycle_register_failed" in out  # read-only: logged, the job went on

    publish(pub, 0, 2)  # the next writer promotes the half-done claim, then lands after it
    spark_once(tmp_path, store.location, read_only_gateway)
    assert table_keys(tmp_path / "out") == [(0, o) for o in range(17)] + [(1, o) for o in range(7)]
