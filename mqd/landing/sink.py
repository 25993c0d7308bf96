"""The landing sink: buffers drained batches per partition and cuts them into published files.

Loop side of landing. It owns the per-partition buffers and decides when a micro-batch is cut
(``max_records``, ``max_bytes`` or ``max_age`` of wall clock, whichever comes first); encoding,
fsync and the conditional publication run on a small pool of worker threads (``Publisher``;
pyarrow and fsync release the GIL, so the event loop keeps fetching while files are written).

Publications of one partition run one at a time, in offset order (a per-partition lock); those of
different partitions run in parallel, at most ``workers`` at once. A partition with a flush
registered (running or waiting for a worker) is *busy*: ``due`` and ``next_due_in`` skip it, and
records drained meanwhile go into its next micro-batch.

Latency: a buffer's age counts from the fetch of its first record (``FetchedBatch.fetched_at``;
producer clocks are not trusted), and an age cut happens ``publish_lead`` before ``max_age``: an
estimate of how long a publication takes from the moment it is due until the file is visible
(smoothed mean plus four mean deviations, like TCP's retransmit timer), so a record becomes
visible close to ``max_age`` after it was fetched instead of ``max_age`` plus the publication.

The sink also remembers, per partition, the last offset it knows to be published (``expected``):
it answers resume positions from the landing directory, drops records at or below it (a replay
after a seek or a reset), and makes every publication conditional on it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import structlog

from mqd import metrics
from mqd.config import LandingConfig
from mqd.landing.layout import FileRange, LandingError
from mqd.landing.publisher import PublishConflict, Publisher, PublishOutcome

log = structlog.get_logger("mqd.landing")

_EST_GAIN = 0.125  # weight of a new sample in the publish-time estimate (TCP's SRTT gain)
_DEV_GAIN = 0.25  # weight of a new sample in its mean deviation (TCP's RTTVAR gain)

TP = tuple[str, int]  # mqd.consumer.TopicPartition is a NamedTuple of these
_T = TypeVar("_T")


class Drained(Protocol):
    """What the sink needs of a drained batch (mqd.consumer.FetchedBatch)."""

    @property
    def tp(self) -> Any: ...
    @property
    def records(self) -> pa.RecordBatch: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def fetched_at(self) -> float: ...


@dataclass(slots=True)
class _Buffer:
    batches: list[pa.RecordBatch] = field(default_factory=list)
    records: int = 0
    nbytes: int = 0
    next_offset: int = -1  # offset after the last buffered record
    since: float = 0.0  # monotonic time the first record of this micro-batch was fetched


@dataclass(slots=True)
class FlushResult:
    """One partition's flush: files published, then possibly a conflict or a disk error."""

    tp: TP
    published: list[FileRange]
    conflict: PublishConflict | None = None
    error: LandingError | None = None

    @property
    def next_offset(self) -> int | None:
        """Commit position: after the last published offset (None when nothing was published)."""
        return self.published[-1].last_offset + 1 if self.published else None


class LandingSink:
    def __init__(
        self, config: LandingConfig, *, executor: ThreadPoolExecutor | None = None, workers: int = 2
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self._config = config
        self.publisher = Publisher(config.dir, compression=config.compression)
        self.workers = workers
        self._executor = executor or ThreadPoolExecutor(workers, thread_name_prefix="mqd-landing")
        self._own_executor = executor is None
        self._slots = asyncio.Semaphore(workers)  # publications in flight, all partitions
        self._locks: dict[TP, asyncio.Lock] = {}  # one publication at a time per partition
        self._busy: Counter[TP] = Counter()  # flushes registered per partition (running or waiting)
        self._buffers: dict[TP, _Buffer] = {}
        self._expected: dict[TP, int | None] = {}
        self._epoch: dict[TP, int] = {}  # bumped by drop(): a flush in flight must not restore data
        self._inflight_bytes = 0
        # set whenever a flush takes a buffer (room in the sink) or ends; a waiter clears it first
        self.progress = asyncio.Event()
        self._publish_est: float | None = None  # smoothed due-to-visible time of a publication (s)
        self._publish_dev = 0.0  # its smoothed mean deviation
        self._closed = False
        self._cleaned = False
        self.stats: dict[str, int] = {"files": 0, "records": 0, "bytes": 0, "conflicts": 0, "dropped": 0}

    # -- lifecycle -------------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run blocking landing work (state, markers) on the sink's worker thread."""
        return await self._run(fn, *args)

    async def start(self) -> None:
        """Create the landing directory and check it is writable (LandingError otherwise)."""
        await self._run(self.publisher.ensure_root)
        if not self._cleaned:
            self._cleaned = True
            removed = await self._run(self.publisher.remove_stale_temp_files)
            if removed:
                log.info("removed temp files of crashed publications", count=removed)

    async def close(self) -> None:
        """Release the worker thread; buffered records are dropped (not published, not committed).
        A publication still running (a flush abandoned at its deadline) completes on its own: it
        is atomic and conditional either way."""
        if self._closed:
            return
        self._closed = True
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def reconfigure(self, config: LandingConfig) -> None:
        """New thresholds and compression; the directory cannot change while running."""
        if config.dir != self._config.dir:
            raise ValueError("landing.dir cannot change on reload; restart the daemon")
        self._config = config
        self.publisher.compression = config.compression

    # -- positions -------------------------------------------------------------------------------

    async def resume_position(self, tp: TP) -> int | None:
        """Next offset to fetch for a newly owned partition, from the landing directory (None:
        nothing published yet, the caller falls back to its offset store). Drops old buffers."""
        last = await self._run(self.publisher.last_published, tp[0], tp[1])
        self.drop(tp)
        self._expected[tp] = last
        return None if last is None else last + 1

    def expected(self, tp: TP) -> int | None:
        return self._expected.get(tp)

    def drop(self, tp: TP) -> int:
        """Forget the partition's unpublished records (revoked, or lost a conflict)."""
        self._epoch[tp] = self._epoch.get(tp, 0) + 1
        buf = self._buffers.pop(tp, None)
        if buf is None:
            return 0
        self.stats["dropped"] += buf.records
        return buf.records

    def forget(self, tp: TP) -> int:
        """Revoked: drop buffers and the cached position (re-read from disk on reassignment).
        Returns the number of records dropped."""
        self._expected.pop(tp, None)
        return self.drop(tp)

    # -- buffering -------------------------------------------------------------------------------

    def add(self, batch: Drained, now: float | None = None) -> int:
        """Buffer a drained batch; records already published or buffered are cut off. Returns the
        number of records kept. A new micro-batch's age counts from ``now`` when given, else from
        the batch's fetch time."""
        rb = batch.records
        if rb.num_rows == 0:
            return 0
        tp: TP = (batch.tp[0], batch.tp[1])
        buf = self._buffers.get(tp)
        floor = self._expected.get(tp)
        floor = -1 if floor is None else floor
        if buf is not None and buf.next_offset - 1 > floor:
            floor = buf.next_offset - 1
        if batch.first_offset <= floor:
            if batch.next_offset - 1 <= floor:
                return 0
            offsets = rb.column(0).to_numpy()
            rb = rb.slice(int(np.searchsorted(offsets, floor, side="right")))
            if rb.num_rows == 0:
                return 0
        if buf is None:
            buf = self._buffers[tp] = _Buffer(since=batch.fetched_at if now is None else now)
        buf.batches.append(rb)
        buf.records += rb.num_rows
        buf.nbytes += batch.nbytes if rb.num_rows == len(batch.records) else rb.nbytes
        buf.next_offset = int(rb.column(0)[-1].as_py()) + 1
        return rb.num_rows

    def _restore(self, tp: TP, batches: list[pa.RecordBatch], since: float) -> None:
        """Put back records a failed flush did not publish, ahead of anything added meanwhile."""
        if not batches:
            return
        newer = self._buffers.pop(tp, None)
        buf = _Buffer(since=since)
        for rb in batches + (newer.batches if newer else []):
            buf.batches.append(rb)
            buf.records += rb.num_rows
            buf.nbytes += rb.nbytes
        buf.next_offset = newer.next_offset if newer else int(batches[-1].column(0)[-1].as_py()) + 1
        self._buffers[tp] = buf

    @property
    def pending_records(self) -> int:
        return sum(b.records for b in self._buffers.values())

    @property
    def pending_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def pending(self) -> dict[TP, int]:
        return {tp: b.records for tp, b in self._buffers.items()}

    @property
    def inflight_bytes(self) -> int:
        """Bytes of micro-batches being published right now (taken out of the buffers)."""
        return self._inflight_bytes

    def busy(self, tp: TP) -> bool:
        """A flush of ``tp`` is running or waiting for a worker."""
        return self._busy[(tp[0], tp[1])] > 0

    @property
    def publish_lead(self) -> float:
        """How long before max_age an age cut happens: the publish-time estimate, at most half of
        max_age (a slow disk must not turn every micro-batch into a tiny file)."""
        if self._publish_est is None:
            return 0.0
        return min(self._publish_est + 4 * self._publish_dev, self._config.max_age / 2)

    def _observe_publish(self, seconds: float) -> None:
        if self._publish_est is None:
            self._publish_est, self._publish_dev = seconds, seconds / 2
            return
        err = seconds - self._publish_est
        self._publish_est += _EST_GAIN * err
        self._publish_dev += _DEV_GAIN * (abs(err) - self._publish_dev)

    def due(self, now: float | None = None) -> list[TP]:
        """Partitions whose micro-batch is to be cut now (busy ones excepted)."""
        now = time.monotonic() if now is None else now
        cfg = self._config
        age = cfg.max_age - self.publish_lead
        idle = [(tp, b) for tp, b in self._buffers.items() if not self._busy[tp]]
        out = [
            tp
            for tp, b in idle
            if b.records >= cfg.max_records or b.nbytes >= cfg.max_bytes or now - b.since >= age
        ]
        # the sink holds at most max_bytes (plus a batch), publications in flight included: cut
        # the biggest buffers that can be cut. Busy ones count too: a partition being published
        # refills meanwhile, and if only the idle ones counted, a full sink would wait for that
        # publication instead of starting the next one on a free worker.
        total = self.pending_bytes + self._inflight_bytes
        if total >= cfg.max_bytes:
            for tp, b in sorted(idle, key=lambda kv: -kv[1].nbytes):
                if total < cfg.max_bytes:
                    break
                if tp not in out:
                    out.append(tp)
                total -= b.nbytes
        return out

    def next_due_in(self, now: float | None = None) -> float | None:
        """Seconds until the oldest buffer that is not busy reaches its age cut (None when there
        is no such buffer)."""
        idle = [b.since for tp, b in self._buffers.items() if not self._busy[tp]]
        if not idle:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(idle) + self._config.max_age - self.publish_lead - now)

    # -- publication -----------------------------------------------------------------------------

    async def flush(self, tps: Iterable[TP] | None = None) -> list[FlushResult]:
        """Publish the buffers of ``tps`` (default: all), partitions in parallel. Per partition
        the result says what was published, and a conflict (buffer dropped: re-seek after
        ``conflict.last_offset``) or a disk error (unpublished records kept buffered: retry
        later). An unexpected exception is raised once every partition's flush has ended."""
        todo = list(self._buffers) if tps is None else [(tp[0], tp[1]) for tp in tps]
        outs = await asyncio.gather(*(self.flush_partition(tp) for tp in todo), return_exceptions=True)
        for out in outs:
            if isinstance(out, BaseException):
                raise out
        return [res for res in outs if isinstance(res, FlushResult)]

    def flush_partition(self, tp: TP) -> Coroutine[Any, Any, FlushResult | None]:
        """Cut and publish ``tp``'s micro-batch (None when nothing is buffered); await the result.

        The partition is busy from this call on (not from the coroutine's first step), so a caller
        that schedules the coroutine as a task does not see it due again meanwhile. The coroutine
        waits for the partition's previous publication and for a free worker; the buffer is taken
        only then, so records drained while waiting join this micro-batch."""
        tp = (tp[0], tp[1])
        self._busy[tp] += 1
        return self._flush_partition(tp, time.monotonic())

    async def _flush_partition(self, tp: TP, t0: float) -> FlushResult | None:
        lock = self._locks.setdefault(tp, asyncio.Lock())
        try:
            async with lock, self._slots:
                buf = self._buffers.pop(tp, None)
                if buf is None or not buf.batches:
                    return None
                self._inflight_bytes += buf.nbytes
                self.progress.set()
                try:
                    return await self._publish(tp, buf, t0)
                finally:
                    self._inflight_bytes -= buf.nbytes
        finally:
            self._busy[tp] -= 1
            if not self._busy[tp]:
                del self._busy[tp]
                self._locks.pop(tp, None)  # nobody holds or waits for it
            self.progress.set()

    async def _publish(self, tp: TP, buf: _Buffer, due_at: float) -> FlushResult:
        epoch = self._epoch.get(tp, 0)
        t0 = time.monotonic()
        try:
            outcome: PublishOutcome = await self._run(
                self.publisher.publish_records,
                tp[0],
                tp[1],
                buf.batches,
                self._expected.get(tp),
                self._config.max_records,
            )
        except BaseException:
            if self._epoch.get(tp, 0) == epoch:
                self._restore(tp, buf.batches, buf.since)
            raise
        end = time.monotonic()
        metrics.publish_latency.observe(end - t0)
        if outcome.published and outcome.error is None and outcome.conflict is None:
            self._observe_publish(end - due_at)  # includes the wait for a worker
        res = FlushResult(tp, outcome.published, outcome.conflict, outcome.error)
        for rng in outcome.published:
            self.stats["files"] += 1
            self.stats["records"] += rng.count
            self.stats["bytes"] += rng.bytes
            metrics.files_published.labels(tp[0]).inc()
            metrics.records_published.labels(tp[0]).inc(rng.count)
            metrics.bytes_published.labels(tp[0]).inc(rng.bytes)
        current = self._epoch.get(tp, 0) == epoch
        if outcome.published and current:
            self._expected[tp] = outcome.published[-1].last_offset
        if outcome.conflict is not None:
            self.stats["conflicts"] += 1
            metrics.publish_conflicts.labels(tp[0]).inc()
            log.warning(
                "publish_conflict",
                topic=tp[0],
                partition=tp[1],
                expected=outcome.conflict.expected,
                landed=outcome.conflict.last_offset,
            )
            self.stats["dropped"] += buf.records - sum(r.count for r in outcome.published)
            if current:
                self.drop(tp)  # what arrived meanwhile follows the lost batch: drop it too
                self._expected[tp] = outcome.conflict.last_offset
        elif outcome.error is not None:
            metrics.landing_errors.labels(str(outcome.error.errno or "other")).inc()
            if current:
                self._restore(tp, outcome.remaining, buf.since)
        return res

    def status(self) -> dict[str, Any]:
        return {
            "dir": str(self._config.dir),
            "pending_records": self.pending_records,
            "pending_bytes": self.pending_bytes,
            "pending_partitions": len(self._buffers),
            "inflight_bytes": self._inflight_bytes,
            "flushing_partitions": len(self._busy),
            "publish_lead_s": round(self.publish_lead, 4),
            **self.stats,
        }
