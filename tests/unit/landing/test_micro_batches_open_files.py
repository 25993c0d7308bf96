"""The cut policy with open files (issue 16: row groups streamed into a partition's open file): a
buffer is cut as a row group at the row-group size, an open file is finished by the age of its
first record even with nothing buffered, and the open file's records count as unpublished (the
watermark must not pass them) but not as memory."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from mqd.config import LandingConfig
from mqd.landing import micro_batches
from mqd.landing.micro_batches import FileProgress, MicroBatches


class Batch:
    """A drained batch as the sink sees it (the fields of mqd.consumer.FetchedBatch it reads)."""

    def __init__(self, first: int, count: int, nbytes: int, at: float) -> None:
        self.tp = ("t", 0)
        self.records = pa.RecordBatch.from_pydict(
            {"offset": pa.array(range(first, first + count), pa.int64())}
        )
        self.first_offset = first
        self.next_offset = first + count
        self.nbytes = nbytes
        self.fetched_at = at
        self.incarnation: str | None = None


def test_open_file_age_row_groups_and_pending() -> None:
    """An open file alone is due once its first record is max_age old, and next_due_in counts it;
    a buffer reaching the row-group size is due at once; pending() and pending_records include
    the open file, pending_bytes only the buffers; drop() forgets both."""
    mb = MicroBatches(LandingConfig(dir=Path("unused"), max_bytes=1000, max_age=10.0, max_records=10**6))
    tp = ("t", 0)
    mb.files[tp] = FileProgress(records=50, nbytes=600, since=100.0)
    assert mb.due(set(), now=105.0) == []
    assert mb.next_due_in(set(), now=105.0) == pytest.approx(5.0)
    assert mb.due(set(), now=110.0) == [tp] and mb.age_due(tp, now=110.0)
    assert mb.pending() == {tp: 50} and mb.pending_records == 50 and mb.pending_bytes == 0
    mb.add(Batch(50, 5, nbytes=300, at=108.0))
    assert mb.due(set(), now=105.0) == []  # 600 + 300 < max_bytes, and under the row-group size
    mb.add(Batch(55, 5, nbytes=700, at=108.5))
    assert mb.due(set(), now=105.0) == [tp]  # a row group's worth (min(8 MiB, max_bytes))
    assert not mb.age_due(tp, now=105.0)  # cut as a row group: the file stays open
    assert mb.pending() == {tp: 60} and mb.pending_bytes == 1000
    assert mb.due({tp}, now=110.0) == [] and mb.next_due_in({tp}) is None
    assert mb.drop(tp) == 60 and mb.pending() == {}


def test_past_the_open_file_limit_the_oldest_are_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """More open files than MAX_OPEN_FILES (each holds a file descriptor): the oldest are due and
    finished as if by age, the rest stay open."""
    monkeypatch.setattr(micro_batches, "MAX_OPEN_FILES", 2)
    mb = MicroBatches(LandingConfig(dir=Path("unused"), max_age=60.0))
    for p, since in enumerate([30.0, 10.0, 20.0, 40.0]):
        mb.files[("t", p)] = FileProgress(records=1, nbytes=1, since=since)
    assert sorted(mb.due(set(), now=50.0)) == [("t", 1), ("t", 2)]
    assert mb.age_due(("t", 1), now=50.0) and not mb.age_due(("t", 0), now=50.0)
