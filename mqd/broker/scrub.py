"""SegmentScrubber: a background CRC check of every closed segment, so damage is found by the broker.

A closed segment whose index is trusted at start (segment.py) has only its first and last batches
read back; a flipped byte in a middle batch would be served until a consumer's CRC check refused it
(chaos seed 508187, ``segment_bitflip``). The scrub walks every closed segment of every partition
log and checks each batch with the append path's checker (:func:`mqd.wire.format.validate`: header, CRC,
section layout), plus that it carries the offset and fills the bytes its index entry says. A batch
that fails is fenced through the storage's fencing path (:meth:`PartitionLog.fence_damaged`: a hole,
``fenced.json``, the error line, DATA_LOST on fetch, health ``degraded``). On a master, its slaves
are asked for the batch first (``good_copy``) and a good copy replaces the hole in the same step of
the event loop, so no fetch ever sees the range fenced (a consumer given DATA_LOST counts the records
lost and moves on). A range that stays fenced goes to ``on_fenced``: the node's repair path asks a
replica again with backoff (fenced_repair.py, by the slave's replicator or the master's recovery);
a slave's fenced range costs nothing meanwhile, its fetches are sent to the master.

Order: the first pass after start takes the segments whose index was trusted first, newest first
(recent data is what consumers read next); every later pass takes all closed segments in offset
order. Rate: at most ``storage.scrub_bytes_per_second`` (a sleep after each chunk), a pass lasts at
least :data:`PASS_MIN_S` so a small log is not re-read in a tight loop. Reads are preads on a dup of
the segment's fd in a worker thread, outside the partition's lock; only the fencing step takes it. A
segment deleted by retention, rewritten by a repair or made active by a truncation meanwhile is
skipped (counted).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from mqd.broker.segment import Segment
from mqd.broker.storage import PartitionLog, ScrubView, Storage, StorageError
from mqd.wire import format as fmt

log = structlog.get_logger(__name__)

CHUNK_BYTES = 256 * 1024  # one pread: whole batches up to this (at least one)
PASS_MIN_S = 10.0  # a full pass takes at least this long, however little there is to read


@dataclass(slots=True)
class ScrubCounters:
    """What the scrub did since start (``/v1/stats`` ``scrub``)."""

    bytes_scrubbed: int = 0
    batches_checked: int = 0
    damaged_found: int = 0  # batches fenced by the scrub
    segments_scrubbed: int = 0
    segments_skipped: int = 0  # deleted, rewritten or made active while being scrubbed
    passes: int = 0


def damaged_entries(raw: bytes, start: int, entries: list[tuple[int, int, int, int]]) -> list[int]:
    """Indexes into ``entries`` (``(first offset, last offset, begin, end)``, file positions; ``raw``
    read from file position ``start``) whose bytes are not one intact batch at that offset filling
    exactly ``[begin, end)``: header, CRC and layout as the append path checks them, and the base
    offset, which the CRC does not cover."""
    bad: list[int] = []
    view = memoryview(raw)
    for k, (offset, _, begin, end) in enumerate(entries):
        try:
            infos = fmt.validate(view[begin - start : end - start])
        except fmt.BatchError:
            bad.append(k)
            continue
        if len(infos) != 1 or infos[0].base_offset != offset:
            bad.append(k)
    return bad


class SegmentScrubber:
    """Walks the closed segments of ``storage`` at a bounded rate; fences what fails the check."""

    def __init__(
        self,
        storage: Storage,
        bytes_per_second: int,
        on_fenced: Callable[[PartitionLog, tuple[int, int]], None] | None = None,
        good_copy: Callable[[PartitionLog, int, int], Awaitable[bytes | None]] | None = None,
    ) -> None:
        self._storage = storage
        self._rate = bytes_per_second
        self._on_fenced = on_fenced  # a range stays fenced: the node's repair path takes it
        self._good_copy = good_copy  # a replica's intact batches for (first, last), or None
        self.counters = ScrubCounters()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._rate <= 0 or self._task is not None:
            return
        self._task = asyncio.create_task(self._run(), name="segment-scrub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def status(self) -> dict[str, int]:
        c = self.counters
        return {
            "bytes_per_second": self._rate,
            "bytes_scrubbed": c.bytes_scrubbed,
            "batches_checked": c.batches_checked,
            "damaged_found": c.damaged_found,
            "segments_scrubbed": c.segments_scrubbed,
            "segments_skipped": c.segments_skipped,
            "passes": c.passes,
        }

    # -- the walk ----------------------------------------------------------------------------------

    def _targets(self, first_pass: bool) -> list[tuple[PartitionLog, Segment]]:
        targets = [(plog, seg) for plog in self._storage.logs() for seg in plog.closed_segments()]
        if first_pass:
            # trusted indexes first (nothing checked their middle batches), newest first
            trusted = [t for t in targets if t[1].trusted]
            trusted.sort(key=lambda t: _mtime(t[1]), reverse=True)
            targets = trusted + [t for t in targets if not t[1].trusted]
        return targets

    async def _run(self) -> None:
        first_pass = True
        while True:
            started = time.monotonic()
            try:
                for plog, seg in self._targets(first_pass):
                    await self._scrub_segment(plog, seg)
            except asyncio.CancelledError:
                raise
            except Exception:
                # a bug must not end the scrub for good: the next pass starts over
                log.exception("segment scrub pass failed")
            first_pass = False
            self.counters.passes += 1
            await asyncio.sleep(max(0.0, PASS_MIN_S - (time.monotonic() - started)))

    async def _scrub_segment(self, plog: PartitionLog, seg: Segment) -> None:
        view = plog.scrub_view(seg)
        if view is None:
            self.counters.segments_skipped += 1
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[bytes, list[int]]] | None = None
        try:
            entries = view.entries
            i = 0
            while i < len(entries):
                if not plog.is_closed_segment(seg):
                    self.counters.segments_skipped += 1
                    log.debug("scrub: segment gone meanwhile", topic=plog.topic, partition=plog.partition)
                    return
                j = i + 1
                while j < len(entries) and entries[j][3] - entries[i][2] <= CHUNK_BYTES:
                    j += 1
                chunk = entries[i:j]
                future = loop.run_in_executor(None, _read_and_check, view, chunk)
                try:
                    # shielded: a stop must not close the fd under a pread still running
                    _, bad = await asyncio.shield(future)
                except OSError as exc:
                    self._storage.disk.note_error(exc, "scrub read")
                    log.error(
                        "scrub: cannot read segment",
                        topic=plog.topic,
                        partition=plog.partition,
                        segment=seg.path.name,
                        error=str(exc),
                    )
                    return
                nbytes = chunk[-1][3] - chunk[0][2]
                self.counters.bytes_scrubbed += nbytes
                self.counters.batches_checked += len(chunk)
                for k in bad:
                    await self._fence(plog, seg, chunk[k])
                i = j
                await asyncio.sleep(nbytes / self._rate)
            self.counters.segments_scrubbed += 1
            seg.trusted = False
        finally:
            if future is not None and not future.done():
                future.add_done_callback(lambda _f: os.close(view.fd))
            else:
                os.close(view.fd)

    async def _fence(self, plog: PartitionLog, seg: Segment, entry: tuple[int, int, int, int]) -> None:
        first, last, begin, _ = entry
        # ask a replica first: fencing and repairing in one step of the loop leaves no moment in
        # which a fetch there answers DATA_LOST (a consumer would count the records lost and move on)
        good: bytes | None = None
        if self._good_copy is not None:
            try:
                good = await self._good_copy(plog, first, last)
            except Exception:
                log.exception("scrub: asking a replica for a damaged batch failed", topic=plog.topic)
        try:
            fenced = plog.fence_damaged(seg, first, begin, "scrub: CRC or layout check failed")
        except StorageError as exc:
            log.error(
                "scrub: damaged batch not fenced",
                topic=plog.topic,
                partition=plog.partition,
                offset=first,
                error=str(exc),
            )
            return
        if fenced is None:
            self.counters.segments_skipped += 1
            return
        self.counters.damaged_found += 1
        if good is not None:
            try:
                plog.repair_fenced(good, fmt.validate(good))
                return
            except (StorageError, fmt.BatchError) as exc:
                log.error("scrub: replica copy not applied", topic=plog.topic, offset=first, error=str(exc))
        if self._on_fenced is not None:
            self._on_fenced(plog, fenced)


def _mtime(seg: Segment) -> float:
    try:
        return seg.path.stat().st_mtime
    except OSError:
        return 0.0  # gone meanwhile: its turn comes last and is skipped


def _read_and_check(view: ScrubView, chunk: list[tuple[int, int, int, int]]) -> tuple[bytes, list[int]]:
    """Worker thread: one pread of the chunk's bytes, then the check of each batch."""
    start, end = chunk[0][2], chunk[-1][3]
    raw = os.pread(view.fd, end - start, start)
    if len(raw) != end - start:
        # shorter than the index says: every batch not wholly read is damaged
        raw = raw + b"\0" * (end - start - len(raw))
    return raw, damaged_entries(raw, start, chunk)


__all__ = ["CHUNK_BYTES", "PASS_MIN_S", "ScrubCounters", "SegmentScrubber", "damaged_entries"]
