"""The landing sink gives the C heap's free pages back once it is idle after a burst (issue 14).

A backlog's decoded records and answers leave holes in glibc's heap that it keeps for reuse: a daemon
that landed 6 M records from Kafka kept 75-110 MiB above its idle RSS for good. Here the holes are
made directly (~86 MiB of 100 kB chunks freed between survivors, so no heap top can shrink), then a
real sink publishes one file into a real landing directory and goes idle: this process's RSS must
fall by at least half of the holes. Without the trim it does not move (glibc returns no page on its own).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mqd.config import LandingConfig
from mqd.landing.sink import LandingSink
from mqd.memory_trim import _malloc_trim, rss_mib
from mqd.wire import format as fmt

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or _malloc_trim() is None, reason="glibc's malloc_trim, Linux RSS"
)

CHUNK = 100_000  # below glibc's smallest mmap threshold (128 KiB): from the heap
CHUNKS = 1000
FREED_MIB = CHUNK * CHUNKS * 9 / 10 / 2**20  # every tenth survives


class Batch:
    """A drained batch of ``count`` records from offset ``first`` (micro_batches.Drained)."""

    def __init__(self, first: int, count: int) -> None:
        raw = fmt.encode_batch(
            [b"v" * 10 for _ in range(count)],
            timestamps=np.full(count, 1_767_225_600_000, dtype=np.int64),
            base_offset=first,
        )
        self.tp = ("t", 0)
        self.records: pa.RecordBatch = fmt.to_arrow(raw, fmt.scan(raw)[0])
        self.first_offset = first
        self.next_offset = first + count
        self.nbytes = self.records.nbytes
        self.fetched_at = time.monotonic()
        self.incarnation: str | None = None


def heap_with_holes() -> list[bytes]:
    """~86 MiB freed inside the heap, pinned in place by every tenth chunk (written, so resident)."""
    chunks = [b"\x01" * CHUNK for _ in range(CHUNKS)]
    return chunks[::10]


async def publish_one(sink: LandingSink, first: int) -> None:
    """One file of 100 records through a background publication, until the sink is idle."""
    sink.add(Batch(first, 100))
    sink.start_publications([("t", 0)], finish=True)
    await sink.wait_idle()


def test_an_idle_sink_gives_the_heap_back_after_a_burst(tmp_path: Path) -> None:
    async def run() -> None:
        sink = LandingSink(LandingConfig(dir=tmp_path, max_age=3600.0), trim_after_bytes=1)
        await sink.start()
        try:
            await publish_one(sink, 0)  # what a first publication loads (the Parquet writer) is not heap
            survivors = heap_with_holes()
            before = rss_mib()
            assert before is not None
            await publish_one(sink, 100)
            after = rss_mib()
            assert sink.stats.files == 2 and sink.pending_records == 0
            assert after is not None and before - after >= FREED_MIB / 2, (before, after)
            del survivors
        finally:
            await sink.close()

    asyncio.run(run())


def test_no_trim_before_a_burst_worth_it(tmp_path: Path) -> None:
    """Below ``trim_after_bytes`` an idle sink leaves the heap alone (a trim walks the whole heap)."""

    async def run() -> None:
        sink = LandingSink(LandingConfig(dir=tmp_path, max_age=3600.0), trim_after_bytes=2**40)
        await sink.start()
        try:
            await publish_one(sink, 0)
            survivors = heap_with_holes()
            before = rss_mib()
            await publish_one(sink, 100)
            after = rss_mib()
            assert before is not None and after is not None and before - after < FREED_MIB / 2, (
                before,
                after,
            )
            del survivors
        finally:
            await sink.close()

    asyncio.run(run())
