"""Fetch read plans (PartitionLog.plan_read / read_into): the byte ranges the broker's fetch reads
straight into its answer buffer. Unit tests on real segment files; no server."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.broker.storage import PartitionLog, StorageError
from mqd.config import StorageConfig
from mqd.wire import format as fmt


def _log(root: Path, counts: list[int], segment_bytes: int) -> PartitionLog:
    config = StorageConfig(segment_bytes=segment_bytes, fsync="never")
    plog = PartitionLog("events", 0, root / "events-0", config)
    plog.open()
    for i, n in enumerate(counts):
        batch = fmt.encode_batch([bytes([i % 256]) * (8 + 40 * (i % 5))] * n)
        plog.append(batch, fmt.validate(batch))
    return plog


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=25),
    segment_bytes=st.sampled_from([4096, 8192, 1 << 20]),
    where=st.floats(min_value=0, max_value=0.999),
    max_bytes=st.integers(min_value=1, max_value=8000),
)
def test_plan_reads_the_same_bytes_as_read(
    counts: list[int], segment_bytes: int, where: float, max_bytes: int
) -> None:
    """For any log (batches across segments), offset and byte budget, reading the plan gives exactly
    what read() gives: whole batches from the one holding the offset, within the budget unless the
    first batch alone is larger; next_offset is the offset after the last batch returned."""
    with tempfile.TemporaryDirectory() as tmp:
        plog = _log(Path(tmp), counts, segment_bytes)
        try:
            offset = int(where * plog.max_offset)
            plan = plog.plan_read(offset, max_bytes)
            assert plan is not None
            buf = bytearray(plan.size)
            plog.read_into(plan, memoryview(buf))
            assert bytes(buf) == plog.read(offset, max_bytes)
            infos = fmt.scan(buf)
            assert infos[0].base_offset <= offset < infos[0].next_offset
            assert plan.next_offset == infos[-1].next_offset
            assert len(infos) == 1 or plan.size <= max_bytes
        finally:
            plog.close()


def test_plan_outside_the_log_and_wrong_buffer(tmp_path: Path) -> None:
    """No plan outside [min_offset, max_offset); a buffer of the wrong size is refused, not filled
    partly; a closed log refuses to read a plan."""
    plog = _log(tmp_path, [3, 2], 1 << 20)
    assert plog.plan_read(plog.max_offset, 100) is None
    plan = plog.plan_read(0, 1 << 20)
    assert plan is not None and plan.next_offset == 5
    with pytest.raises(ValueError, match="buffer holds"):
        plog.read_into(plan, memoryview(bytearray(plan.size - 1)))
    plog.close()
    with pytest.raises(StorageError, match="closed"):
        plog.read_into(plan, memoryview(bytearray(plan.size)))


def test_plan_spans_segments(tmp_path: Path) -> None:
    """A budget larger than a segment gives one contiguous range per segment, in log order, and
    the bytes read are every batch from the offset on, dense offsets included."""
    plog = _log(tmp_path, [6] * 30, 4096)
    try:
        assert plog.segment_count > 2
        plan = plog.plan_read(1, 1 << 20)
        assert plan is not None and len(plan.ranges) == plog.segment_count
        buf = bytearray(plan.size)
        plog.read_into(plan, memoryview(buf))
        infos = fmt.scan(buf)
        assert [i.base_offset for i in infos] == list(range(0, 180, 6))
        assert plan.next_offset == plog.max_offset == 180
    finally:
        plog.close()
