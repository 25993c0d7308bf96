"""The publisher: one partition's drained records published as a series of files through a store.

Blocking code: it runs on the sink's worker threads (or in tools), never on the event loop. It
knows nothing of where files land: it cuts the records into files (one per run of records in one
hour of event time, at most ``max_records`` each) and publishes each through the store's two
steps (store.py): ``stage`` without a lock, then ``commit`` conditional on the previous end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from mqd.landing import layout
from mqd.landing.layout import FileRange, LandingError
from mqd.landing.store import LandingStore, PublishConflict


@dataclass(slots=True)
class PublishOutcome:
    """What ``publish_records`` did with one partition's records."""

    published: list[FileRange] = field(default_factory=list)
    remaining: list[pa.RecordBatch] = field(default_factory=list)  # not published (error)
    conflict: PublishConflict | None = None
    error: LandingError | None = None

    @property
    def last_offset(self) -> int | None:
        return self.published[-1].last_offset if self.published else None


def file_range(topic: str, partition: int, records: pa.Table) -> FileRange:
    """The range (and final name) of a file of ``records`` (RECORD_SCHEMA, one hour, ascending)."""
    first, last, count, ts_min, ts_max = layout.describe(topic, partition, records)
    hour = int(layout.folder_hours(np.array([ts_min], dtype=np.int64))[0])
    path = f"{layout.hour_dir(topic, hour)}/{layout.file_name(partition, first)}"
    return FileRange(path, topic, partition, first, last, count, ts_min, ts_max)


class Publisher:
    """Publishes partitions' records into one store. Thread-compatible: the store's commit
    serialises publishers of one partition."""

    def __init__(self, store: LandingStore, *, compression: str = "snappy") -> None:
        self.store = store
        self.compression = compression

    def publish(self, topic: str, partition: int, records: pa.Table, expected_last: int | None) -> FileRange:
        """Publish ``records`` (RECORD_SCHEMA, one hour, ascending offsets) as one file.

        Raises PublishConflict when the partition's last published offset is not
        ``expected_last`` (None: the publisher expects nothing published yet), LandingError when
        the store cannot be written.
        """
        rng = file_range(topic, partition, records)
        staged = self.store.stage(layout.landing_table(topic, partition, records), rng, self.compression)
        try:
            return self.store.commit(staged, expected_last)
        finally:
            self.store.discard(staged)  # committed: already gone from the staging name

    def publish_records(
        self,
        topic: str,
        partition: int,
        batches: list[pa.RecordBatch],
        expected_last: int | None,
        max_records: int | None = None,
    ) -> PublishOutcome:
        """Publish drained batches of one partition: one file per run of records in one hour, cut
        into files of at most ``max_records`` records.

        Never raises for conflicts or disk errors: the outcome says what was published and what
        is left, so the caller keeps the rest buffered (disk) or drops it (conflict).
        """
        out = PublishOutcome()
        table = layout.concat(batches)
        step = max_records or table.num_rows or 1
        pieces = [
            (start + i, min(step, length - i))
            for _hour, start, length in layout.hour_runs(table)
            for i in range(0, length, step)
        ]
        for start, length in pieces:
            try:
                rng = self.publish(topic, partition, table.slice(start, length), expected_last)
            except PublishConflict as exc:
                out.conflict = exc
                return out
            except LandingError as exc:
                out.error = exc
                out.remaining = table.slice(start).to_batches()
                return out
            out.published.append(rng)
            expected_last = rng.last_offset
        return out
