"""The log incarnation of mqd/broker/storage.py on real files, and on the wire of a real broker.

Proves (issue 12): a fresh log, a recreated partition folder, a recovery cut and a truncation each
begin a new incarnation at the right base; a restart keeps the incarnation; a log written before
incarnations gets one entry at its log start; a slave-style truncation adopts the given history;
a fetch naming an earlier incarnation gets INCARNATION_CHANGED with the divergence point, and a
malformed incarnation is a 400; an unknown id with a lineage naming a known one diverged where
that one stops, and a malformed lineage is a 400 naming the entry.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support.harness import Cluster
from support.storage_node import StorageNode

from mqd.broker.incarnation import HISTORY_FILE
from mqd.broker.storage import PartitionLog
from mqd.config import StorageConfig
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.incarnation import IncarnationEntry, is_valid_id, new_id

TOPIC = "events"


def _batch(count: int, tag: int = 0) -> bytes:
    return fmt.encode_batch([bytes([tag % 256]) * 50 for _ in range(count)])


def _append(plog: PartitionLog, count: int = 2, tag: int = 0) -> tuple[int, int]:
    batch = _batch(count, tag)
    return plog.append(batch, fmt.validate(batch))


def test_fresh_log_and_restart(storage_node: StorageNode) -> None:
    """A log created empty has one incarnation at base 0; a restart keeps it, with its records."""
    plog = storage_node.open()
    assert is_valid_id(plog.incarnation) and [e.base for e in plog.history] == [0]
    first = plog.incarnation
    for i in range(30):
        _append(plog, tag=i)
    plog = storage_node.open()
    assert plog.incarnation == first and len(plog.history) == 1 and plog.max_offset == 60


def test_recreated_folder_is_a_new_incarnation(storage_node: StorageNode) -> None:
    """A partition folder removed and recreated (a topic recreated, a disk replaced) gets a new
    incarnation at 0: its offsets name other records than before."""
    plog = storage_node.open()
    _append(plog)
    before = plog.incarnation
    storage_node.close()
    shutil.rmtree(storage_node.folder)
    plog = storage_node.open()
    assert plog.incarnation != before and [e.base for e in plog.history] == [0]
    assert plog.diverged_at(before) == 0


def test_log_files_gone_under_a_history_is_a_new_incarnation(storage_node: StorageNode) -> None:
    """Segment files deleted while the history file stays: a new incarnation at 0, the old one
    diverged at 0."""
    plog = storage_node.open()
    _append(plog)
    before = plog.incarnation
    storage_node.close()
    for p in storage_node.folder.glob("*.log"):
        p.unlink()
    plog = storage_node.open()
    assert plog.incarnation != before and plog.max_offset == 0
    assert plog.diverged_at(before) == 0


def test_recovery_cut_begins_a_new_incarnation_at_the_cut(storage_node: StorageNode) -> None:
    """A torn tail of the active segment is cut on open and that cut is a new incarnation whose
    base is the cut offset; the earlier one diverged exactly there."""
    plog = storage_node.open()
    for i in range(5):
        _append(plog, count=3, tag=i)
    assert plog.segment_count == 1
    before = plog.incarnation
    storage_node.close()
    active = sorted(storage_node.folder.glob("*.log"))[-1]
    size = active.stat().st_size
    with open(active, "r+b") as fh:  # flip a byte of the last batch
        fh.seek(size - 9)
        b = fh.read(1)
        fh.seek(size - 9)
        fh.write(bytes([b[0] ^ 0xFF]))
    plog = storage_node.open()
    assert plog.max_offset == 12
    assert plog.incarnation != before
    assert [(e.id, e.base) for e in plog.history] == [(before, 0), (plog.incarnation, 12)]
    assert plog.diverged_at(before) == 12
    # and the next restart keeps the new one
    after = plog.incarnation
    assert storage_node.open().incarnation == after


def test_truncations_begin_new_incarnations_or_adopt(storage_node: StorageNode) -> None:
    """truncate_to and truncate_fully_and_start_at begin an incarnation at the new log end; with a
    master's history they adopt it instead; a truncation that cuts nothing changes nothing."""
    plog = storage_node.open()
    for i in range(10):
        _append(plog, count=2, tag=i)
    a = plog.incarnation
    plog.truncate_to(100)
    assert plog.incarnation == a
    plog.truncate_to(13)  # inside batch 12..13: the log end becomes 12
    assert plog.max_offset == 12 and plog.history[-1].base == 12 and plog.diverged_at(a) == 12
    master = [IncarnationEntry(new_id(), 0), IncarnationEntry(new_id(), 8)]
    plog.truncate_to(8, master)
    assert plog.history == master and plog.max_offset == 8
    plog.truncate_fully_and_start_at(500)
    assert plog.history[-1].base == 500 and plog.min_offset == 500
    plog.adopt_history(master)
    assert plog.incarnation == master[-1].id
    restarted = storage_node.open()
    assert restarted.history == master


def test_log_written_before_incarnations_gets_one_at_its_start(storage_node: StorageNode) -> None:
    """An existing log without a history file (written before this change) keeps every offset
    valid under one incarnation whose base is the log start."""
    plog = storage_node.open()
    for i in range(40):
        _append(plog, count=2, tag=i)
    plog.truncate_fully_and_start_at(1000)  # so that the log start is not 0
    for i in range(3):
        _append(plog, tag=i)
    storage_node.close()
    (storage_node.folder / HISTORY_FILE).unlink()
    plog = storage_node.open()
    assert [e.base for e in plog.history] == [1000] and plog.max_offset == 1006


# -- on the wire --------------------------------------------------------------------------------


async def test_fetch_names_an_old_incarnation(
    cluster_factory: Callable[..., Cluster], client: BrokerClient
) -> None:
    """Every fetch answer carries the incarnation; a fetch naming the current one is served; one
    naming an earlier incarnation (after the node's torn tail was cut) gets INCARNATION_CHANGED with
    diverged_at = the cut and no records; an unknown id diverged at 0; a malformed id is a 400."""
    cluster = cluster_factory(topics={TOPIC: 1})
    node_id = cluster.master(0)
    url = cluster.url(node_id)
    for i in range(4):
        await client.produce(url, TOPIC, 0, _batch(5, i))
    answer = await client.fetch(url, [{"topic": TOPIC, "partition": 0, "offset": 0}], max_wait_ms=0)
    first = answer.partitions[0].incarnation
    assert first is not None and is_valid_id(first) and answer.partitions[0].status == "FOUND"

    cluster.stop_node(node_id)
    folder = cluster.nodes[node_id].data_dir / "logs" / f"{TOPIC}-0"
    active = sorted(folder.glob("*.log"))[-1]
    size = active.stat().st_size
    with open(active, "r+b") as fh:  # tear the last batch (offsets 15..19)
        fh.truncate(size - 16)
    cluster.start_node(node_id)
    # a new client: the fixture's pooled connection went with the old process
    fresh = BrokerClient(request_timeout=10.0)
    await fresh.start()
    try:
        await _fetch_after_cut(fresh, url, first)
    finally:
        await fresh.close()


async def _fetch_after_cut(client: BrokerClient, url: str, first: str) -> None:

    def fetch_at(offset: int, incarnation: str | None) -> dict[str, object]:
        return {"topic": TOPIC, "partition": 0, "offset": offset, "incarnation": incarnation}

    answer = await client.fetch(url, [fetch_at(18, first), fetch_at(3, first)], max_wait_ms=0)
    for p in answer.partitions:
        assert p.status == "INCARNATION_CHANGED" and len(p.data) == 0, p
        assert p.incarnation not in (None, first) and p.diverged_at == 15
    assert [p.next_offset for p in answer.partitions] == [15, 3]
    current = answer.partitions[0].incarnation
    answer = await client.fetch(url, [fetch_at(3, current), fetch_at(3, "f" * 32)], max_wait_ms=0)
    same, unknown = answer.partitions
    assert same.status == "FOUND" and same.incarnation == current and len(same.data) > 0
    assert same.diverged_at is None
    assert unknown.status == "INCARNATION_CHANGED" and unknown.diverged_at == 0
    for bad in ("F" * 32, "abc", 7):
        with pytest.raises(BrokerError) as err:
            await client.fetch(url, [fetch_at(0, bad)], max_wait_ms=0)  # type: ignore[arg-type]
        assert err.value.status == 400 and "incarnation" in str(err.value), bad

    # an id this log never held, fetched after the consumer read `first` up to 12 (and then 17):
    # the log holds `first` up to the cut, so the records diverge at 12 (then at the cut, 15)
    def with_lineage(end: int, lineage: object) -> dict[str, object]:
        return {**fetch_at(end + 1, "f" * 32), "lineage": lineage}

    answer = await client.fetch(
        url,
        [with_lineage(12, [{"id": first, "end": 12}]), with_lineage(17, [{"id": first, "end": 17}])],
        max_wait_ms=0,
    )
    assert [(p.status, p.diverged_at, p.next_offset) for p in answer.partitions] == [
        ("INCARNATION_CHANGED", 12, 12),
        ("INCARNATION_CHANGED", 15, 15),
    ]
    bad_lineages: list[object] = [
        {"id": first, "end": 1},
        [{"id": "abc", "end": 1}],
        [{"id": first, "end": -1}],
        [{"id": first}],
        [{"id": first, "end": 1}] * 9,
    ]
    for lineage in bad_lineages:
        with pytest.raises(BrokerError) as err:
            await client.fetch(url, [with_lineage(3, lineage)], max_wait_ms=0)
        assert err.value.status == 400 and "lineage" in str(err.value), lineage


def test_unreadable_history_is_set_aside_and_a_new_incarnation_begins(storage_node: StorageNode) -> None:
    """A damaged incarnation.json does not stop the node: it is kept as incarnation.json.damaged and
    the log begins a new incarnation at its start (a consumer's old id then diverged at 0)."""
    plog = storage_node.open()
    for i in range(3):
        _append(plog, tag=i)
    before = plog.incarnation
    storage_node.close()
    (storage_node.folder / HISTORY_FILE).write_text("{not json")
    plog = storage_node.open()
    assert plog.incarnation != before and [e.base for e in plog.history] == [0]
    assert plog.diverged_at(before) == 0 and plog.max_offset == 6
    assert (storage_node.folder / (HISTORY_FILE + ".damaged")).read_text() == "{not json"


@pytest.mark.parametrize("fsync", ["interval", "never", "always"])
def test_unclean_restart_begins_a_new_incarnation_unless_every_append_was_synced(
    tmp_path: Path, fsync: str
) -> None:
    """After a crash (no clean-shutdown marker) a log whose appends were not each fsynced may
    have lost served records from its tail without a torn byte (a file reverted to its last synced
    size): it begins a new incarnation at its end. With fsync = always, or after a clean close,
    the incarnation stays."""
    storage_node = StorageNode(tmp_path)
    storage_node.config = StorageConfig(segment_bytes=4096, fsync=fsync)  # type: ignore[arg-type]
    try:
        plog = storage_node.open()
        _append(plog)
        first = plog.incarnation
        plog = storage_node.open()  # a clean close in between
        assert plog.incarnation == first
        storage_node.close()
        (storage_node.root / "logs" / ".clean_shutdown").unlink()  # what a crash leaves: no marker
        plog = storage_node.open()
        if fsync == "always":
            assert plog.incarnation == first
        else:
            assert plog.incarnation != first and plog.diverged_at(first) == plog.max_offset == 2
    finally:
        storage_node.close()
