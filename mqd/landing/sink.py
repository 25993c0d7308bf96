"""The landing sink: buffers drained batches per partition and cuts them into published files.

Loop side of landing. It owns the per-partition buffers and decides when a micro-batch is cut
(``max_records``, ``max_bytes`` or ``max_age`` of wall clock, whichever comes first); encoding,
fsync and the conditional publication run on one dedicated worker thread (``Publisher``).

The sink also remembers, per partition, the last offset it knows to be published (``expected``):
it answers resume positions from the landing directory, drops records at or below it (a replay
after a seek or a reset), and makes every publication conditional on it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
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


@dataclass(slots=True)
class _Buffer:
    batches: list[pa.RecordBatch] = field(default_factory=list)
    records: int = 0
    nbytes: int = 0
    next_offset: int = -1  # offset after the last buffered record
    since: float = 0.0  # monotonic time the first record of this micro-batch arrived


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
    def __init__(self, config: LandingConfig, *, executor: ThreadPoolExecutor | None = None) -> None:
        self._config = config
        self.publisher = Publisher(config.dir, compression=config.compression)
        self._executor = executor or ThreadPoolExecutor(1, thread_name_prefix="mqd-landing")
        self._own_executor = executor is None
        self._buffers: dict[TP, _Buffer] = {}
        self._expected: dict[TP, int | None] = {}
        self._epoch: dict[TP, int] = {}  # bumped by drop(): a flush in flight must not restore data
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
        number of records kept."""
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
            buf = self._buffers[tp] = _Buffer(since=time.monotonic() if now is None else now)
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

    def due(self, now: float | None = None) -> list[TP]:
        """Partitions whose micro-batch is to be cut now."""
        now = time.monotonic() if now is None else now
        cfg = self._config
        out = [
            tp
            for tp, b in self._buffers.items()
            if b.records >= cfg.max_records or b.nbytes >= cfg.max_bytes or now - b.since >= cfg.max_age
        ]
        # the whole sink holds at most max_bytes more than a file: cut the biggest buffers first
        total = self.pending_bytes
        if total >= cfg.max_bytes:
            for tp, b in sorted(self._buffers.items(), key=lambda kv: -kv[1].nbytes):
                if total < cfg.max_bytes:
                    break
                if tp not in out:
                    out.append(tp)
                total -= b.nbytes
        return out

    def next_due_in(self, now: float | None = None) -> float | None:
        """Seconds until the oldest buffer reaches max_age (None when nothing is buffered)."""
        if not self._buffers:
            return None
        now = time.monotonic() if now is None else now
        oldest = min(b.since for b in self._buffers.values())
        return max(0.0, oldest + self._config.max_age - now)

    # -- publication -----------------------------------------------------------------------------

    async def flush(self, tps: Iterable[TP] | None = None) -> list[FlushResult]:
        """Publish the buffers of ``tps`` (default: all). Per partition the result says what was
        published, and a conflict (buffer dropped: re-seek after ``conflict.last_offset``) or a
        disk error (unpublished records kept buffered: retry later)."""
        results: list[FlushResult] = []
        for tp in list(self._buffers) if tps is None else list(tps):
            buf = self._buffers.pop(tp, None)
            if buf is None or not buf.batches:
                continue
            epoch = self._epoch.get(tp, 0)
            t0 = time.monotonic()
            try:
                outcome: PublishOutcome = await self._run(
                    self.publisher.publish_records, tp[0], tp[1], buf.batches, self._expected.get(tp),
                    self._config.max_records,
                )
            except BaseException:
                if self._epoch.get(tp, 0) == epoch:
                    self._restore(tp, buf.batches, buf.since)
                raise
            metrics.publish_latency.observe(time.monotonic() - t0)
            res = FlushResult(tp, outcome.published, outcome.conflict, outcome.error)
            results.append(res)
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
                log.warning("publish_conflict", topic=tp[0], partition=tp[1],
                            expected=outcome.conflict.expected, landed=outcome.conflict.last_offset)
                self.stats["dropped"] += buf.records - sum(r.count for r in outcome.published)
                if current:
                    self.drop(tp)  # what arrived meanwhile follows the lost batch: drop it too
                    self._expected[tp] = outcome.conflict.last_offset
            elif outcome.error is not None:
                metrics.landing_errors.labels(str(outcome.error.errno or "other")).inc()
                if current:
                    self._restore(tp, outcome.remaining, buf.since)
        return results

    def status(self) -> dict[str, Any]:
        return {
            "dir": str(self._config.dir),
            "pending_records": self.pending_records,
            "pending_bytes": self.pending_bytes,
            "pending_partitions": len(self._buffers),
            **self.stats,
        }
