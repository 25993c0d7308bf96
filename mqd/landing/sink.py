"""The landing sink: the one home of publication scheduling.

The daemon hands it drained batches (``add``); it keeps them in per-partition micro-batches
(micro_batches.py decides when one is cut) and publishes cut micro-batches through the store
(publisher.py, store.py) on a small pool of worker threads: pyarrow and fsync release the GIL, so
the event loop keeps fetching while files are encoded and written.

It owns everything about running publications:

* per-partition order: publications of one partition run one at a time, in offset order (a
  per-partition lock); those of different partitions run in parallel, at most ``workers`` encoding
  at once (the worker slots). A publication gives its slot back once its records are encoded and
  keeps its partition's lock until its last file's close (fsync, commit, on the closer threads)
  has landed (decision 075);
* *busy* partitions: from ``publish_partition()`` on (running or waiting for a worker) a partition
  is not cut again; records drained meanwhile go into its next micro-batch;
* the background tasks (``start_publications``), at most one per partition, and the progress
  signal the daemon's loop waits on (a buffer taken = room in the sink; a publication ended = a
  busy partition may be cut);
* ownership, checked once per publication with ONE counter: the partition's epoch, bumped when
  its buffered records are dropped (revoked, re-resolved on assignment, or a conflict lost). A
  publication that ends in a later epoch may not touch the partition's buffers or position: what
  it landed is still reported (it was conditional, so it is the truth, and commits only move
  forward), but ``PublishResult.owned`` is False, so the daemon does not re-seek.

Every publication ends in one typed ``PublishResult`` passed to ``on_result`` (the daemon marks
offsets consumed, re-seeks, or pauses for a disk error there).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from mqd import metrics
from mqd.config import LandingConfig
from mqd.daemon_threads import DaemonThreadExecutor
from mqd.landing import preflight
from mqd.landing.backends import open_store
from mqd.landing.errors import LandingCorrupt, LandingError, PreflightError, PublishConflict
from mqd.landing.layout import FileRange
from mqd.landing.micro_batches import TP, Drained, FileProgress, MicroBatch, MicroBatches
from mqd.landing.publisher import OpenFile, Publisher, PublishOutcome, StreamCall
from mqd.landing.store import PartitionHead
from mqd.landing.watermark import AheadOfClock
from mqd.memory_trim import trim_heap
from mqd.waiting import wait_event

log = structlog.get_logger("mqd.landing")

_T = TypeVar("_T")

# heads of newly assigned partitions are read on threads of their own, several at once, so a
# partition whose head is slow to read (a half-done commit to complete, a slow store) neither
# delays the others nor a publication's worker
_HEAD_READERS = 4
# Bytes written into files after which the sink, once idle (nothing buffered, open or being published), hands
# the C heap's free pages back (mqd/memory_trim.py). A backlog's decoded records and answers
# leave holes that glibc keeps for reuse: a daemon that landed 6 M records from Kafka kept 75-110 MiB
# above its idle RSS for good (docs/decisions/042-kafka-row-of-make-bench.md). Not while records
# flow: trimming after every publication lowered no peak and cost ~30 % more CPU.
TRIM_AFTER_BYTES = 64 * 2**20
# A close mostly waits for the disk (its fsync) and holds no worker slot: at the end of a burst every
# partition's last file closes at once, and the filesystem joins concurrent fsyncs into one journal
# commit, so closes run several per worker.
_CLOSERS_PER_WORKER = 4


@dataclass(slots=True)
class PublishResult:
    """One partition's publication: files published, then possibly a conflict or an error."""

    tp: TP
    published: list[FileRange]
    conflict: PublishConflict | None = None
    error: LandingError | LandingCorrupt | None = None  # LandingCorrupt: needs a human
    # conflict: also set (with error) when an error lost an open file's earlier records: the
    # daemon re-seeks to its first offset as after a lost conflict
    owned: bool = True  # the partition's epoch did not change while it ran

    @property
    def next_offset(self) -> int | None:
        """Commit position: after the last published offset (None when nothing was published)."""
        return self.published[-1].last_offset + 1 if self.published else None


@dataclass(slots=True)
class PublishStats:
    """Counters since start (the daemon's ``stats``, the admin endpoint's ``landing``)."""

    files: int = 0
    records: int = 0
    bytes: int = 0
    conflicts: int = 0
    dropped: int = 0  # records dropped unpublished: revoked, or following a lost conflict
    cut: int = 0  # records cut on arrival: already published or buffered (a replay of one log)


class _Slot:
    """A publication's worker slot (``LandingSink._slots``): taken before its buffer is, given back
    once its records are encoded (its last close may still be landing) or when it ends."""

    def __init__(self, slots: asyncio.Semaphore) -> None:
        self._slots = slots
        self._held = False

    async def take(self) -> None:
        await self._slots.acquire()
        self._held = True

    def give(self) -> None:
        if self._held:
            self._held = False
            self._slots.release()


async def _landed(closing: Future[Any]) -> None:
    """Until the close ``closing`` ended, however: ``StreamCall.end`` reads its outcome. The loop's
    copy of it is read as it ends (even after this wait was cancelled), else a failed close is
    logged as an exception never retrieved."""
    waiter = asyncio.wrap_future(closing)
    waiter.add_done_callback(_read)
    await asyncio.wait([waiter])


def _read(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


def _ignore(res: PublishResult) -> None:
    pass


def _nothing() -> None:
    pass


class LandingSink:
    """Buffers drained batches and schedules their publication. See the module docstring."""

    def __init__(
        self,
        config: LandingConfig,
        *,
        executor: Executor | None = None,
        workers: int = 2,
        on_result: Callable[[PublishResult], None] = _ignore,
        trim_after_bytes: int = TRIM_AFTER_BYTES,
        on_warm: Callable[[], None] = _nothing,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._config = config
        ahead_ms = round(config.max_event_ahead * 1000)
        self.store = open_store(
            config.dir,
            max_event_ahead_ms=ahead_ms,
            endpoint_url=config.s3.endpoint_url,
            region=config.s3.region,
        )
        self.ahead_of_clock = AheadOfClock(ahead_ms)  # files the watermark ignores: counted, logged
        self._readers = DaemonThreadExecutor(_HEAD_READERS, thread_name_prefix="mqd-landing-head")
        # full files are closed (fsync, commit) here while their partition's next file is written,
        # and a publication's last close lands here after it gave its worker slot back
        self._closer = DaemonThreadExecutor(
            workers * _CLOSERS_PER_WORKER, thread_name_prefix="mqd-landing-close"
        )
        self.publisher = Publisher(self.store, compression=config.compression, closer=self._closer)
        self.batches = MicroBatches(config)
        self.workers = workers
        self.on_result = on_result
        self._executor = executor or DaemonThreadExecutor(workers, thread_name_prefix="mqd-landing")
        self._own_executor = executor is None
        self._slots = asyncio.Semaphore(workers)  # publications in flight, all partitions
        self._locks: dict[TP, asyncio.Lock] = {}  # one publication at a time per partition
        self._busy: Counter[TP] = Counter()  # publications registered per partition (running or waiting)
        self._tasks: dict[TP, asyncio.Task[None]] = {}  # background publications, one per partition
        self._epoch: dict[TP, int] = {}  # the one ownership counter; see the module docstring
        # each partition's file being staged (row groups written, not committed); a running
        # publication holds it (absent here meanwhile) and puts it back when it ends owned
        self._open: dict[TP, OpenFile] = {}
        # set whenever a publication takes a buffer (room in the sink) or ends
        self._progress = asyncio.Event()
        self.failure: BaseException | None = None  # unexpected error of a background publication
        self.stats = PublishStats()
        self._closed = False
        self._cleaned = False
        self.trim_after_bytes = trim_after_bytes
        self.trim_when_idle = True  # False: the process exits after these publications (a burst's end)
        self._written_since_trim = 0  # bytes of micro-batches published since the heap was last trimmed
        self.on_warm = on_warm  # called once the first encode (preflight.py) succeeded
        self._preflight: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run blocking landing work (the store's reads and writes) on the sink's worker threads."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        """Open the store and check it is writable (LandingError otherwise); once, remove what
        crashed publishers staged."""
        await self.run_blocking(self.store.open)
        if not self._cleaned:
            self._cleaned = True
            removed = await self.run_blocking(self.store.remove_stale)
            if removed:
                log.info("removed temp files of crashed publications", count=removed)

    def start_preflight(self) -> None:
        """Run the first encode (preflight.py) in the background, once: its failure becomes the
        sink's ``failure``, its success calls ``on_warm``. The daemon calls it once its first fetch
        is out, since it imports pyarrow (issue 16)."""
        if self._preflight is None and not self._closed:
            self._preflight = asyncio.create_task(self._run_preflight(), name="mqd-landing-preflight")

    async def _run_preflight(self) -> None:
        compression = self._config.compression
        try:
            size = await self.run_blocking(preflight.encode_check, compression)
        except PreflightError as exc:
            log.error("landing cannot encode", error=str(exc))
            self.failure = exc
            return
        log.debug("landing encoder ready", compression=compression, file_bytes=size)
        self.on_warm()

    async def close(self) -> None:
        """Release the worker threads; buffered records are dropped (not published, not
        committed). A publication still running (abandoned at its deadline) completes on its
        own: it is atomic and conditional either way."""
        if self._closed:
            return
        self._closed = True
        if self._preflight is not None and not self._preflight.done():
            self._preflight.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._preflight
        for f in self._open.values():  # unpublished: forget the staged bytes (the janitor would)
            with contextlib.suppress(Exception):
                await self.run_blocking(f.writer.abort)
        self._open.clear()
        self._readers.shutdown(wait=False, cancel_futures=True)
        self._closer.shutdown(wait=False, cancel_futures=True)
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def reconfigure(self, config: LandingConfig) -> None:
        """New thresholds and compression; the directory cannot change while running."""
        if config.dir != self._config.dir:
            raise ValueError("landing.dir cannot change on reload; restart the daemon")
        if config.max_event_ahead != self._config.max_event_ahead:  # the store holds it
            raise ValueError("landing.max_event_ahead cannot change on reload; restart the daemon")
        self._config = config
        self.batches.config = config
        self.publisher.compression = config.compression

    # -- positions and ownership -----------------------------------------------------------------

    async def resume_head(self, tp: TP) -> PartitionHead:
        """A newly owned partition's published head, read on the head readers: the next offset to
        fetch is after its ``last_offset`` (None: nothing published yet, the caller falls back to
        its offset store), in its ``incarnation``, with its ``leader_epoch``. Drops old buffers."""
        loop = asyncio.get_running_loop()
        head = await loop.run_in_executor(self._readers, self.store.head, tp[0], tp[1])
        self.drop(tp)
        self.batches.set_expected(tp, head.last_offset, head.incarnation)
        return head

    def expected(self, tp: TP) -> int | None:
        return self.batches.expected(tp)

    def drop(self, tp: TP) -> int:
        """Forget the partition's unpublished records and start a new epoch: a publication in
        flight can no longer restore its records or move the partition."""
        self._epoch[tp] = self._epoch.get(tp, 0) + 1
        f = self._open.pop(tp, None)  # not busy (a running publication holds it): abort it aside
        if f is not None:
            self._executor.submit(f.writer.abort)
        dropped = self.batches.drop(tp)
        self.stats.dropped += dropped
        return dropped

    def forget(self, tp: TP) -> int:
        """Revoked: drop buffers and the cached position (re-read from the store on reassignment).
        Returns the number of records dropped."""
        self.batches.forget_expected(tp)
        return self.drop(tp)

    # -- buffering (micro_batches.py) ------------------------------------------------------------

    def add(self, batch: Drained, now: float | None = None) -> int:
        """Buffer a drained batch (micro_batches.py); records cut at the published or buffered
        floor of their log incarnation (a replay) are counted and logged, never silent."""
        kept = self.batches.add(batch, now)
        cut = batch.records.num_rows - kept
        if cut:
            topic, partition = batch.tp[0], batch.tp[1]
            self.stats.cut += cut
            metrics.records_cut.labels(topic).inc(cut)
            log.warning(
                "records already landed or buffered cut on arrival",
                topic=topic,
                partition=partition,
                incarnation=batch.incarnation,
                first_offset=batch.first_offset,
                next_offset=batch.next_offset,
                cut=cut,
                landed_last=self.batches.expected((topic, partition)),
                landed_incarnation=self.batches.expected_incarnation((topic, partition)),
            )
        return kept

    @property
    def pending_records(self) -> int:
        return self.batches.pending_records

    @property
    def pending_bytes(self) -> int:
        return self.batches.pending_bytes

    def pending(self) -> dict[TP, int]:
        return self.batches.pending()

    @property
    def inflight_bytes(self) -> int:
        """Bytes of micro-batches being published right now (taken out of the buffers)."""
        return self.batches.inflight_bytes

    @property
    def publish_lead(self) -> float:
        return self.batches.publish_lead

    def busy(self, tp: TP) -> bool:
        """A publication of ``tp`` is running or waiting for a worker."""
        return self._busy[(tp[0], tp[1])] > 0

    def due(self, now: float | None = None) -> list[TP]:
        """Partitions whose micro-batch is to be cut now (busy ones excepted)."""
        return self.batches.due(self._busy, now)

    def pressure_cut(self, need: int) -> list[TP]:
        """The biggest idle buffers holding ``need`` bytes together (memory pressure; busy ones
        excepted)."""
        return self.batches.biggest(self._busy, need)

    def next_due_in(self, now: float | None = None) -> float | None:
        """Seconds until the oldest buffer that is not busy falls due (None: no such buffer)."""
        return self.batches.next_due_in(self._busy, now)

    # -- scheduling ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Background publications are registered (running or waiting)."""
        return bool(self._tasks)

    def start_publications(self, tps: Iterable[TP], *, finish: bool | None = None) -> None:
        """Publish ``tps`` in the background, one task per partition: a partition whose task is
        still registered is skipped (its next cut waits). Results go to ``on_result``.
        ``finish``: see ``publish_partition`` (None: files are finished when due by age)."""
        for tp in tps:
            key = (tp[0], tp[1])
            if key not in self._tasks:
                # publish_partition() marks it busy right away: the next due() skips it
                self._tasks[key] = asyncio.create_task(
                    self._background(key, self.publish_partition(key, finish=finish)),
                    name=f"mqd-publish-{tp}",
                )

    async def _background(self, tp: TP, publication: Coroutine[Any, Any, PublishResult | None]) -> None:
        try:
            await publication
        except Exception as exc:
            if self.failure is None:
                self.failure = exc  # the daemon's loop raises it
        finally:
            if self._tasks.get(tp) is asyncio.current_task():
                del self._tasks[tp]
            self._progress.set()  # also when the task ended before its publication ran
            self._trim_if_idle()

    def _trim_if_idle(self) -> None:
        """After a burst (``trim_after_bytes`` written since the last time) and once nothing is
        buffered, open or being published, give the C heap's free pages back (TRIM_AFTER_BYTES)."""
        if (
            self.trim_when_idle
            and self._written_since_trim >= self.trim_after_bytes
            and not self._tasks
            and not self._busy
            and not self.batches.pending_records
        ):
            self._written_since_trim = 0
            trim_heap(passes=1)

    async def wait_idle(self) -> None:
        """Until no background publication is registered."""
        while self._tasks:
            await asyncio.wait(list(self._tasks.values()))

    async def settle(self, tps: Iterable[TP]) -> None:
        """Until no publication of ``tps`` runs or waits. After ``forget`` a waiting one takes an
        empty buffer, so once this returns nothing of ``tps`` lands from here (a revoke's release)."""
        for tp in tps:
            key = (tp[0], tp[1])
            while (lock := self._locks.get(key)) is not None:
                async with lock:
                    pass

    def cancel(self) -> None:
        """Abandon the background publications (shutdown deadline): each publication is atomic
        and conditional, so cancelling only decides whether its result is reported."""
        for task in list(self._tasks.values()):
            task.cancel()

    async def wait_for_progress(self, timeout: float, also: Awaitable[Any] | None = None) -> None:
        """Sleep until a publication takes its buffer or ends, ``also`` completes, or ``timeout``.
        The caller read the sink's state right before (no await since): clearing the signal here
        loses no wake-up."""
        self._progress.clear()
        if also is None:
            await wait_event(self._progress, timeout)
            return
        waiters = [asyncio.ensure_future(also), asyncio.ensure_future(self._progress.wait())]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def publish(self, tps: Iterable[TP] | None = None) -> list[PublishResult]:
        """Publish the buffers of ``tps`` (default: all) now and wait, partitions in parallel
        (after any publication of theirs already running). Results go to ``on_result`` and are
        returned. An unexpected exception is raised once every partition's publication ended."""
        todo = list(self.batches.pending()) if tps is None else [(tp[0], tp[1]) for tp in tps]
        outs = await asyncio.gather(*(self.publish_partition(tp) for tp in todo), return_exceptions=True)
        for out in outs:
            if isinstance(out, BaseException):
                raise out
        return [res for res in outs if isinstance(res, PublishResult)]

    def publish_partition(
        self, tp: TP, *, finish: bool | None = True
    ) -> Coroutine[Any, Any, PublishResult | None]:
        """Cut ``tp``'s micro-batch into its open file and, with ``finish``, publish the file (None
        when nothing is buffered or open); await the result. ``finish=None``: finish it only when
        it is due by age (else it stays open; the publisher commits any file that reaches
        max_records or max_bytes either way).

        The partition is busy from this call on (not from the coroutine's first step), so a caller
        that schedules the coroutine as a task does not see it due again meanwhile. The coroutine
        waits for the partition's previous publication and for a free worker; the buffer is taken
        only then, so records drained while waiting join this micro-batch."""
        tp = (tp[0], tp[1])
        self._busy[tp] += 1
        return self._publish_partition(tp, time.monotonic(), finish)

    async def _publish_partition(self, tp: TP, due_at: float, finish: bool | None) -> PublishResult | None:
        lock = self._locks.setdefault(tp, asyncio.Lock())
        try:
            async with lock:
                slot = _Slot(self._slots)
                await slot.take()
                try:
                    if finish is None:
                        finish = self.batches.age_due(tp)
                    buf = self.batches.take(tp)
                    if buf is None and (tp not in self._open or not finish):
                        return None
                    nbytes = 0 if buf is None else buf.nbytes
                    self.batches.inflight_bytes += nbytes
                    self._progress.set()
                    try:
                        res = await self._publish(tp, buf, due_at, finish, slot)
                    finally:
                        self.batches.inflight_bytes -= nbytes
                finally:
                    slot.give()
            self.on_result(res)
            return res
        finally:
            self._busy[tp] -= 1
            if not self._busy[tp]:
                del self._busy[tp]
                self._locks.pop(tp, None)  # nobody holds or waits for it
            self._progress.set()

    async def _publish(
        self, tp: TP, buf: MicroBatch | None, due_at: float, finish: bool, slot: _Slot
    ) -> PublishResult:
        """One publication of ``tp``: its taken buffer (and its open file) streamed through the
        publisher on a worker thread, then the outcome settled: the file left open kept, what
        landed counted, a lost conflict or an error handled. ``owned``: the partition was not
        dropped while it ran (only then does the outcome change its state)."""
        epoch = self._epoch.get(tp, 0)
        f = self._open.pop(tp, None)  # this publication holds the open file until it ends
        fp = self.batches.files.get(tp)
        taken = (fp.records if fp is not None else 0) + (buf.records if buf is not None else 0)
        since = f.since if f is not None else (buf.since if buf is not None else time.monotonic())
        lead = self.batches.publish_lead  # the age cut's lead when this one was cut
        t0 = time.monotonic()
        outcome = await self._stream(tp, buf, f, finish, since, epoch, slot)
        end = time.monotonic()
        owned = self._epoch.get(tp, 0) == epoch
        await self._keep_open_file(tp, outcome, owned)
        if outcome.published:
            metrics.publish_latency.observe(end - t0)
        if outcome.published and outcome.error is None and outcome.conflict is None and finish:
            # from the moment the age cut was due, not from when the loop got to it: the lead then
            # also covers a loop busy decoding when the cut fell due (and the wait for a worker)
            self.batches.observe_publish(end - min(due_at, since + self._config.max_age - lead))
        self._count_published(tp, buf, outcome, owned)
        unpublished = taken - sum(r.count for r in outcome.published)
        conflict = outcome.conflict
        if conflict is not None:
            self._lost_conflict(tp, conflict, unpublished, owned)
        elif outcome.error is not None:
            conflict = self._failed(tp, buf, outcome, since, unpublished, owned)
        return PublishResult(tp, outcome.published, conflict, outcome.error, owned)

    async def _stream(
        self,
        tp: TP,
        buf: MicroBatch | None,
        f: OpenFile | None,
        finish: bool,
        since: float,
        epoch: int,
        slot: _Slot,
    ) -> PublishOutcome:
        """``Publisher.begin`` on a worker thread, then its last close awaited without the worker
        slot (it waits for the disk: another publication may encode meanwhile), then the outcome;
        if it raises (store errors are an outcome), what it held is given up, unless the partition
        was dropped meanwhile."""
        try:
            call: StreamCall = await self.run_blocking(
                functools.partial(
                    self.publisher.begin,
                    tp[0],
                    tp[1],
                    [] if buf is None else buf.batches,
                    self.batches.expected(tp),
                    self._config.max_records,
                    self._config.max_bytes,
                    incarnations=[] if buf is None else buf.incarnations,
                    expected_incarnation=self.batches.expected_incarnation(tp),
                    leader_epochs={} if buf is None else buf.leader_epochs,
                    open_file=f,
                    finish=finish,
                    since=since,
                )
            )
            slot.give()
            closing = call.closing_done
            if closing is not None and not closing.done():
                await _landed(closing)
            outcome = call.end() if call.quick_end else await self.run_blocking(call.end)
        except BaseException:
            # unexpected (the publisher turns store errors into an outcome): it aborted the file
            if self._epoch.get(tp, 0) == epoch:
                if f is not None:
                    self.drop(tp)  # records of earlier row groups are gone with the file
                elif buf is not None:
                    self.batches.restore(tp, buf.batches, buf.since, buf.incarnations, buf.leader_epochs)
            raise
        return outcome

    async def _keep_open_file(self, tp: TP, outcome: PublishOutcome, owned: bool) -> None:
        """The file the publication left open is the partition's open file again (aborted if the
        partition was dropped meanwhile); none left open: none in progress."""
        if outcome.open is not None:
            if owned:
                self._open[tp] = outcome.open
                self.batches.files[tp] = FileProgress(
                    outcome.open.records, outcome.open.nbytes, outcome.open.since
                )
            else:  # dropped while it ran: its records belong to nobody now
                await self.run_blocking(outcome.open.writer.abort)
        elif owned:
            self.batches.files.pop(tp, None)

    def _count_published(self, tp: TP, buf: MicroBatch | None, outcome: PublishOutcome, owned: bool) -> None:
        """Stats and metrics of the files that landed; the newest is the end the next expects."""
        # the buffer's own count: RecordBatch.nbytes per batch cost 7-13 % of the loop on the hot shape
        self._written_since_trim += 0 if buf is None else buf.nbytes
        for rng in outcome.published:
            self.stats.files += 1
            self.stats.records += rng.count
            self.stats.bytes += rng.bytes
            metrics.files_published.labels(tp[0]).inc()
            metrics.records_published.labels(tp[0]).inc(rng.count)
            metrics.bytes_published.labels(tp[0]).inc(rng.bytes)
            self.ahead_of_clock.note(rng)
        if outcome.published and owned:
            last = outcome.published[-1]
            self.batches.set_expected(tp, last.last_offset, last.incarnation)

    def _lost_conflict(self, tp: TP, conflict: PublishConflict, unpublished: int, owned: bool) -> None:
        """Another publisher landed first: what was not published is dropped, and the partition
        follows the end that landed."""
        self.stats.conflicts += 1
        metrics.publish_conflicts.labels(tp[0]).inc()
        log.warning(
            "publish_conflict",
            topic=tp[0],
            partition=tp[1],
            expected=conflict.expected,
            landed=conflict.last_offset,
            landed_incarnation=conflict.incarnation,
        )
        self.stats.dropped += unpublished
        if owned:
            self.drop(tp)  # what arrived meanwhile follows the lost batch: drop it too
            self.batches.set_expected(tp, conflict.last_offset, conflict.incarnation)

    def _failed(
        self,
        tp: TP,
        buf: MicroBatch | None,
        outcome: PublishOutcome,
        since: float,
        unpublished: int,
        owned: bool,
    ) -> PublishConflict | None:
        """A store error: what was not published goes back into the buffer, or, when the open file
        held records no longer in memory, the partition is fetched again from its first offset
        (returned as the conflict that seeks there)."""
        if isinstance(outcome.error, LandingError):
            metrics.landing_errors.labels(str(outcome.error.errno or "other")).inc()
        if outcome.refetch is not None:
            # the open file held records of earlier row groups, no longer in memory: fetch
            # them again from its first offset (a seek, like a lost conflict, that lands nothing)
            first, inc = outcome.refetch
            if owned:
                self.stats.dropped += unpublished
                dropped = self.drop(tp) + unpublished
                log.warning(
                    "open landing file lost on an error; its records are fetched again",
                    topic=tp[0],
                    partition=tp[1],
                    from_offset=first,
                    incarnation=inc,
                    records=dropped,
                    error=str(outcome.error),
                )
                return PublishConflict(tp[0], tp[1], self.batches.expected(tp), first - 1, incarnation=inc)
        elif owned:
            leader_epochs = {} if buf is None else buf.leader_epochs
            self.batches.restore(tp, outcome.remaining, since, outcome.remaining_incarnations, leader_epochs)
        return None

    def status(self) -> dict[str, Any]:
        """The admin endpoint's ``landing`` section (its JSON shape is an interface)."""
        return {
            "dir": str(self._config.dir),
            "pending_records": self.pending_records,
            "pending_bytes": self.pending_bytes,
            "pending_partitions": self.batches.pending_partitions,
            "inflight_bytes": self.inflight_bytes,
            "flushing_partitions": len(self._busy),  # the JSON keeps its old key: busy partitions
            "publish_lead_s": round(self.publish_lead, 4),
            "files": self.stats.files,
            "records": self.stats.records,
            "bytes": self.stats.bytes,
            "conflicts": self.stats.conflicts,
            "dropped": self.stats.dropped,
            "cut": self.stats.cut,
        }
