"""Broker storage (mqd/broker/storage.py): segment files, indexes, recovery, retention, truncation.

Unit tests on real files in tmp dirs; no server.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqd.broker.storage import PartitionLog, Storage, StorageError
from mqd.config import StorageConfig
from mqd.wire import format as fmt

TOPIC = "events"


def make_batch(count: int, *, ts: int = 1_000, size: int = 16, tag: int = 0) -> bytes:
    values = [bytes([(tag + i) % 256]) * size for i in range(count)]
    return fmt.encode_batch(values, keys=[b"k%d" % i for i in range(count)], timestamps=[ts] * count)


def stored(batch: bytes, base_offset: int) -> bytes:
    """What the log holds for ``batch`` once appended at ``base_offset``."""
    buf = bytearray(batch)
    fmt.set_base_offset(buf, 0, base_offset)
    return bytes(buf)


def append(plog: PartitionLog, batch: bytes) -> tuple[int, int]:
    return plog.append(batch, fmt.validate(batch))


def seg_dir(root: Path) -> Path:
    return root / "logs" / f"{TOPIC}-0"


def segment_files(root: Path, suffix: str = ".log") -> list[Path]:
    return sorted(seg_dir(root).glob(f"*{suffix}"))


class Opened:
    """A Storage holding one partition, reopenable to simulate a restart."""

    def __init__(self, root: Path, **cfg: object) -> None:
        self.root = root
        self.config = StorageConfig(**cfg)  # type: ignore[arg-type]
        self.storage: Storage | None = None
        self.reopen()

    @property
    def log(self) -> PartitionLog:
        assert self.storage is not None
        plog = self.storage.get(TOPIC, 0)
        assert plog is not None
        return plog

    def reopen(self) -> PartitionLog:
        self.close()
        self.storage = Storage(self.root, self.config)
        self.storage.open([(TOPIC, 0)])
        return self.log

    def close(self) -> None:
        if self.storage is not None:
            self.storage.close()
            self.storage = None


@pytest.fixture
def opened(tmp_path: Path) -> Iterator[Opened]:
    o = Opened(tmp_path, segment_bytes=4096, fsync="never")
    yield o
    o.close()


def fill(plog: PartitionLog, batches: int, count: int = 3, size: int = 100) -> list[tuple[int, bytes]]:
    """Append ``batches`` batches; returns (base_offset, stored bytes) of each."""
    out = []
    for i in range(batches):
        b = make_batch(count, ts=1_000 + i, size=size, tag=i)
        first, last = append(plog, b)
        assert last == first + count - 1
        out.append((first, stored(b, first)))
    return out


# -- append and read ---------------------------------------------------------------------------------


def test_append_read_round_trip(opened: Opened) -> None:
    """Appended batches get dense offsets and read back as the exact stored bytes."""
    plog = opened.log
    assert (plog.min_offset, plog.max_offset) == (0, 0)
    written = fill(plog, 5, count=4, size=10)
    assert [b for b, _ in written] == [0, 4, 8, 12, 16]
    assert plog.max_offset == 20
    for base, data in written:
        got = plog.read(base, len(data))
        assert got == data
        info = fmt.validate(got)[0]
        assert (info.base_offset, info.count) == (base, 4)


def test_read_inside_batch_returns_containing_batch(opened: Opened) -> None:
    """A read at an offset inside a batch starts with that whole batch; out of range reads are empty."""
    plog = opened.log
    written = fill(plog, 3, count=5, size=8)
    assert plog.read(7, 1) == written[1][1]  # batch 5..9, whole, though bigger than max_bytes
    assert plog.read(14, 10**6) == written[2][1]
    assert plog.read(15, 10**6) == b""
    assert plog.read(-1, 10**6) == b""
    assert plog.read(3, 10**6) == b"".join(d for _, d in written)


def test_read_respects_max_bytes_with_whole_batches(opened: Opened) -> None:
    """max_bytes cuts at batch boundaries; at least one batch is always returned."""
    plog = opened.log
    written = fill(plog, 4, count=2, size=40)
    one = len(written[0][1])
    assert plog.read(0, one * 2 + one // 2) == written[0][1] + written[1][1]
    assert plog.read(0, 0) == written[0][1]
    assert plog.read(2, one * 3) == b"".join(d for _, d in written[1:])


def test_reads_cross_segment_rolls(opened: Opened) -> None:
    """Segments roll at segment_bytes; one read can span several segments and stays dense."""
    plog = opened.log
    written = fill(plog, 40, count=3, size=100)
    assert plog.segment_count > 3
    assert len(segment_files(opened.root)) == plog.segment_count
    everything = plog.read(0, 10**9)
    assert everything == b"".join(d for _, d in written)
    infos = fmt.validate(everything)
    assert [i.base_offset for i in infos] == [b for b, _ in written]
    # a bounded read starting in the middle of a segment crosses into the next one
    mid = written[10][0] + 1
    part = plog.read(mid, 5000)
    assert fmt.scan(part)[0].base_offset == written[10][0]
    assert len(part) <= 5000 and part == plog.read(written[10][0], 5000)
    assert part == b"".join(d for _, d in written[10 : 10 + len(fmt.scan(part))])


def test_bytes_behind(opened: Opened) -> None:
    """bytes_behind is the distance in bytes from the batch holding an offset to the log end."""
    plog = opened.log
    written = fill(plog, 30, count=2, size=100)
    total = sum(len(d) for _, d in written)
    assert plog.bytes_behind(0) == total
    assert plog.bytes_behind(1) == total
    assert plog.bytes_behind(written[20][0]) == sum(len(d) for _, d in written[20:])
    assert plog.bytes_behind(plog.max_offset) == 0
    assert plog.bytes_behind(plog.max_offset + 5) == 0


def test_append_rejects_infos_not_matching_data(opened: Opened) -> None:
    """An append whose batch infos do not describe the data is refused before anything is written."""
    plog = opened.log
    b = make_batch(2)
    infos = fmt.validate(b)
    with pytest.raises(StorageError) as e:
        plog.append(b + b, infos)
    assert e.value.retriable is False
    with pytest.raises(StorageError):
        plog.append(b, [])
    assert plog.max_offset == 0 and plog.read(0, 10**6) == b""


def test_fsync_always_and_concurrent_flush(tmp_path: Path) -> None:
    """flush() from another thread while the owner appends and rolls never fails or loses data."""
    o = Opened(tmp_path, segment_bytes=4096, fsync="interval")
    try:
        plog = o.log
        stop = threading.Event()
        errors: list[BaseException] = []

        def flusher() -> None:
            while not stop.is_set():
                try:
                    o.storage.flush_all()  # type: ignore[union-attr]
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)
                    return

        t = threading.Thread(target=flusher)
        t.start()
        try:
            written = fill(plog, 60, count=2, size=64)
        finally:
            stop.set()
            t.join(10)
        assert not errors
        assert plog.read(0, 10**9) == b"".join(d for _, d in written)
        assert plog.segment_count > 1
    finally:
        o.close()
    o2 = Opened(tmp_path, segment_bytes=4096, fsync="always")
    try:
        first, _ = append(o2.log, make_batch(1))
        assert first == 120
    finally:
        o2.close()


def test_second_storage_on_same_dir_is_refused(opened: Opened) -> None:
    """Two brokers must not share a data dir: the second open fails clearly."""
    other = Storage(opened.root, opened.config)
    with pytest.raises(StorageError, match="in use"):
        other.open([(TOPIC, 0)])
    other.close()


def test_closed_log_refuses_appends(opened: Opened) -> None:
    """After close, appends raise a retriable StorageError and reads answer nothing; close is idempotent."""
    plog = opened.log
    fill(plog, 1)
    opened.close()
    opened.close()
    with pytest.raises(StorageError) as e:
        append(plog, make_batch(1))
    assert e.value.retriable is True
    assert plog.read(0, 100) == b""


# -- recovery ------------------------------------------------------------------------------------------


def _last_log(root: Path) -> Path:
    return segment_files(root)[-1]


@pytest.mark.parametrize("damage", ["garbage", "half_batch", "flipped_byte"])
def test_recovery_truncates_torn_tail(opened: Opened, damage: str) -> None:
    """A torn or corrupt tail is cut on open; earlier batches stay; appends continue after them."""
    plog = opened.log
    written = fill(plog, 6, count=2, size=50)  # stays in one segment
    assert plog.segment_count == 1
    opened.close()
    path = _last_log(opened.root)
    good_size = path.stat().st_size
    extra = make_batch(3, tag=9)
    if damage == "garbage":
        with open(path, "ab") as fh:
            fh.write(b"\xde\xad\xbe\xef" * 7)
        expect = written
    elif damage == "half_batch":
        with open(path, "ab") as fh:
            fh.write(stored(extra, 12)[: len(extra) // 2])
        expect = written
    else:
        # flip a byte inside the last batch: its CRC no longer matches
        with open(path, "r+b") as fh:
            fh.seek(good_size - 9)
            byte = fh.read(1)
            fh.seek(good_size - 9)
            fh.write(bytes([byte[0] ^ 0xFF]))
        expect = written[:-1]
    plog = opened.reopen()
    valid = sum(len(d) for _, d in expect)
    assert path.stat().st_size == valid
    assert plog.max_offset == expect[-1][0] + 2
    assert plog.read(0, 10**9) == b"".join(d for _, d in expect)
    first, last = append(plog, extra)
    assert (first, last) == (plog.max_offset - 3, plog.max_offset - 1)
    assert first == expect[-1][0] + 2
    plog = opened.reopen()
    assert plog.read(first, 10**6) == stored(extra, first)


def test_recovery_of_corrupt_closed_segment_fences_the_damage(opened: Opened) -> None:
    """A corrupt batch in a closed segment (index gone, CRC bad) is fenced: every other batch, in
    that segment and in all later ones, stays readable; appends continue at the old log end
    (issue 12 case 3: this used to cut the segment and delete every later one)."""
    plog = opened.log
    written = fill(plog, 40, count=2, size=100)
    assert plog.segment_count >= 3
    segments, end = plog.segment_count, plog.max_offset
    opened.close()
    logs = segment_files(opened.root)
    second = logs[1]
    base = int(second.stem)
    second.with_suffix(".index").unlink()
    with open(second, "r+b") as fh:  # corrupt the second batch of the second segment
        first_len = int.from_bytes(fh.read(8)[4:8], "little")
        fh.seek(first_len + 60)
        byte = fh.read(1)
        fh.seek(first_len + 60)
        fh.write(bytes([byte[0] ^ 1]))
    plog = opened.reopen()
    assert plog.segment_count == segments and len(segment_files(opened.root)) == segments
    assert plog.max_offset == end
    assert plog.fenced_ranges() == [(base + 2, base + 3)]
    assert plog.read(0, 10**9) == b"".join(d for o, d in written if o < base + 2)
    assert plog.read(base + 2, 10**9) == b""
    assert plog.read(base + 4, 10**9) == b"".join(d for o, d in written if o >= base + 4)
    first, _ = append(plog, make_batch(1))
    assert first == end


@pytest.mark.parametrize("how", ["deleted", "truncated", "garbage"])
def test_index_rebuilt_when_damaged(opened: Opened, how: str) -> None:
    """A closed segment whose index files are missing or inconsistent gets them rebuilt by scanning."""
    plog = opened.log
    written = fill(plog, 40, count=2, size=100)
    for i, (base, _) in enumerate(written):  # later timestamps grow, a few go back in time
        assert plog.offset_for_timestamp(1_000 + i) == base
    opened.close()
    first_seg = segment_files(opened.root)[0]
    index, tindex = first_seg.with_suffix(".index"), first_seg.with_suffix(".timeindex")
    original = (index.read_bytes(), tindex.read_bytes())
    if how == "deleted":
        index.unlink()
        tindex.unlink()
    elif how == "truncated":
        index.write_bytes(original[0][:-8])
    else:
        index.write_bytes(b"\x01" * len(original[0]))
    plog = opened.reopen()
    assert (index.read_bytes(), tindex.read_bytes()) == original
    assert plog.read(0, 10**9) == b"".join(d for _, d in written)
    for i, (base, data) in enumerate(written):
        assert plog.read(base + 1, 1) == data
        assert plog.offset_for_timestamp(1_000 + i) == base


def test_empty_dir_and_restart_of_empty_log(opened: Opened) -> None:
    """A new log starts at 0 and an empty log reopens empty."""
    plog = opened.reopen()
    assert (plog.min_offset, plog.max_offset) == (0, 0)
    assert plog.read(0, 100) == b""
    assert plog.offset_for_timestamp(0) == 0


# -- timestamps ------------------------------------------------------------------------------------------


def test_offset_for_timestamp(opened: Opened) -> None:
    """offset_for_timestamp is the first offset of the first batch whose max_timestamp >= ts."""
    plog = opened.log
    stamps = [100, 300, 200, 500, 500, 400, 900, 50, 1000] * 4
    bases = []
    for ts in stamps:
        first, _ = append(plog, make_batch(2, ts=ts, size=150))
        bases.append(first)
    assert plog.segment_count > 1

    def expected(t: int) -> int:
        return next((b for b, s in zip(bases, stamps, strict=True) if s >= t), plog.max_offset)

    for t in [0, 50, 99, 100, 101, 250, 300, 301, 450, 500, 501, 900, 950, 1000, 1001, 10**12]:
        assert plog.offset_for_timestamp(t) == expected(t), t
    plog = opened.reopen()
    for t in [0, 150, 450, 999, 1000, 1001]:
        assert plog.offset_for_timestamp(t) == expected(t), t


# -- retention -------------------------------------------------------------------------------------------


def test_retention_by_size_moves_min_offset(tmp_path: Path) -> None:
    """Size retention deletes the oldest closed segments while the log exceeds retention_bytes."""
    o = Opened(tmp_path, segment_bytes=4096, retention_bytes=9000, fsync="never")
    try:
        plog = o.log
        written = fill(plog, 40, count=2, size=100)
        before = plog.segment_count
        total = plog.size_bytes
        assert total > 9000
        assert o.storage is not None
        o.storage.apply_retention(now_ms=0)
        assert plog.segment_count < before
        assert plog.size_bytes <= 9000 or plog.segment_count == 1
        new_min = plog.min_offset
        assert new_min > 0 and new_min == int(segment_files(tmp_path)[0].stem)
        assert plog.read(new_min - 1, 100) == b""
        assert plog.read(new_min, 10**9) == b"".join(d for b, d in written if b >= new_min)
        assert plog.max_offset == 80
        plog = o.reopen()
        assert plog.min_offset == new_min
    finally:
        o.close()


def test_retention_by_age_keeps_active_segment(tmp_path: Path) -> None:
    """Age retention deletes closed segments whose newest record is too old; never the active one."""
    o = Opened(tmp_path, segment_bytes=4096, retention_ms=1000, fsync="never")
    try:
        plog = o.log
        fill(plog, 40, count=2, size=100)  # timestamps 1000..1039
        assert o.storage is not None
        o.storage.apply_retention(now_ms=1_500)  # nothing older than 500
        assert plog.min_offset == 0
        o.storage.apply_retention(now_ms=2_020)  # newest < 1020 is too old
        assert plog.min_offset > 0
        kept_min = plog.min_offset
        o.storage.apply_retention(now_ms=10**9)  # everything old: only the active segment stays
        assert plog.segment_count == 1
        assert plog.min_offset >= kept_min and plog.max_offset == 80
        assert plog.read(plog.min_offset, 10**9) != b""
        first, _ = append(plog, make_batch(1))
        assert first == 80
    finally:
        o.close()


# -- truncation and replicas -----------------------------------------------------------------------------


def test_truncate_to(opened: Opened) -> None:
    """truncate_to drops the batch holding the offset and all later ones, across segments, durably."""
    plog = opened.log
    written = fill(plog, 40, count=2, size=100)
    segments = plog.segment_count
    plog.truncate_to(500)  # beyond the end: nothing to do
    assert plog.max_offset == 80
    plog.truncate_to(31)  # inside batch 30..31, in the second segment
    assert plog.max_offset == 30
    assert plog.segment_count == 2 < segments
    assert len(segment_files(opened.root)) == 2
    assert plog.read(0, 10**9) == b"".join(d for b, d in written if b < 30)
    assert plog.read(30, 100) == b""
    first, _ = append(plog, make_batch(1, tag=7))
    assert first == 30
    plog = opened.reopen()
    assert plog.max_offset == 31
    assert plog.read(28, 10**6) == written[14][1] + stored(make_batch(1, tag=7), 30)
    plog.truncate_to(24)  # exactly a segment base: that segment is left empty and active
    assert plog.max_offset == 24
    first, _ = append(plog, make_batch(2))
    assert first == 24
    plog.truncate_to(0)
    assert (plog.min_offset, plog.max_offset) == (0, 0)
    plog = opened.reopen()
    assert (plog.min_offset, plog.max_offset) == (0, 0)


def test_truncate_fully_and_start_at(opened: Opened) -> None:
    """A replica behind the master's log start restarts its log empty at the master's start."""
    plog = opened.log
    fill(plog, 10)
    plog.truncate_fully_and_start_at(1_000)
    assert (plog.min_offset, plog.max_offset) == (1_000, 1_000)
    b = stored(make_batch(2), 1_000)
    plog.append_replica(b, fmt.validate(b))
    plog = opened.reopen()
    assert (plog.min_offset, plog.max_offset) == (1_000, 1_002)
    assert plog.read(1_000, 100) == b
    assert len(segment_files(opened.root)) == 1


def test_append_replica_keeps_offsets_and_checks_continuity(opened: Opened) -> None:
    """append_replica writes bytes verbatim and refuses batches that do not continue the log."""
    plog = opened.log
    b0 = stored(make_batch(3), 0)
    b1 = stored(make_batch(2, tag=1), 3)
    data = b0 + b1
    plog.append_replica(data, fmt.validate(data))
    assert plog.read(0, 10**6) == data
    assert plog.max_offset == 5
    for bad in (stored(make_batch(1), 4), stored(make_batch(1), 6)):
        with pytest.raises(StorageError) as e:
            plog.append_replica(bad, fmt.validate(bad))
        assert e.value.retriable is False
    gap = stored(make_batch(1), 5) + stored(make_batch(1), 7)
    with pytest.raises(StorageError):
        plog.append_replica(gap, fmt.validate(gap))
    assert plog.max_offset == 5 and plog.read(0, 10**6) == data


def test_append_replica_splits_a_large_answer_at_segment_boundaries(tmp_path: Path) -> None:
    """A catch-up answer worth many segments lands in many segments, as on the master, so size
    retention on a slave can delete them (one oversized active segment would never be deleted)."""
    o = Opened(tmp_path, segment_bytes=4096, retention_bytes=9000, fsync="always")
    try:
        plog = o.log
        batches, offset = [], 0
        for i in range(40):
            batches.append(stored(make_batch(2, size=400, tag=i), offset))
            offset += 2
        data = b"".join(batches)
        plog.append_replica(data, fmt.validate(data))
        sizes = [p.stat().st_size for p in segment_files(o.root)]
        assert len(sizes) > 5 and max(sizes) <= 4096 and sum(sizes) == len(data)
        assert plog.read(0, 10**6)[: len(batches[0])] == batches[0]
        assert o.storage is not None
        o.storage.apply_retention(now_ms=10**13)
        assert plog.min_offset > 0 and plog.size_bytes <= 9000 + 4096
        start = plog.min_offset
        plog = o.reopen()
        assert (plog.min_offset, plog.max_offset) == (start, 80)
        assert plog.read(78, 10**6) == batches[-1]
    finally:
        o.close()


# -- property ------------------------------------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5), st.integers(0, 600)),
        st.tuples(st.just("restart"), st.just(0), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 200), st.integers(0, 6000)),
        st.tuples(st.just("truncate"), st.integers(0, 200), st.just(0)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
def test_random_append_restart_read(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]
) -> None:
    """Any sequence of appends, truncations, restarts and reads reads back exactly what was appended
    (and not truncated), with dense offsets."""
    o = Opened(tmp_path_factory.mktemp("prop"), segment_bytes=4096, fsync="never")
    model: list[tuple[int, bytes]] = []  # (base offset, stored bytes)
    try:
        for i, (op, a, b) in enumerate(ops):
            plog = o.log
            if op == "append":
                batch = make_batch(a, ts=i, size=b, tag=i)
                first, last = append(plog, batch)
                expect_first = model[-1][0] + fmt.read_header(model[-1][1]).count if model else 0
                assert (first, last) == (expect_first, expect_first + a - 1)
                model.append((first, stored(batch, first)))
            elif op == "restart":
                o.reopen()
            elif op == "truncate":
                plog.truncate_to(a)
                model = [(base, d) for base, d in model if base + fmt.read_header(d).count <= a]
                end = model[-1][0] + fmt.read_header(model[-1][1]).count if model else 0
                assert plog.max_offset == end
            else:
                end = model[-1][0] + fmt.read_header(model[-1][1]).count if model else 0
                got = plog.read(a, b)
                if a >= end:
                    assert got == b""
                    continue
                k = max(j for j, (base, _) in enumerate(model) if base <= a)
                infos = fmt.validate(got)
                assert len(infos) >= 1 and len(got) <= max(b, len(model[k][1]))
                assert got == b"".join(d for _, d in model[k : k + len(infos)])
        plog = o.reopen()
        assert plog.read(0, 10**9) == b"".join(d for _, d in model)
    finally:
        o.close()


def test_bad_partition_names_are_refused(tmp_path: Path) -> None:
    """A partition name that would escape the logs dir is a clear error."""
    s = Storage(tmp_path, StorageConfig())
    try:
        with pytest.raises(StorageError):
            s.open([("../x", 0)])
        with pytest.raises(StorageError):
            s.open([("t", -1)])
    finally:
        s.close()
    assert not os.path.exists(tmp_path / "x-0")
