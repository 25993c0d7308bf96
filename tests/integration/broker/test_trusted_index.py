"""Start-up trusts a cleanly closed segment's index files instead of rescanning the segment.

Issue 12, point 4: ``load_indexes`` used to reject every index (the header check wanted the whole
batch in a 48-byte buffer), so each start rescanned the whole log. These tests count, through
``PartitionLog.segments_trusted`` / ``segments_scanned``, which segments an open scanned: only the
active one after a clean close, and any closed one whose index does not match its log file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mqd.broker.storage import PartitionLog, Storage
from mqd.config import StorageConfig
from mqd.wire import format as fmt

TOPIC = "events"


def _open(root: Path) -> tuple[Storage, PartitionLog]:
    storage = Storage(root, StorageConfig(segment_bytes=4096, fsync="never"))
    storage.open([(TOPIC, 0)])
    plog = storage.get(TOPIC, 0)
    assert plog is not None
    return storage, plog


@pytest.fixture
def written(tmp_path: Path) -> Iterator[tuple[Path, bytes, list[int]]]:
    """A log of several closed segments, closed cleanly: (root, whole log bytes, batch bases)."""
    storage, plog = _open(tmp_path)
    bases = []
    for i in range(60):
        batch = fmt.encode_batch([bytes([i]) * 100] * 2, timestamps=[1_000 + i] * 2)
        first, _ = plog.append(batch, fmt.validate(batch))
        bases.append(first)
    assert plog.segment_count >= 5
    data = plog.read(0, 10**9)
    storage.close()
    yield tmp_path, data, bases


def _segments(root: Path) -> list[Path]:
    return sorted((root / "logs" / f"{TOPIC}-0").glob("*.log"))


def test_clean_close_reopens_without_scanning_closed_segments(
    written: tuple[Path, bytes, list[int]],
) -> None:
    """After a clean close only the active segment is scanned; the trusted indexes serve reads and
    timestamp lookups exactly as the rebuilt ones did."""
    root, data, bases = written
    n = len(_segments(root))
    storage, plog = _open(root)
    try:
        assert (plog.segments_trusted, plog.segments_scanned) == (n - 1, 1)
        assert plog.read(0, 10**9) == data
        assert plog.max_offset == bases[-1] + 2
        for i, base in enumerate(bases):
            assert plog.offset_for_timestamp(1_000 + i) == base
            assert plog.read(base + 1, 1)[8:16] == struct.pack("<q", base)
    finally:
        storage.close()


def _index_files(seg: Path) -> tuple[bytes, bytes]:
    return seg.with_suffix(".index").read_bytes(), seg.with_suffix(".timeindex").read_bytes()


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def _index_points_one_batch_late(seg: Path) -> None:
    idx = seg.with_suffix(".index")
    raw = bytearray(idx.read_bytes())
    raw[-8:-4] = struct.pack("<I", struct.unpack("<I", raw[-8:-4])[0] + 1)  # last entry's offset
    idx.write_bytes(bytes(raw))


def _timeindex_off(seg: Path) -> None:
    _flip(seg.with_suffix(".timeindex"), 0)


def _log_longer_than_index(seg: Path) -> None:
    idx = seg.with_suffix(".index")
    idx.write_bytes(idx.read_bytes()[:-8])  # the index misses the last batch


def _middle_entry_swapped(seg: Path) -> None:
    idx = seg.with_suffix(".index")
    raw = bytearray(idx.read_bytes())
    raw[8:16], raw[16:24] = raw[16:24], raw[8:16]  # entries out of order
    idx.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage",
    [_index_points_one_batch_late, _timeindex_off, _log_longer_than_index, _middle_entry_swapped],
)
def test_damaged_index_is_detected_and_rebuilt(
    written: tuple[Path, bytes, list[int]], damage: Callable[[Path], None]
) -> None:
    """A closed segment whose index files do not match its log is scanned and its index files are
    written again from the log; the data read back is unchanged and the next start trusts them."""
    root, data, _bases = written
    segs = _segments(root)
    victim = segs[1]
    original = _index_files(victim)
    damage(victim)
    storage, plog = _open(root)
    try:
        assert (plog.segments_trusted, plog.segments_scanned) == (len(segs) - 2, 2)
        assert plog.read(0, 10**9) == data
    finally:
        storage.close()
    assert (
        victim.with_suffix(".index").read_bytes(),
        victim.with_suffix(".timeindex").read_bytes(),
    ) == original
    storage, plog = _open(root)
    try:
        assert (plog.segments_trusted, plog.segments_scanned) == (len(segs) - 1, 1)
    finally:
        storage.close()


def test_damaged_last_batch_of_a_closed_segment_is_not_trusted(
    written: tuple[Path, bytes, list[int]],
) -> None:
    """A flipped byte in the last batch of a closed segment fails the CRC read-back: the segment is
    scanned instead of its index being trusted over bad data (recovery then fences the bad batch
    and keeps every later segment, issue 12 point 3)."""
    root, _data, _bases = written
    segs = _segments(root)
    _flip(segs[1], segs[1].stat().st_size - 9)
    storage, plog = _open(root)
    try:
        assert plog.segments_scanned == 2  # the damaged segment and the active one
        assert plog.segments_trusted == len(segs) - 2
        # the bad batch was found, so the segment was read: its offsets are fenced, no more
        fenced = plog.fenced_ranges()
        assert len(fenced) == 1 and fenced[0][1] == int(segs[2].stem) - 1
        assert plog.segment_count == len(segs)
    finally:
        storage.close()
