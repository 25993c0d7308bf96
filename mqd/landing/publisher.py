"""The publisher: one partition's drained records published as a series of files through a store.

Blocking code: it runs on the sink's worker threads (or in tools), never on the event loop. It
knows nothing of where files land: it cuts the records into files (one per run of records of one
log incarnation in one hour of event time, at most ``max_records`` each) and publishes each
through the store's two steps (store.py): ``stage`` without a lock, then ``commit`` conditional
on the previous end.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    remaining_incarnations: list[str | None] = field(default_factory=list)  # one per remaining batch
    conflict: PublishConflict | None = None
    error: LandingError | None = None

    @property
    def last_offset(self) -> int | None:
        return self.published[-1].last_offset if self.published else None


def file_range(
    topic: str,
    partition: int,
    records: pa.Table,
    incarnation: str | None = None,
    leader_epoch: int | None = None,
) -> FileRange:
    """The range (and final name) of a file of ``records`` (RECORD_SCHEMA, one hour, ascending)
    of the log incarnation ``incarnation`` (``leader_epoch``: FileRange.leader_epoch)."""
    first, last, count, ts_min, ts_max = layout.describe(topic, partition, records)
    hour = int(layout.folder_hours(np.array([ts_min], dtype=np.int64))[0])
    path = f"{layout.hour_dir(topic, hour)}/{layout.file_name(partition, first, incarnation)}"
    return FileRange(
        path,
        topic,
        partition,
        first,
        last,
        count,
        ts_min,
        ts_max,
        incarnation=incarnation,
        leader_epoch=leader_epoch,
    )


def incarnation_runs(incarnations: list[str | None]) -> list[tuple[str | None, int, int]]:
    """Runs of consecutive batches of one incarnation: ``[(incarnation, start, stop), ...]``."""
    runs: list[tuple[str | None, int, int]] = []
    start = 0
    for i in range(1, len(incarnations) + 1):
        if i == len(incarnations) or incarnations[i] != incarnations[start]:
            runs.append((incarnations[start], start, i))
            start = i
    return runs


class Publisher:
    """Publishes partitions' records into one store. Thread-compatible: the store's commit
    serialises publishers of one partition."""

    def __init__(self, store: LandingStore, *, compression: str = "snappy") -> None:
        self.store = store
        self.compression = compression

    def publish(
        self,
        topic: str,
        partition: int,
        records: pa.Table,
        expected_last: int | None,
        *,
        incarnation: str | None = None,
        expected_incarnation: str | None = None,
        leader_epoch: int | None = None,
    ) -> FileRange:
        """Publish ``records`` (RECORD_SCHEMA, one hour, ascending offsets, of the log incarnation
        ``incarnation``) as one file.

        Raises PublishConflict when the partition's last published (incarnation, offset) is not
        (``expected_incarnation``, ``expected_last``) (None: the publisher expects nothing
        published yet), LandingError when the store cannot be written.
        """
        rng = file_range(topic, partition, records, incarnation, leader_epoch)
        table = layout.landing_table(topic, partition, records, incarnation)
        staged = self.store.stage(table, rng, self.compression)
        try:
            return self.store.commit(staged, expected_last, expected_incarnation)
        finally:
            self.store.discard(staged)  # committed: already gone from the staging name

    def publish_records(
        self,
        topic: str,
        partition: int,
        batches: list[pa.RecordBatch],
        expected_last: int | None,
        max_records: int | None = None,
        *,
        incarnations: list[str | None] | None = None,
        expected_incarnation: str | None = None,
        leader_epochs: Mapping[str | None, int] | None = None,
    ) -> PublishOutcome:
        """Publish drained batches of one partition: one file per run of records of one log
        incarnation (``incarnations``, one per batch; default all None) in one hour, cut into
        files of at most ``max_records`` records. ``leader_epochs``: per incarnation, the source's
        leader epoch of its newest record (MicroBatch.leader_epochs), stamped on each of its files.

        Never raises for conflicts or disk errors: the outcome says what was published and what
        is left, so the caller keeps the rest buffered (disk) or drops it (conflict).
        """
        out = PublishOutcome()
        incs: list[str | None] = list(incarnations) if incarnations is not None else [None] * len(batches)
        if len(incs) != len(batches):
            raise ValueError(f"{len(batches)} batches but {len(incs)} incarnations")
        for run_no, (inc, lo, hi) in enumerate(incarnation_runs(incs)):
            table = layout.concat(batches[lo:hi])
            step = max_records or table.num_rows or 1
            pieces = [
                (start + i, min(step, length - i))
                for _hour, start, length in layout.hour_runs(table)
                for i in range(0, length, step)
            ]
            for start, length in pieces:
                try:
                    rng = self.publish(
                        topic,
                        partition,
                        table.slice(start, length),
                        expected_last,
                        incarnation=inc,
                        expected_incarnation=expected_incarnation,
                        leader_epoch=(leader_epochs or {}).get(inc),
                    )
                except PublishConflict as exc:
                    out.conflict = exc
                    return out
                except LandingError as exc:
                    out.error = exc
                    rest = table.slice(start).to_batches()
                    later = [
                        i for _inc, lo2, hi2 in incarnation_runs(incs)[run_no + 1 :] for i in range(lo2, hi2)
                    ]
                    out.remaining = rest + [batches[i] for i in later]
                    out.remaining_incarnations = [inc] * len(rest) + [incs[i] for i in later]
                    return out
                out.published.append(rng)
                expected_last, expected_incarnation = rng.last_offset, rng.incarnation
        return out
