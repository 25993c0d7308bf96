"""Micro-batches: the landing's per-partition buffers of drained records, and when to cut them.

Loop-side and synchronous (no I/O, no asyncio). A micro-batch is cut at ``max_records``,
``max_bytes`` or ``max_age`` of wall clock, whichever comes first; and the sink as a whole holds
at most ``max_bytes`` (publications in flight included), so when it is full the biggest buffers
are cut too; under the consumer's memory pressure (``biggest``) the biggest buffers holding enough
bytes are cut, not all of them. Partitions with a publication registered (*busy*, known to the
sink) are not cut: records drained meanwhile join their next micro-batch.

Latency: a buffer's age counts from the fetch of its first record (``FetchedBatch.fetched_at``;
producer clocks are not trusted), and an age cut happens ``publish_lead`` before ``max_age``: an
estimate of how long a publication takes from the moment it is due until the file is visible
(smoothed mean plus four mean deviations, like TCP's retransmit timer), so a record becomes
visible close to ``max_age`` after it was fetched instead of ``max_age`` plus the publication.

It also remembers, per partition, the last (incarnation, offset) known to be published
(``expected``): records of that incarnation at or below it (a replay after a seek or a reset) are
cut off on ``add`` (the sink counts and logs them). Records of another known incarnation of the
log are new records even where their offsets repeat (the log was replaced or truncated and written
again): they are kept, and a micro-batch then holds runs of two incarnations, published in order
as separate files. An unknown incarnation (None, on either side) assumes no reuse.
"""

from __future__ import annotations

import time
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from mqd.config import LandingConfig

_EST_GAIN = 0.125  # weight of a new sample in the publish-time estimate (TCP's SRTT gain)
_DEV_GAIN = 0.25  # weight of a new sample in its mean deviation (TCP's RTTVAR gain)

TP = tuple[str, int]  # mqd.consumer.TopicPartition is a NamedTuple of these


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
    @property
    def fetched_at(self) -> float: ...
    @property
    def incarnation(self) -> str | None: ...


@dataclass(slots=True)
class MicroBatch:
    """One partition's buffered records, taken whole by a publication."""

    batches: list[pa.RecordBatch] = field(default_factory=list)
    incarnations: list[str | None] = field(default_factory=list)  # the log incarnation of each batch
    # per incarnation, the source's leader epoch of its newest record (FileRange.leader_epoch)
    leader_epochs: dict[str | None, int] = field(default_factory=dict)
    records: int = 0
    nbytes: int = 0
    next_offset: int = -1  # offset after the last buffered record
    since: float = 0.0  # monotonic time the first record of this micro-batch was fetched


def _same_log(a: str | None, b: str | None) -> bool:
    """Offsets of incarnations ``a`` and ``b`` may be the same records: the same incarnation, or
    one unknown (no reuse assumed)."""
    return a is None or b is None or a == b


class MicroBatches:
    """Per-partition buffers and the cut policy. See the module docstring."""

    def __init__(self, config: LandingConfig) -> None:
        self.config = config
        self._buffers: dict[TP, MicroBatch] = {}
        self._expected: dict[TP, int | None] = {}
        self._expected_inc: dict[TP, str | None] = {}
        self.inflight_bytes = 0  # bytes of micro-batches taken and being published (kept by the sink)
        self._publish_est: float | None = None  # smoothed due-to-visible time of a publication (s)
        self._publish_dev = 0.0  # its smoothed mean deviation

    # -- positions -------------------------------------------------------------------------------

    def expected(self, tp: TP) -> int | None:
        """The last offset known to be published (None: nothing, or not known)."""
        return self._expected.get(tp)

    def expected_incarnation(self, tp: TP) -> str | None:
        """The log incarnation of ``expected(tp)`` (None: unknown)."""
        return self._expected_inc.get(tp)

    def set_expected(self, tp: TP, last: int | None, incarnation: str | None = None) -> None:
        self._expected[tp] = last
        self._expected_inc[tp] = incarnation

    def forget_expected(self, tp: TP) -> None:
        self._expected.pop(tp, None)
        self._expected_inc.pop(tp, None)

    # -- buffers ---------------------------------------------------------------------------------

    def add(self, batch: Drained, now: float | None = None) -> int:
        """Buffer a drained batch; records of its incarnation already published or buffered are
        cut off. Returns the number of records kept. A new micro-batch's age counts from ``now``
        when given, else from the batch's fetch time."""
        rb = batch.records
        if rb.num_rows == 0:
            return 0
        tp: TP = (batch.tp[0], batch.tp[1])
        inc = batch.incarnation
        buf = self._buffers.get(tp)
        floor = -1
        landed = self._expected.get(tp)
        if landed is not None and _same_log(self._expected_inc.get(tp), inc):
            floor = landed
        if buf is not None and buf.batches and _same_log(buf.incarnations[-1], inc):
            floor = max(floor, buf.next_offset - 1)
        if batch.first_offset <= floor:
            if batch.next_offset - 1 <= floor:
                return 0
            offsets = rb.column(0).to_numpy()
            rb = rb.slice(int(np.searchsorted(offsets, floor, side="right")))
            if rb.num_rows == 0:
                return 0
        if buf is None:
            buf = self._buffers[tp] = MicroBatch(since=batch.fetched_at if now is None else now)
        buf.batches.append(rb)
        buf.incarnations.append(inc)
        epoch = getattr(batch, "leader_epoch", None)  # optional: only sources with leader epochs
        if epoch is not None:
            buf.leader_epochs[inc] = int(epoch)
        buf.records += rb.num_rows
        buf.nbytes += batch.nbytes if rb.num_rows == len(batch.records) else rb.nbytes
        buf.next_offset = int(rb.column(0)[-1].as_py()) + 1
        return int(rb.num_rows)

    def take(self, tp: TP) -> MicroBatch | None:
        """Remove and return ``tp``'s micro-batch (None when nothing is buffered)."""
        buf = self._buffers.pop(tp, None)
        return buf if buf is not None and buf.batches else None

    def drop(self, tp: TP) -> int:
        """Forget the partition's buffered records; returns how many."""
        buf = self._buffers.pop(tp, None)
        return 0 if buf is None else buf.records

    def restore(
        self,
        tp: TP,
        batches: list[pa.RecordBatch],
        since: float,
        incarnations: list[str | None] | None = None,
        leader_epochs: dict[str | None, int] | None = None,
    ) -> None:
        """Put back records a failed publication did not publish (``incarnations``: one per batch,
        default unknown; ``leader_epochs``: MicroBatch.leader_epochs), ahead of anything added
        meanwhile."""
        if not batches:
            return
        incs = incarnations if incarnations is not None else [None] * len(batches)
        newer = self._buffers.pop(tp, None)
        buf = MicroBatch(
            since=since, leader_epochs={**(leader_epochs or {}), **(newer.leader_epochs if newer else {})}
        )
        for rb, inc in zip(
            batches + (newer.batches if newer else []),
            incs + (newer.incarnations if newer else []),
            strict=True,
        ):
            buf.batches.append(rb)
            buf.incarnations.append(inc)
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

    @property
    def pending_partitions(self) -> int:
        return len(self._buffers)

    def pending(self) -> dict[TP, int]:
        return {tp: b.records for tp, b in self._buffers.items()}

    # -- the cut policy --------------------------------------------------------------------------

    @property
    def publish_lead(self) -> float:
        """How long before max_age an age cut happens: the publish-time estimate, at most half of
        max_age (a slow disk must not turn every micro-batch into a tiny file)."""
        if self._publish_est is None:
            return 0.0
        return min(self._publish_est + 4 * self._publish_dev, self.config.max_age / 2)

    def observe_publish(self, seconds: float) -> None:
        """One publication took ``seconds`` from due to visible."""
        if self._publish_est is None:
            self._publish_est, self._publish_dev = seconds, seconds / 2
            return
        err = seconds - self._publish_est
        self._publish_est += _EST_GAIN * err
        self._publish_dev += _DEV_GAIN * (abs(err) - self._publish_dev)

    def due(self, busy: Container[TP], now: float | None = None) -> list[TP]:
        """Partitions whose micro-batch is to be cut now (``busy`` ones excepted)."""
        now = time.monotonic() if now is None else now
        cfg = self.config
        age = cfg.max_age - self.publish_lead
        idle = [(tp, b) for tp, b in self._buffers.items() if tp not in busy]
        out = [
            tp
            for tp, b in idle
            if b.records >= cfg.max_records or b.nbytes >= cfg.max_bytes or now - b.since >= age
        ]
        # the sink holds at most max_bytes (plus a batch), publications in flight included: cut
        # the biggest buffers that can be cut. Busy ones count too: a partition being published
        # refills meanwhile, and if only the idle ones counted, a full sink would wait for that
        # publication instead of starting the next one on a free worker.
        total = self.pending_bytes + self.inflight_bytes
        if total >= cfg.max_bytes:
            for tp, b in sorted(idle, key=lambda kv: -kv[1].nbytes):
                if total < cfg.max_bytes:
                    break
                if tp not in out:
                    out.append(tp)
                total -= b.nbytes
        return out

    def biggest(self, busy: Container[TP], need: int) -> list[TP]:
        """The biggest buffers that are not busy, biggest first, enough to hold ``need`` bytes
        together (all of them when they hold less). Under memory pressure these are cut, not every
        buffer: the rest keep growing towards max_bytes instead of landing as small files. An answer
        body is freed once all its partitions are published, so the caller cuts again while the
        pressure lasts."""
        out: list[TP] = []
        got = 0
        for tp, b in sorted(self._buffers.items(), key=lambda kv: -kv[1].nbytes):
            if got >= need:
                break
            if tp in busy or not b.batches:
                continue
            out.append(tp)
            got += b.nbytes
        return out

    def next_due_in(self, busy: Container[TP], now: float | None = None) -> float | None:
        """Seconds until the oldest buffer that is not busy reaches its age cut (None when there
        is no such buffer)."""
        idle = [b.since for tp, b in self._buffers.items() if tp not in busy]
        if not idle:
            return None
        now = time.monotonic() if now is None else now
        return max(0.0, min(idle) + self.config.max_age - self.publish_lead - now)
