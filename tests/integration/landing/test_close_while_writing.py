"""A partition's full file is closed (footer, fsync, commit) on the publisher's closer while its next
file is written (decision 075): the next file's row groups reach the disk before the first file's
commit returns; the files still land in order; and when the close in flight fails, the outcome is
the one of a failure of that file: nothing after it lands, the next file leaves nothing staged. In
the sink, a publication whose last close is landing holds its partition but not a worker slot."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support.streamed_files import records

from mqd.config import LandingConfig
from mqd.consumer import TopicPartition
from mqd.daemon_threads import DaemonThreadExecutor
from mqd.landing import layout
from mqd.landing.errors import LandingError, PublishConflict
from mqd.landing.local_objects import SCRATCH_DIR
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import Publisher, PublishOutcome
from mqd.landing.sink import LandingSink, PublishResult
from mqd.landing.stage_writer import StagedFile
from mqd.waiting import wait_until, wait_until_sync


class HeldCommits:
    """The store's commit, held until the test lets it go; then it lands or raises ``fail``."""

    def __init__(
        self, store: LocalStore, fail: Exception | None = None, partition: int | None = None
    ) -> None:
        self.store = store
        self.real = store.commit
        self.fail = fail
        self.partition = partition  # None: every partition's commits
        self.entered = threading.Event()
        self.release = threading.Event()
        store.commit = self.commit  # type: ignore[method-assign]

    def commit(
        self, staged: StagedFile, expected_last: int | None, expected_incarnation: str | None = None
    ) -> layout.FileRange:
        if self.partition is not None and staged.range.partition != self.partition:
            return self.real(staged, expected_last, expected_incarnation)
        self.entered.set()
        assert self.release.wait(30), "the test never released the commit"
        if self.fail is not None:
            raise self.fail
        return self.real(staged, expected_last, expected_incarnation)


@pytest.fixture
def closer() -> Iterator[DaemonThreadExecutor]:
    ex = DaemonThreadExecutor(1, thread_name_prefix="test-close")
    yield ex
    ex.shutdown(wait=False)


def in_thread(call: Callable[[], PublishOutcome]) -> tuple[threading.Thread, list[PublishOutcome]]:
    out: list[PublishOutcome] = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    return t, out


def scratch_bytes(root: Path) -> int:
    folder = root / SCRATCH_DIR
    return sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0


def leftovers(root: Path) -> list[Path]:
    """Scratch and staged files: what an aborted file must not leave behind."""
    return [p for p in (root / "_staging").rglob("*.parquet") if p.is_file()]


def stream_600_past_a_held_commit(
    tmp_path: Path, closer: DaemonThreadExecutor, fail: Exception | None = None
) -> PublishOutcome:
    """600 records at max_records 300 through a publisher whose commits are held until the second
    file's row group is on disk (inline, the stream would be stuck in the first commit and this
    times out); then released, to land or to raise ``fail``."""
    store = LocalStore(tmp_path)
    store.open()
    held = HeldCommits(store, fail=fail)
    pub = Publisher(store, closer=closer)
    t, out = in_thread(lambda: pub.stream("t", 0, records(0, 600).to_batches(), None, 300, finish=True))
    assert held.entered.wait(10)
    wait_until_sync(lambda: scratch_bytes(tmp_path) > 4, 10, "the second file's row group on disk")
    held.release.set()
    t.join(30)
    [outcome] = out
    return outcome


def test_the_next_file_is_written_while_the_full_one_commits(
    tmp_path: Path, closer: DaemonThreadExecutor
) -> None:
    """600 records with max_records 300: while the first file's commit is held, the second file's
    row group is written to its scratch file (inline, the stream would be stuck in that commit).
    Released, both files land in offset order."""
    outcome = stream_600_past_a_held_commit(tmp_path, closer)
    assert outcome.error is None and outcome.conflict is None
    assert [(r.first_offset, r.last_offset) for r in outcome.published] == [(0, 299), (300, 599)]
    offsets = [
        o for r in outcome.published for o in pq.read_table(tmp_path / r.path).column("offset").to_pylist()
    ]
    assert offsets == list(range(600))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fail", ["conflict", "error"])
def test_a_failed_close_in_flight_stops_the_files_after_it(
    tmp_path: Path, closer: DaemonThreadExecutor, fail: str
) -> None:
    """The first file's commit fails after the second file was written: nothing is published; a
    conflict is reported as such, a disk error hands back every record from the failed file's
    first (it began in this call); the second file is aborted, nothing is left staged."""
    exc: Exception = (
        PublishConflict("t", 0, None, 41) if fail == "conflict" else LandingError("disk on fire", errno=5)
    )
    outcome = stream_600_past_a_held_commit(tmp_path, closer, exc)
    assert outcome.published == []
    if fail == "conflict":
        assert outcome.conflict is exc and outcome.remaining == []
    else:
        assert outcome.error is exc and outcome.refetch is None
        remaining = [o for b in outcome.remaining for o in b.column("offset").to_pylist()]
        assert remaining == list(range(600))
    assert leftovers(tmp_path) == [] and scratch_bytes(tmp_path) == 0


def test_a_failed_close_of_a_file_begun_earlier_asks_for_a_refetch(
    tmp_path: Path, closer: DaemonThreadExecutor
) -> None:
    """The file being closed holds records of an earlier call (no longer in memory): its failure
    makes the outcome name its first offset to fetch again, with nothing remaining, even though
    the next file had taken this call's later records."""
    store = LocalStore(tmp_path)
    store.open()
    pub = Publisher(store, closer=closer)
    first = pub.stream("t", 0, records(0, 200).to_batches(), None, 300, finish=False)
    assert first.open is not None and first.published == []
    held = HeldCommits(store, fail=LandingError("disk on fire", errno=5))
    t, out = in_thread(
        lambda: pub.stream(
            "t", 0, records(200, 300).to_batches(), None, 300, open_file=first.open, finish=True
        )
    )
    assert held.entered.wait(10)
    held.release.set()
    t.join(30)
    [outcome] = out
    assert outcome.error is not None and outcome.refetch == (0, None)
    assert outcome.published == [] and outcome.remaining == []
    assert leftovers(tmp_path) == []


P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Drained:
    """A drained batch as the sink takes it (micro_batches.Drained)."""

    def __init__(self, partition: int, first: int, count: int) -> None:
        self.tp = ("t", partition)
        self.records = records(first, count).to_batches()[0]
        self.first_offset = first
        self.next_offset = first + count
        self.nbytes = self.records.nbytes
        self.fetched_at = 0.0
        self.incarnation: str | None = None


async def p0_closing_in_a_one_slot_sink(
    tmp_path: Path, fail: Exception | None = None
) -> tuple[LandingSink, HeldCommits, asyncio.Task[PublishResult | None]]:
    """A sink with one worker slot whose partition 0 publishes 100 records, its last close held in
    the commit (then landing, or raising ``fail``); partition 1's head is read too."""
    sink = LandingSink(LandingConfig(dir=tmp_path / "landing"), workers=1)
    await sink.start()
    held = HeldCommits(sink.store, fail=fail, partition=0)  # type: ignore[arg-type]
    for tp in (P0, P1):
        await sink.resume_head(tp)
    sink.add(Drained(0, 0, 100))
    first = asyncio.create_task(sink.publish_partition(P0))
    await wait_until(held.entered.is_set, 10, "partition 0's commit")
    return sink, held, first


async def test_a_publication_landing_its_last_close_lets_another_encode(tmp_path: Path) -> None:
    """One worker slot; partition 0's last close is held in its commit. Partition 1's publication
    takes the slot and lands meanwhile (before: it waited for partition 0's commit), while
    partition 0 stays busy, so its next publication still comes after this one."""
    sink, held, first = await p0_closing_in_a_one_slot_sink(tmp_path)
    sink.add(Drained(1, 0, 50))
    other = await asyncio.wait_for(sink.publish_partition(P1), 10)
    assert other is not None and [(r.first_offset, r.last_offset) for r in other.published] == [(0, 49)]
    assert sink.busy(P0) and not first.done()
    held.release.set()
    res = await asyncio.wait_for(first, 10)
    assert res is not None and [(r.first_offset, r.last_offset) for r in res.published] == [(0, 99)]
    assert not sink.busy(P0) and sink.expected(P0) == 99
    await sink.close()


async def test_a_failed_last_close_is_reported_once_not_as_an_unretrieved_future(tmp_path: Path) -> None:
    """Partition 0's last close loses a conflict while the sink waits for it: the result is the
    conflict, and the loop reports no future whose exception nobody read (it did once, 8 times in
    one S3 chaos run, for every such conflict)."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    sink, held, first = await p0_closing_in_a_one_slot_sink(tmp_path, PublishConflict("t", 0, None, 41))
    sink.add(Drained(1, 0, 10))  # its publication needs the one slot: partition 0's waits for the close
    assert await asyncio.wait_for(sink.publish_partition(P1), 10) is not None
    held.release.set()
    res = await asyncio.wait_for(first, 10)
    assert res is not None and res.conflict is not None and res.published == []
    await sink.close()
    # the conflict (held) refers to the close's future, which refers to the loop's copy
    del first, res, held, sink
    gc.collect()
    assert [c.get("message") for c in reported] == []
