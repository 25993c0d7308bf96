"""Offset stores: marks are forward-only; the local file is atomic with a backup; the broker store
commits to the group's coordinator."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mqd.consumer import ConsumerError, LocalFileOffsetStore, TopicPartition
from mqd.sources.mqd_broker import BrokerOffsetStore, GroupCoordinator, MetadataCache
from mqd.wire.client import BrokerClient

A = TopicPartition("events", 0)
B = TopicPartition("events", 1)


async def test_marks_only_move_forward_and_bad_offsets_fail(tmp_path: Path) -> None:
    """mark() keeps the highest offset; negative or non-integer offsets raise a clear error."""
    store = LocalFileOffsetStore(tmp_path / "o.json")
    store.mark(A, 10)
    store.mark(A, 5)
    assert store.marked(A) == 10
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="offsets are integers"):
            store.mark(A, bad)  # type: ignore[arg-type]


async def test_file_round_trip_and_pending(tmp_path: Path) -> None:
    """persist writes pending marks; a new store reads them back; nothing is pending afterwards."""
    path = tmp_path / "state" / "offsets.json"
    store = LocalFileOffsetStore(path)
    await store.start()
    store.mark(A, 7)
    store.mark(B, 3)
    assert await store.persist() == 2
    assert await store.persist() == 0
    assert json.loads(path.read_text())["offsets"] == {"events": {"0": 7, "1": 3}}
    again = LocalFileOffsetStore(path)
    await again.start()
    assert await again.load([A, B, TopicPartition("events", 2)]) == {A: 7, B: 3}
    assert again.committed(A) == 7


async def test_backup_keeps_previous_version_and_is_used_when_main_is_damaged(tmp_path: Path) -> None:
    """Each write moves the previous file to .bak; a torn main file falls back to the backup."""
    path = tmp_path / "offsets.json"
    store = LocalFileOffsetStore(path)
    await store.start()
    store.mark(A, 1)
    await store.persist()
    store.mark(A, 2)
    await store.persist()
    backup = tmp_path / "offsets.json.bak"
    assert json.loads(backup.read_text())["offsets"] == {"events": {"0": 1}}
    path.write_bytes(path.read_bytes()[:10])  # torn write
    again = LocalFileOffsetStore(path)
    await again.start()
    assert await again.load([A]) == {A: 1}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no temp file left


async def test_both_files_damaged_is_a_clear_error(tmp_path: Path) -> None:
    """When neither the file nor its backup parses, start() refuses instead of silently restarting
    from consume_from."""
    path = tmp_path / "offsets.json"
    path.write_text("{not json")
    (tmp_path / "offsets.json.bak").write_text('{"version": 9}')
    store = LocalFileOffsetStore(path)
    with pytest.raises(ConsumerError, match="both unreadable") as info:
        await store.start()
    assert info.value.retriable is False


async def test_unwritable_folder_raises_retriable_error(tmp_path: Path) -> None:
    """A write failure is reported as a retriable ConsumerError and the marks stay pending."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = LocalFileOffsetStore(blocker / "offsets.json")  # parent is a file: cannot mkdir
    store.mark(A, 4)
    with pytest.raises(ConsumerError) as info:
        await store.persist()
    assert info.value.retriable
    assert store.pending() == {A: 4}


async def test_forget_keeps_unpersisted_marks(tmp_path: Path) -> None:
    """forget() (after a revoke) drops persisted marks but keeps the ones still to be written."""
    store = LocalFileOffsetStore(tmp_path / "o.json")
    store.mark(A, 5)
    await store.persist()
    store.mark(B, 9)
    store.forget([A, B])
    assert store.marked(A) is None and store.marked(B) == 9


async def test_broker_store_commits_forward_only(cluster_factory: Any) -> None:
    """The broker store commits through the coordinator (found from any node, following
    not_coordinator), reads committed offsets back, and a lower commit never moves them back."""
    cluster = cluster_factory(topics={"events": 4}, groups=3)
    # bootstrap from every node: whichever answers, the coordinator is located from metadata
    async with BrokerClient(request_timeout=5) as client:
        md = MetadataCache(client, [cluster.bootstrap], refresh_interval=60)
        await md.start(timeout=5)
        try:
            coord = GroupCoordinator(
                client=client,
                metadata=md,
                group="g1",
                client_id="c1",
                topics=["events"],
                heartbeat_interval=1,
                session_timeout=10,
                on_members_changed=lambda: None,
            )
            # start from a wrong node on purpose: the 421 answer must be followed
            assert md.current is not None
            right = md.current.coordinator("g1")
            assert right is not None
            wrong = next(n for n in cluster.node_ids if n != right.id)
            coord.coordinator_url = cluster.url(wrong)
            store = BrokerOffsetStore(client, coord)
            store.mark(A, 42)
            store.mark(B, 7)
            assert await store.persist() == 2
            assert coord.coordinator_url == right.url
            fresh = BrokerOffsetStore(client, coord)
            assert await fresh.load([A, B, TopicPartition("events", 2)]) == {A: 42, B: 7}
            behind = BrokerOffsetStore(client, coord)  # knows nothing: sends the lower offset
            behind.mark(A, 40)
            assert await behind.persist() == 1
            assert await BrokerOffsetStore(client, coord).load([A]) == {A: 42}
        finally:
            await md.stop()
