"""The publisher: one partition's drained records published as a series of files through a store.

Blocking code: it runs on the sink's worker threads (or in tools), never on the event loop. It
knows nothing of where files land: it cuts the records into files (one per run of records of one
log incarnation in one hour of event time, at most ``max_records`` each) and publishes each
through the store's two steps (store.py): ``open_stage`` (written a row group at a time) without
a lock, then ``commit`` conditional on the previous end. The sink publishes through ``stream``;
``publish`` (one table as one file) is for tools that land prepared records (the benchmark).

A full file is closed (its footer, the fsync that makes it durable, the commit) on the publisher's
``closer`` threads while the stream writes the next file's row groups: the close mostly waits for
the disk, and a partition's files are written one after another, so without this a hot partition's
landing stood still for every fsync (decision 075). At most one close per call is in flight,
collected before the next close is sent and before the call's outcome is given (``stream``, or
``begin`` then ``StreamCall.end``, which lets the sink wait for the last close without holding a
worker), so a partition's commits stay in order and an outcome is whole.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqd.landing import layout
from mqd.landing.errors import LandingCorrupt, LandingError, PublishConflict
from mqd.landing.layout import FileRange
from mqd.landing.stage_writer import ParquetStage
from mqd.landing.store import LandingStore
from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
else:
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")


@dataclass(slots=True)
class OpenFile:
    """A partition's file being staged across publications: row groups are written into it as the
    sink's buffers fill, and it is committed once it reaches ``max_records``/``max_bytes``, its
    hour or log incarnation ends, or the sink finishes it (``max_age``, the end of a burst)."""

    writer: ParquetStage
    topic: str
    partition: int
    path: str
    hour: int
    incarnation: str | None
    first_offset: int
    since: float  # monotonic time its first record was fetched (the age cut counts from it)
    records: int = 0
    nbytes: int = 0  # in-memory bytes of the records written (what max_bytes counts)
    last_offset: int = -1
    ts_min: int = 0
    ts_max: int = 0
    started: tuple[int, int] | None = None  # (run, row) in the current call where it began; None: earlier
    leader_epoch: int | None = None  # the source's leader epoch of its newest record (FileRange.leader_epoch)

    def note(self, records: pa.Table, nbytes: int) -> None:
        """``records`` were written into the file; ``nbytes``: their in-memory bytes, as the caller
        counted them (pyarrow's ``nbytes`` walks every chunk again)."""
        _first, last, count, ts_min, ts_max = layout.describe(self.topic, self.partition, records)
        self.ts_min = ts_min if not self.records else min(self.ts_min, ts_min)
        self.ts_max = ts_max if not self.records else max(self.ts_max, ts_max)
        self.records += count
        self.nbytes += nbytes
        self.last_offset = last

    def range(self) -> FileRange:
        return FileRange(
            self.path,
            self.topic,
            self.partition,
            self.first_offset,
            self.last_offset,
            self.records,
            self.ts_min,
            self.ts_max,
            incarnation=self.incarnation,
            leader_epoch=self.leader_epoch,
        )


@dataclass(slots=True)
class PublishOutcome:
    """What ``stream`` did with one partition's records."""

    published: list[FileRange] = field(default_factory=list)
    remaining: list[pa.RecordBatch] = field(default_factory=list)  # not published (error)
    remaining_incarnations: list[str | None] = field(default_factory=list)  # one per remaining batch
    conflict: PublishConflict | None = None
    error: LandingError | LandingCorrupt | None = None
    open: OpenFile | None = None  # the file still being staged (stream without finish)
    # an error lost an open file that held records of earlier calls (no longer in memory): the
    # partition must be fetched again from (offset, incarnation); nothing after it is remaining
    refetch: tuple[int, str | None] | None = None

    @property
    def last_offset(self) -> int | None:
        return self.published[-1].last_offset if self.published else None


def file_range(
    topic: str,
    partition: int,
    records: pa.Table,
    incarnation: str | None = None,
    leader_epoch: int | None = None,
) -> FileRange:
    """The range (and final name) of a file of ``records`` (RECORD_SCHEMA, one hour, ascending)
    of the log incarnation ``incarnation`` (``leader_epoch``: FileRange.leader_epoch)."""
    first, last, count, ts_min, ts_max = layout.describe(topic, partition, records)
    hour = int(layout.folder_hours(np.array([ts_min], dtype=np.int64))[0])
    path = f"{layout.hour_dir(topic, hour)}/{layout.file_name(partition, first, incarnation)}"
    return FileRange(
        path,
        topic,
        partition,
        first,
        last,
        count,
        ts_min,
        ts_max,
        incarnation=incarnation,
        leader_epoch=leader_epoch,
    )


def incarnation_runs(incarnations: list[str | None]) -> list[tuple[str | None, int, int]]:
    """Runs of consecutive batches of one incarnation: ``[(incarnation, start, stop), ...]``."""
    runs: list[tuple[str | None, int, int]] = []
    start = 0
    for i in range(1, len(incarnations) + 1):
        if i == len(incarnations) or incarnations[i] != incarnations[start]:
            runs.append((incarnations[start], start, i))
            start = i
    return runs


def finish_and_commit(
    store: LandingStore,
    writer: ParquetStage,
    rng: FileRange,
    expected_last: int | None,
    expected_incarnation: str | None,
) -> FileRange:
    """Close a written stage as ``rng`` (footer, durable) and commit it after ``expected_last``:
    the second half of every publication. On a failure nothing of it is left staged."""
    try:
        staged = writer.finish(rng)
    except BaseException:
        writer.abort()
        raise
    try:
        return store.commit(staged, expected_last, expected_incarnation)
    finally:
        store.discard(staged)  # committed: already gone from the staging name


class Publisher:
    """Publishes partitions' records into one store. Thread-compatible: the store's commit
    serialises publishers of one partition. ``closer``: where full files are closed while the
    next is written (None: on the calling thread, one after the other)."""

    def __init__(
        self, store: LandingStore, *, compression: str = "snappy", closer: Executor | None = None
    ) -> None:
        self.store = store
        self.compression = compression
        self.closer = closer

    def publish(
        self,
        topic: str,
        partition: int,
        records: pa.Table,
        expected_last: int | None,
        *,
        incarnation: str | None = None,
        expected_incarnation: str | None = None,
        leader_epoch: int | None = None,
    ) -> FileRange:
        """Publish ``records`` (RECORD_SCHEMA, one hour, ascending offsets, of the log incarnation
        ``incarnation``) as one file.

        Raises PublishConflict when the partition's last published (incarnation, offset) is not
        (``expected_incarnation``, ``expected_last``) (None: the publisher expects nothing
        published yet), LandingError when the store cannot be written.
        """
        rng = file_range(topic, partition, records, incarnation, leader_epoch)
        writer = self.store.open_stage(rng, self.compression)
        try:
            writer.write(layout.landing_table(topic, partition, records, incarnation))
        except BaseException:
            writer.abort()
            raise
        return finish_and_commit(self.store, writer, rng, expected_last, expected_incarnation)

    def begin(
        self,
        topic: str,
        partition: int,
        batches: list[pa.RecordBatch],
        expected_last: int | None,
        max_records: int | None = None,
        max_bytes: int | None = None,
        *,
        incarnations: list[str | None] | None = None,
        expected_incarnation: str | None = None,
        leader_epochs: Mapping[str | None, int] | None = None,
        open_file: OpenFile | None = None,
        finish: bool = True,
        since: float = 0.0,
    ) -> StreamCall:
        """Write drained batches of one partition into its open file (``open_file``, or a new one
        opened at ``since``) a row group at a time, committing each file that is complete: at
        ``max_records`` records or ``max_bytes`` bytes, at the end of an hour or a log incarnation
        run, and the last one when ``finish``. Without ``finish`` the last file stays open
        (``outcome.open``) for the next call. ``incarnations``: one per batch (default all None);
        ``leader_epochs``: per incarnation, the source's leader epoch of its newest record
        (MicroBatch.leader_epochs), stamped on each of its files.

        Never raises for conflicts or disk errors: the outcome says what was published and what is
        left, so the caller keeps the rest buffered (disk) or drops it (conflict). On an error the open
        file is aborted: records of this call that it held are ``remaining``; if it also held
        records of earlier calls, which are no longer in memory, ``refetch`` says where the
        partition must be fetched again (and nothing is remaining).

        Returns the call once its records are written: the last full file's close may still be in
        flight (``StreamCall.closing_done``); ``StreamCall.end`` waits for it and gives the outcome.
        """
        incs: list[str | None] = list(incarnations) if incarnations is not None else [None] * len(batches)
        if len(incs) != len(batches):
            raise ValueError(f"{len(batches)} batches but {len(incs)} incarnations")
        if open_file is not None:
            open_file.started = None
        call = StreamCall(
            self.store,
            self.closer,
            self.compression,
            topic,
            partition,
            batches,
            incs,
            incarnation_runs(incs),
            max_records or (1 << 62),
            max_bytes or (1 << 62),
            leader_epochs,
            since,
            expected_last,
            expected_incarnation,
            open_file,
        )
        call.write(finish)
        return call

    def stream(
        self,
        topic: str,
        partition: int,
        batches: list[pa.RecordBatch],
        expected_last: int | None,
        max_records: int | None = None,
        max_bytes: int | None = None,
        *,
        incarnations: list[str | None] | None = None,
        expected_incarnation: str | None = None,
        leader_epochs: Mapping[str | None, int] | None = None,
        open_file: OpenFile | None = None,
        finish: bool = True,
        since: float = 0.0,
    ) -> PublishOutcome:
        """``begin``, then its outcome once the last close landed (see ``begin``)."""
        call = self.begin(
            topic,
            partition,
            batches,
            expected_last,
            max_records,
            max_bytes,
            incarnations=incarnations,
            expected_incarnation=expected_incarnation,
            leader_epochs=leader_epochs,
            open_file=open_file,
            finish=finish,
            since=since,
        )
        return call.end()


@dataclass(slots=True)
class StreamCall:
    """One ``Publisher.begin`` call: its batches cut into files a piece at a time, each complete
    file committed after the previous end, and on a failure what was not published."""

    store: LandingStore
    closer: Executor | None
    compression: str
    topic: str
    partition: int
    batches: list[pa.RecordBatch]
    incs: list[str | None]  # one per batch
    runs: list[tuple[str | None, int, int]]  # incarnation_runs(incs)
    cap_records: int
    cap_bytes: int
    leader_epochs: Mapping[str | None, int] | None
    since: float
    expected_last: int | None  # the end the next commit expects
    expected_incarnation: str | None
    f: OpenFile | None  # the file being staged
    out: PublishOutcome = field(default_factory=PublishOutcome)
    tables: list[pa.Table] = field(default_factory=list)  # one per run taken so far
    at: tuple[int, int] = (0, 0)  # (run, row) of the first record not yet in a file
    closing: tuple[OpenFile, Future[FileRange]] | None = None  # the full file being closed
    failed: OpenFile | None = None  # a file whose close failed: nothing from its first record landed
    error: BaseException | None = None  # what stopped ``write``

    def write(self, finish: bool) -> None:
        """Write every run, close the last file when ``finish``; an exception is kept for ``end``
        (the close in flight decides first)."""
        try:
            for run_no, (inc, lo, hi) in enumerate(self.runs):
                self.write_run(run_no, inc, lo, hi)
            if finish and self.f is not None:
                self.close(self.f)
        except BaseException as exc:
            self.error = exc

    @property
    def closing_done(self) -> Future[FileRange] | None:
        """The close still in flight (None: none)."""
        return None if self.closing is None else self.closing[1]

    @property
    def quick_end(self) -> bool:
        """``end`` neither waits nor touches the store: nothing failed, no close in flight."""
        done = self.closing_done
        return self.error is None and (done is None or (done.done() and done.exception() is None))

    def end(self) -> PublishOutcome:
        """Wait for the close in flight and give the outcome: a conflict or a store error ends the
        call with an outcome, anything else aborts the open file and raises. The close in flight
        holds earlier records, so its failure is the one the outcome reports."""
        error = self.error
        try:
            self.collect()
        except BaseException as exc:
            if error is None or isinstance(error, (PublishConflict, LandingError, LandingCorrupt)):
                error = exc
        if error is None:
            self.out.open = self.f
            return self.out
        if isinstance(error, PublishConflict):
            self.abort_open()
            self.out.conflict = error
            return self.out
        if isinstance(error, (LandingError, LandingCorrupt)):
            return self.keep_unpublished(error)
        self.abort_open()
        raise error

    def abort_open(self) -> None:
        if self.f is not None:
            self.f.writer.abort()

    def write_run(self, run_no: int, inc: str | None, lo: int, hi: int) -> None:
        """Write the batches ``lo:hi`` (one incarnation) a piece at a time: each piece stays in one
        hour and fits the open file, which is committed once it is full."""
        table = layout.concat(self.batches[lo:hi])
        self.tables.append(table)
        # to cut a file near max_bytes; pieces are counted by it (one walk of the chunks)
        row_bytes = table.nbytes / max(1, table.num_rows)
        for hour, start, length in layout.hour_runs(table):
            pos, end = start, start + length
            while pos < end:
                self.at = (run_no, pos)
                f = self.file_for(run_no, pos, table, inc, hour)
                pos += self.write_piece(f, table, inc, pos, end, row_bytes)
                if f.records >= self.cap_records or f.nbytes >= self.cap_bytes:
                    self.at = (run_no, pos)
                    self.close(f)

    def file_for(self, run_no: int, pos: int, table: pa.Table, inc: str | None, hour: int) -> OpenFile:
        """The open file for the record at ``pos``: the one being staged if it has its hour and
        incarnation, else that one committed and a new one opened at this record."""
        if self.f is not None and (self.f.incarnation != inc or self.f.hour != hour):
            self.close(self.f)
        if self.f is None:
            rng = file_range(self.topic, self.partition, table.slice(pos, 1), inc)
            writer = self.store.open_stage(rng, self.compression)
            f = OpenFile(
                writer, self.topic, self.partition, rng.path, hour, inc, rng.first_offset, self.since
            )
            f.started = (run_no, pos)
            self.f = f
        return self.f

    def write_piece(
        self, f: OpenFile, table: pa.Table, inc: str | None, pos: int, end: int, row_bytes: float
    ) -> int:
        """Write into ``f`` the records from ``pos`` (before ``end``) that fit its room as a row
        group, stamped with the incarnation's leader epoch; returns how many."""
        epoch = (self.leader_epochs or {}).get(inc)
        if epoch is not None:
            f.leader_epoch = epoch
        room = math.ceil((self.cap_bytes - f.nbytes) / row_bytes) if row_bytes else end
        n = min(self.cap_records - f.records, end - pos, max(1, room))
        piece = table.slice(pos, n)
        f.writer.write(layout.landing_table(self.topic, self.partition, piece, inc))
        f.note(piece, round(row_bytes * n))
        return n

    def close(self, f: OpenFile) -> None:
        """Close the full file ``f`` on the closer, after the close before it landed (its end is
        the end this commit expects); the caller goes on with the next file meanwhile."""
        self.collect()
        self.f = None
        job = (self.store, f.writer, f.range(), self.expected_last, self.expected_incarnation)
        if self.closer is not None:
            self.closing = f, self.closer.submit(finish_and_commit, *job)
            return
        done: Future[FileRange] = Future()
        try:
            done.set_result(finish_and_commit(*job))
        except BaseException as exc:
            done.set_exception(exc)
        self.closing = f, done
        self.collect()

    def collect(self) -> None:
        """Wait for the close in flight; its file is published (its end the next one expects), or
        its error is raised with the file remembered as ``failed``."""
        if self.closing is None:
            return
        f, done = self.closing
        self.closing = None
        try:
            rng = done.result()
        except BaseException:
            self.failed = f
            raise
        self.out.published.append(rng)
        self.expected_last, self.expected_incarnation = rng.last_offset, rng.incarnation

    def keep_unpublished(self, exc: LandingError | LandingCorrupt) -> PublishOutcome:
        """A store error: abort the open file; what the first unpublished file (the one whose close
        failed, else the open one) held of this call, and every record after it, is
        ``remaining``; if it also held records of earlier calls, ``refetch`` instead."""
        self.out.error = exc
        at = self.at
        self.abort_open()
        first = self.failed if self.failed is not None else self.f
        if first is not None:
            if first.started is None:
                self.out.refetch = (first.first_offset, first.incarnation)
                return self.out
            at = first.started
        run_no, row = at
        runs = self.runs
        if run_no < len(self.tables):
            rest = self.tables[run_no].slice(row).to_batches()
            later = [i for _inc, lo2, hi2 in runs[run_no + 1 :] for i in range(lo2, hi2)]
        else:  # failed before the run's table was built: nothing of it was taken
            rest, later = [], [i for _inc, lo2, hi2 in runs[run_no:] for i in range(lo2, hi2)]
        self.out.remaining = rest + [self.batches[i] for i in later]
        self.out.remaining_incarnations = [runs[run_no][0]] * len(rest) + [self.incs[i] for i in later]
        return self.out
