"""The landing table's committer and the lifecycle against the real Delta log (delta-rs), on a
local landing published by the real publisher: a stale commit is refused by the log, two committers
racing over the same chains add every file once, the cleaner takes a file out of the table before
it deletes it (and keeps a file the table does not hold yet), and a table switched on over a
landing the cleaner already thinned skips the deleted files with a count; expired log entries go at
the commits that write a checkpoint, not at every commit, and a commit returns its own version; a
broken chain is left out of a round while the others are committed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.table_readers import every_reader_keys, offsets

from mqd.landing import delta_log, lifecycle
from mqd.landing.delta_log import LandingTable
from mqd.landing.errors import StaleCommit
from mqd.landing.layout import FileRange
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import Publisher
from mqd.landing.table_committer import TableCommitter
from mqd.wire import format as fmt

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
INC = "0123456789abcdef0123456789abcdef"
PARTITIONS = 2


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    s = LocalStore(tmp_path / "landing")
    s.open()
    return s


def publish(store: LocalStore, partition: int, files: int, per_file: int = 10) -> list[FileRange]:
    """Land ``files`` consecutive files of ``per_file`` records on ``events``/``partition``."""
    pub = Publisher(store)
    out = []
    for _ in range(files):
        head = store.head("events", partition)
        first = 0 if head.last_offset is None else head.last_offset + 1
        raw = fmt.encode_batch(
            [b"v"] * per_file, timestamps=np.full(per_file, T0, dtype=np.int64), base_offset=first
        )
        records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
        expected_inc = None if head.last_offset is None else INC
        out.append(
            pub.publish(
                "events",
                partition,
                records,
                head.last_offset,
                incarnation=INC,
                expected_incarnation=expected_inc,
            )
        )
    return out


def committer(store: LocalStore, name: str) -> TableCommitter:
    table = LandingTable(delta_log.table_uri(store.location), store.objects, checkpoint_interval=3)
    return TableCommitter(store.objects, table, name=name)


def all_tps() -> set[tuple[str, int]]:
    return {("events", p) for p in range(PARTITIONS)}


def table_offsets(store: LocalStore) -> list[tuple[str, int, int]]:
    """The table's (topic, partition, offset) as each reader sees it; every reader must agree."""
    seen = {reader: offsets(keys) for reader, keys in every_reader_keys(store.location).items()}
    first: list[tuple[str, int, int]] = next(iter(seen.values()))
    for reader, got in seen.items():
        assert got == first, f"{reader} reads another table"
    return first


def test_a_commit_from_a_stale_read_is_refused_by_the_log(store: LocalStore) -> None:
    """Two tables loaded at one version compute the same missing files; the first commit lands,
    the second is refused (StaleCommit: the log holds a txn of the same appId since its read)."""
    files = publish(store, 0, 3)
    a, b = committer(store, "a"), committer(store, "b")
    a.table.load()
    b.table.load()
    a.table.add(files, committer="a")
    with pytest.raises(StaleCommit):
        b.table.add(files, committer="b")
    assert table_offsets(store) == [("events", 0, o) for o in range(30)]


def test_expired_log_entries_go_at_checkpoint_commits_only(store: LocalStore) -> None:
    """delta-rs lists the whole log for expired entries after every commit by default; the landing
    table asks for it only on a commit that writes a checkpoint (version v with v + 1 a multiple of
    the interval), when what can expire changes. Aged by their mtime (what delta-rs reads), the
    entries before the newest checkpoint at or below the oldest kept version go then, and every
    reader still reads the whole table. Each add returns the version it committed."""
    files = publish(store, 0, 5)
    table = LandingTable(
        delta_log.table_uri(store.location), store.objects, checkpoint_interval=3, log_retention_s=3600
    )
    log_dir = Path(store.location) / delta_log.DELTA_LOG

    def commit(f: FileRange, version: int) -> None:
        table.load()
        assert table.add([f]) == version == table.version
        assert (log_dir / f"{version:020d}.json").exists()

    for v in (1, 2, 3):  # version 2 writes a checkpoint
        commit(files[v - 1], v)
    assert (log_dir / f"{2:020d}.checkpoint.parquet").exists()
    old = time.time() - 2 * 3600
    for entry in log_dir.iterdir():
        os.utime(entry, (old, old))
    commit(files[3], 4)  # no checkpoint: no cleanup (delta-rs's default would delete 0 and 1 here)
    assert (log_dir / f"{0:020d}.json").exists()
    commit(files[4], 5)  # a checkpoint: versions below checkpoint 2 (the safe one) expire
    assert not (log_dir / f"{0:020d}.json").exists()
    assert not (log_dir / f"{1:020d}.json").exists()
    assert (log_dir / f"{2:020d}.checkpoint.parquet").exists()
    assert (log_dir / f"{5:020d}.checkpoint.parquet").exists()
    assert table_offsets(store) == [("events", 0, o) for o in range(50)]


def test_two_committers_racing_add_every_file_once(store: LocalStore) -> None:
    """Two committers (two daemons) run their rounds at the same moment over the same chains, 15
    times, with new files each time: each time exactly one commit lands (the other is refused as
    stale and counted, or finds nothing missing), at least one refusal happened (15 of 15 when
    measured), the table was created once though both created it, and the readers read every
    record once."""
    a, b = committer(store, "a"), committer(store, "b")
    landed = 0
    for i in range(15):
        for p in range(PARTITIONS):
            publish(store, p, 2)
        landed += 2 * 10
        gate = threading.Barrier(2)
        before = a.stats.commits + b.stats.commits

        def run(c: TableCommitter, gate: threading.Barrier) -> None:
            gate.wait(10)
            c.round(all_tps())

        threads = [threading.Thread(target=run, args=(c, gate)) for c in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert a.error is None and b.error is None
        assert a.stats.commits + b.stats.commits == before + 1, f"iteration {i}"
    got = table_offsets(store)
    assert got == sorted(("events", p, o) for p in range(PARTITIONS) for o in range(landed))
    # both created the table in the first race: one creation only (delta-rs retried the loser's
    # as version 1, a second table id, until creation stopped retrying)
    log = Path(store.location) / "_delta_log"
    created = [p.name for p in sorted(log.glob("*.json")) if '"metaData"' in p.read_text()]
    assert created == ["00000000000000000000.json"]
    # both rounds read the log before either committed, nearly every time: the refusal happened
    assert a.stats.dropped + b.stats.dropped >= 1


def test_the_cleaner_removes_a_file_from_the_table_before_deleting_it(store: LocalStore) -> None:
    """A query committed the first 4 of partition 0's 6 files; the table holds only the first 3:
    the cleaner removes those 3 from the table (remove, dataChange=false) and deletes them, and
    keeps the 4th (the table does not hold it yet) and the rest. Every reader then reads files
    4-6's records, and the table never listed a deleted file."""
    files = publish(store, 0, 6)
    c = committer(store, "a")
    c.table.load()
    c.table.add(files[:3])
    lifecycle.register(store, "q")
    lifecycle.record_committed(store, "q", {"events/0": 4}, batch=0)
    cleaner = lifecycle.Cleaner(store)  # finds the table by its log
    result = cleaner.clean()
    assert result.deleted == 3 and cleaner.removed_from_table == 3
    root = Path(store.location)
    assert [(root / f.path).exists() for f in files] == [False] * 3 + [True] * 3
    log = root / "_delta_log"
    removes = [
        line for p in sorted(log.glob("*.json")) for line in p.read_text().splitlines() if '"remove"' in line
    ]
    assert len(removes) == 3 and all('"dataChange":false' in r for r in removes)
    assert table_offsets(store) == []  # 1-3 removed, 4-6 not committed yet
    c.round({("events", 0)})
    assert table_offsets(store) == [("events", 0, o) for o in range(30, 60)]
    assert cleaner.clean().deleted == 1  # the 4th, now in the table; the newest two stay
    assert table_offsets(store) == [("events", 0, o) for o in range(40, 60)]


def test_a_table_switched_on_over_a_thinned_landing_skips_deleted_files(store: LocalStore) -> None:
    """Files the cleaner deleted before the table existed are not added (a dangling path would
    break every reader): counted as gone; the rest are committed."""
    files = publish(store, 0, 4)
    root = Path(store.location)
    (root / files[0].path).unlink()  # what a clean without a table did
    c = committer(store, "a")
    res = c.round({("events", 0)})
    assert res.error is None and res.files == 3 and c.stats.gone == 1
    assert table_offsets(store) == [("events", 0, o) for o in range(10, 40)]


def test_a_broken_chain_is_left_out_and_the_others_are_committed(store: LocalStore) -> None:
    """Partition 1's chain is broken (its first claim deleted) while partition 0's is whole: a
    round commits partition 0's files and none of partition 1's, without an error; once the claim
    is back, the next round commits partition 1's too, each record once (the reader's view of a
    broken chain did not move)."""
    from mqd.landing.claim_chain import PartitionChain

    publish(store, 0, 3)
    publish(store, 1, 2)
    chain = PartitionChain(store.objects, "events", 1)
    key = chain.claim_key(0)
    kept = store.objects.get(key)
    assert kept is not None
    store.objects.delete(key)
    c = committer(store, "a")
    res = c.round(all_tps())
    assert res.error is None and res.files == 3
    assert table_offsets(store) == [("events", 0, o) for o in range(30)]
    store.objects.put(key, kept[0], if_absent=True)
    res = c.round({("events", 1)})
    assert res.error is None and res.files == 2
    assert table_offsets(store) == [("events", 0, o) for o in range(30)] + [
        ("events", 1, o) for o in range(20)
    ]
