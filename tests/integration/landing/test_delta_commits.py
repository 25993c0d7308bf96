"""The committer's own reader and writer of the landing table's Delta log (delta_commits.py), against
logs delta-rs reads and checkpoints: a fresh committer takes the txn versions from the newest
checkpoint when the commits before it expired; a committer frozen past the log's expiry does not
write a version the log already passed; the answer to its own put lost, it finds its commit by its
nonce and writes nothing twice; a commit of other partitions in its way moves it one version up; a
table upgraded past writer 2 is not written. delta-rs reads every commit written here."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import deltalake
import pytest

from mqd.landing import delta_log
from mqd.landing.delta_commits import DeltaCommits, commit_key
from mqd.landing.delta_log import LandingTable, app_id
from mqd.landing.errors import ObjectStoreError, StaleCommit, TableError
from mqd.landing.layout import FileRange
from mqd.landing.local_objects import LocalObjects

T0 = 1_767_225_600_000
INC = "0123456789abcdef0123456789abcdef"


def rng(partition: int, first: int, count: int = 10) -> FileRange:
    return FileRange(
        f"topic=events/dt=2026-01-01/hour=0/part-{partition:05d}-{INC}-{first:020d}.parquet",
        "events",
        partition,
        first,
        first + count - 1,
        count,
        T0,
        T0,
        bytes=1000,
        created="2026-01-01T00:00:00+00:00",
        incarnation=INC,
    )


def table(root: Path, objects: LocalObjects | None = None, **kw: Any) -> LandingTable:
    t = LandingTable(str(root), objects or LocalObjects(root), **kw)
    t.load()
    return t


def delta_files(root: Path) -> list[str]:
    return sorted(deltalake.DeltaTable(str(root)).file_uris())


def test_a_fresh_committer_reads_the_txns_from_the_checkpoint_when_older_commits_expired(
    tmp_path: Path,
) -> None:
    """Seven commits with a checkpoint every 3 (versions 2 and 5), the log aged and cleaned: the
    commits before version 5 are gone, and a new committer's view still holds every partition's
    txn version (three of them only in the checkpoint) and the newest version."""
    t = table(tmp_path, checkpoint_interval=3, log_retention_s=60)
    for p in range(6):
        t.add([rng(p, 0)])
    log_dir = tmp_path / delta_log.DELTA_LOG
    old = time.time() - 3600
    for entry in log_dir.iterdir():
        os.utime(entry, (old, old))
    t.add([rng(6, 0)])  # version 7; no checkpoint
    t.add([rng(0, 10)])  # version 8 completes an interval: checkpoint 8, cleanup
    assert not (log_dir / f"{4:020d}.json").exists()
    fresh = DeltaCommits(LocalObjects(tmp_path))
    assert fresh.refresh()
    assert fresh.version == 8
    assert fresh.txns == {app_id("events", p, INC): 19 if p == 0 else 9 for p in range(7)}
    assert len(delta_files(tmp_path)) == 8


def test_a_committer_frozen_past_the_logs_expiry_writes_after_the_newest_version(tmp_path: Path) -> None:
    """A reads the log at version 1; B commits past two checkpoints and the entries A would read
    next expire. A's refresh sees the newer checkpoint and reads the log again, so its commit is
    the newest version + 1, and every file is in the table. (Reading forward only, A found no
    version 2 and wrote it again: a commit no reader reads, below the checkpoints.)"""
    a = table(tmp_path, checkpoint_interval=3, log_retention_s=60)
    a.add([rng(0, 0)])  # version 1
    b = table(tmp_path, checkpoint_interval=3, log_retention_s=60)
    for p in range(1, 7):
        b.add([rng(p, 0)])  # versions 2..7, checkpoints 2 and 5
    old = time.time() - 3600
    for entry in (tmp_path / delta_log.DELTA_LOG).iterdir():
        os.utime(entry, (old, old))
    b.add([rng(7, 0)])  # version 8: checkpoint, cleanup of everything below 8
    assert not (tmp_path / commit_key(2)).exists()
    assert a.load()
    assert a.version == 8
    assert a.add([rng(0, 10)]) == 9
    assert len(delta_files(tmp_path)) == 9
    assert deltalake.DeltaTable(str(tmp_path)).transaction_version(app_id("events", 0, INC)) == 19


class LosesTheAnswer(LocalObjects):
    """The next put of a log commit takes effect, then its answer is lost."""

    lose = 1

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        etag = super().put(key, data, if_absent=if_absent, if_match=if_match)
        if key.startswith(f"{delta_log.DELTA_LOG}/") and self.lose > 0:
            self.lose -= 1
            raise ObjectStoreError(f"put {key}: connection reset")
        return etag


def test_a_commit_whose_answer_was_lost_is_found_by_its_nonce(tmp_path: Path) -> None:
    """The put took effect and its answer was lost: the committer reads the version back, finds
    its own nonce and returns that version; nothing is written twice."""
    t = table(tmp_path, LosesTheAnswer(tmp_path))
    assert t.add([rng(0, 0)]) == 1
    assert t.add([rng(0, 10)]) == 2
    assert not (tmp_path / commit_key(3)).exists()
    assert len(delta_files(tmp_path)) == 2


def test_a_commit_of_other_partitions_moves_the_commit_up_and_one_of_the_same_refuses_it(
    tmp_path: Path,
) -> None:
    """A and B read version 0. B commits partition 1: A's commit of partition 0 lands as version 2.
    B, still at version 1, commits partition 0's same file: refused (StaleCommit), the log unchanged."""
    a, b = table(tmp_path), table(tmp_path)
    assert b.add([rng(1, 0)]) == 1
    assert a.add([rng(0, 0)]) == 2
    with pytest.raises(StaleCommit):
        b.add([rng(0, 0)])
    assert b.version == 2  # it read A's commit
    assert len(delta_files(tmp_path)) == 2


def test_a_table_upgraded_past_writer_2_is_read_but_not_written(tmp_path: Path) -> None:
    """A commit that raises the protocol (another writer enabled a feature mqd does not write):
    the committer still reads the txn versions, but refuses to commit, naming the protocol."""
    t = table(tmp_path)
    t.add([rng(0, 0)])
    (tmp_path / commit_key(2)).write_text(
        json.dumps({"commitInfo": {"operation": "UPGRADE PROTOCOL"}})
        + "\n"
        + json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 4}})
        + "\n"
    )
    assert t.load() and t.version == 2
    assert t.committed(rng(0, 0))
    with pytest.raises(TableError, match="writer 4"):
        t.add([rng(0, 10)])
    assert not (tmp_path / commit_key(3)).exists()


def _actions(root: Path, version: int) -> dict[str, Any]:
    lines = (root / commit_key(version)).read_text().splitlines()
    return {k: v for line in lines for k, v in json.loads(line).items()}


def test_the_table_mqd_creates_is_the_one_delta_rs_created(tmp_path: Path) -> None:
    """The landing table's version 0, written by mqd's own writer, holds the protocol and the
    metadata (schema, partition columns, properties, name) that delta-rs's create wrote for the
    same table before; delta-rs reads it as that table, and files committed to it are read."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    t = table(mine, checkpoint_interval=7, log_retention_s=120)
    assert t.version == 0
    deltalake.DeltaTable.create(
        str(theirs),
        delta_log.table_schema(),
        partition_by=list(delta_log.PARTITION_BY),
        name="mqd_landing",
        description="mqd's landing: the files the claim chains published (mqd/landing/delta_log.py)",
        configuration=t.properties(),
    )
    a, b = _actions(mine, 0), _actions(theirs, 0)
    assert a["protocol"] == b["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}
    volatile = ("id", "createdTime", "schemaString")
    assert {k: v for k, v in a["metaData"].items() if k not in volatile} == {
        k: v for k, v in b["metaData"].items() if k not in volatile
    }
    assert json.loads(a["metaData"]["schemaString"]) == json.loads(b["metaData"]["schemaString"])
    assert a["metaData"]["configuration"]["delta.checkpointInterval"] == "7"
    read = deltalake.DeltaTable(str(mine))
    assert read.version() == 0 and read.metadata().partition_columns == list(delta_log.PARTITION_BY)
    assert read.schema() == deltalake.DeltaTable(str(theirs)).schema()
    t.add([rng(0, 0), rng(1, 0)])
    assert delta_files(mine) == sorted(str(mine / rng(p, 0).path) for p in (0, 1))


def test_daemons_that_create_the_table_at_once_make_one_table(tmp_path: Path) -> None:
    """Eight committers load a landing with no table at the same moment: version 0 is written once
    (create-only), the others read that table; no second table id over the first, no version 1."""
    tables = [LandingTable(str(tmp_path), LocalObjects(tmp_path)) for _ in range(8)]
    barrier = threading.Barrier(len(tables))

    def load(t: LandingTable) -> bool:
        barrier.wait(timeout=30)
        return t.load()

    with ThreadPoolExecutor(len(tables)) as pool:
        assert list(pool.map(load, tables, timeout=60)) == [True] * len(tables)
    assert sorted(p.name for p in (tmp_path / "_delta_log").iterdir()) == [commit_key(0).split("/")[-1]]
    assert {t.version for t in tables} == {0}
    assert deltalake.DeltaTable(str(tmp_path)).version() == 0
