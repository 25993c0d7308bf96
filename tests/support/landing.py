"""Landing helpers for tests: shortcuts over the store and the sink that the daemon does not need
(it publishes through ``LandingSink`` and ``Publisher.stream``, and reads heads through
``LandingSink.resume_head``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from mqd.landing.layout import FileRange
from mqd.landing.local_store import LocalStore
from mqd.landing.micro_batches import TP
from mqd.landing.sink import LandingSink
from mqd.landing.stage_writer import StagedFile
from mqd.landing.store import LandingStore
from mqd.topic_name import check_topic_name


def stage(store: LandingStore, records: pa.Table, rng: FileRange, compression: str) -> StagedFile:
    """Stage ``records`` (the landing schema, one hour, one partition) as the one row group of the
    file ``rng`` describes: durable, invisible, the input of ``store.commit``."""
    writer = store.open_stage(rng, compression)
    try:
        writer.write(records)
        return writer.finish(rng)
    except BaseException:
        writer.abort()
        raise


async def resume(sink: LandingSink, tp: TP) -> tuple[int | None, str | None]:
    """Where a new owner of ``tp`` fetches from: after the published head (None: nothing
    published), and the log incarnation it belongs to. Drops the sink's buffers of ``tp``."""
    head = await sink.resume_head(tp)
    return (None if head.last_offset is None else head.last_offset + 1), head.incarnation


async def resume_position(sink: LandingSink, tp: TP) -> int | None:
    """``resume`` without the incarnation."""
    return (await resume(sink, tp))[0]


def read_manifest(root: Path, topic: str | None = None) -> list[FileRange]:
    """Every published file of the local landing ``root`` (of ``topic``), in chain order per
    partition."""
    return LocalStore(Path(root)).manifest(None if topic is None else check_topic_name(topic))


def read_watermarks(root: Path, topic: str, partitions: int) -> list[int | None]:
    """Watermark per partition 0..partitions-1 of the local landing ``root`` (None: unknown,
    nothing published or seen idle)."""
    return LocalStore(Path(root)).watermarks(topic, partitions)


def update_markers(root: Path, topic: str, partitions: int, now_ms: int | None = None) -> list[Path]:
    """The completeness markers of the local landing ``root`` written now (markers.py), as paths.
    fsutil.LockTimeout when another process holds the progress record's swap past its bound."""
    root = Path(root)
    return [root / key for key in LocalStore(root).update_markers(topic, partitions, now_ms=now_ms)]
