"""SubscriptionState: the one state shared by the rebalance service, the fetchers and the drain.

Modelled on aiokafka's SubscriptionState: the rebalance service assigns and revokes partitions, the
node fetchers read and advance positions, the caller drains process queues. Nothing here does I/O,
and everything runs on the consumer's event loop, so no locks are needed.

Every assignment and every seek gets a fresh *assignment epoch* (unique in the process). A fetch
records the epoch it was sent with; its answer is applied only when the partition still has that
epoch, so a pause, seek or revoke racing with an in-flight fetch can never move a position or
deliver data that belongs to the previous owner.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable

from mqd.consumer.budget import ByteBudget
from mqd.consumer.errors import NotAssignedError
from mqd.consumer.incarnation_lineage import Lineage
from mqd.consumer.process_queue import FetchedBatch, FlowLimits, ProcessQueue
from mqd.consumer.source import LandedEpoch
from mqd.topic_partition import TopicPartition


class OwnedPartition:
    """Everything the consumer knows about one partition it owns (its fetch state)."""

    __slots__ = (
        "_last_error",
        "corrupt_answers",
        "epoch",
        "errors",
        "in_flight",
        "incarnation",
        "incarnation_changes",
        "landed",
        "last_error_at",
        "lineage",
        "log_end",
        "log_start",
        "lost_offsets",
        "parked",
        "paused",
        "position",
        "probe_parked",
        "pull_node",
        "queue",
        "resetting",
        "retry_at",
        "reused_offsets",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        epoch: int,
        position: int,
        pull_node: str | None,
        incarnation: str | None = None,
        landed: LandedEpoch | None = None,
    ) -> None:
        self.tp = tp
        self.landed = landed  # the last landed record's leader epoch at assignment (Kafka sources)
        self.epoch = epoch
        self.position = position  # next offset to fetch
        # the log incarnation ``position`` belongs to (None: not known yet; the first answer's is
        # adopted without assuming any reuse)
        self.incarnation = incarnation
        # the incarnations fetched under before ``incarnation`` (mqd/consumer/incarnation_lineage.py)
        self.lineage: Lineage = ()
        self.incarnation_changes = 0  # seen since assigned (status)
        self.reused_offsets = 0  # offsets landed under an old incarnation that a new one reused
        self.lost_offsets = 0  # offsets the source reported lost for good (DATA_LOST)
        self.pull_node = pull_node
        self.paused = False
        self.in_flight = False  # part of a fetch whose answer has not been handled yet
        self.resetting = False  # an offset lookup (on_offset_reset earliest/latest) is running
        self.queue = ProcessQueue()
        self.retry_at = 0.0  # monotonic time before which an error backs it off
        self.errors = 0  # consecutive failed fetches of this partition
        self.corrupt_answers = 0  # consecutive answers with undecodable data
        self.log_start: int | None = None  # from the last answer
        self.log_end: int | None = None
        self._last_error: str | None = None
        self.last_error_at: float | None = None  # monotonic time it was last set (the views' age)
        self.parked: str | None = None  # why it is not fetched any more (policy fail, corrupt data)
        # parked on undecodable data: still fetched once per error_backoff_max, since the damage
        # may be on the path (a proxy, a NIC) and not on the broker's disk; a clean answer unparks it
        self.probe_parked = False

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @last_error.setter
    def last_error(self, message: str | None) -> None:
        # stamped on every set, also with the same text: the age says how recent the error is
        self._last_error = message
        self.last_error_at = None if message is None else time.monotonic()


# epochs are unique in the process, so a batch from one Consumer instance can never pass the
# ownership check of another
_epochs = itertools.count(1)


class SubscriptionState:
    """The owned partitions and their buffered data. Positions move here (assign, seek, append) and
    in the fetch callback (offset resets)."""

    def __init__(self, limits: FlowLimits, budget: ByteBudget) -> None:
        self.limits = limits
        self.budget = budget
        self.partitions: dict[TopicPartition, OwnedPartition] = {}
        self.buffered_records = 0
        self._drain_start = 0  # rotates so one busy partition cannot starve the others
        self.data_ready = asyncio.Event()
        # called with the pull node of every partition that may have become fetchable
        self.on_fetchable: Callable[[str | None], None] = lambda node: None
        budget.on_freed = lambda: self.on_fetchable(None)

    # -- assignment ------------------------------------------------------------------------------

    def assign(
        self,
        tp: TopicPartition,
        position: int,
        pull_node: str | None,
        incarnation: str | None = None,
        landed: LandedEpoch | None = None,
    ) -> OwnedPartition:
        if position < 0:
            raise ValueError(f"{tp}: start position {position} is negative")
        if tp in self.partitions:
            raise ValueError(f"{tp} is already assigned")
        op = OwnedPartition(tp, next(_epochs), position, pull_node, incarnation, landed)
        self.partitions[tp] = op
        self.on_fetchable(pull_node)
        return op

    def drop(self, tp: TopicPartition) -> OwnedPartition | None:
        """Revoke: mark dropped, discard buffered data; an in-flight answer is discarded on arrival."""
        op = self.partitions.pop(tp, None)
        if op is not None:
            op.queue.dropped = True
            self._discard(op)
        return op

    def clear(self) -> None:
        for tp in list(self.partitions):
            self.drop(tp)

    def get(self, tp: TopicPartition) -> OwnedPartition:
        op = self.partitions.get(tp)
        if op is None:
            raise NotAssignedError(tp)
        return op

    def seek(self, tp: TopicPartition, offset: int, incarnation: str | None = None) -> None:
        """Fetch from ``offset`` next (of ``incarnation``; None keeps the partition's)."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"{tp}: cannot seek to {offset!r}: offsets are integers >= 0")
        op = self.get(tp)
        op.epoch = next(_epochs)
        self._discard(op)
        op.position = offset
        if incarnation is not None:
            op.incarnation = incarnation
        op.parked = None
        op.probe_parked = False
        op.last_error = None
        op.errors = op.corrupt_answers = 0
        op.retry_at = op.queue.flow_until = 0.0
        op.resetting = False
        self.on_fetchable(op.pull_node)

    def set_paused(self, tps: Iterable[TopicPartition], paused: bool) -> None:
        for tp in tps:
            op = self.get(tp)
            if op.paused != paused:
                op.paused = paused
                if not paused:
                    self.on_fetchable(op.pull_node)

    def is_current(self, op: OwnedPartition, epoch: int) -> bool:
        """``op`` is still owned with assignment epoch ``epoch`` (no revoke or seek since)."""
        return self.partitions.get(op.tp) is op and op.epoch == epoch

    def no_news(self, op: OwnedPartition, epoch: int) -> None:
        """A fetch answer left ``op`` out: the source had nothing new at the offset asked for
        (docs/protocol.md, ``changes_only``). Still owned, nothing moves; like an answer at the log
        end it ends an error streak. Revoked, seeked or paused since the request: nothing to do."""
        if self.partitions.get(op.tp) is not op or op.epoch != epoch or op.paused:
            return
        if op.errors:
            op.errors = 0
        if op.parked is None and op.last_error is not None:
            op.last_error = None  # answered: an earlier fetch error is stale

    def caught_up(self) -> bool:
        """Every owned partition (parked ones excepted) is fetched up to its log end and nothing is
        buffered. A position past the log end is not caught up: the log was cut under it (a Kafka
        unclean election, a replaced topic) or the end is an older answer's, and the next fetch says
        which. A burst that took it as the end exited before landing the new log's records."""
        if self.buffered_records:
            return False
        for op in self.partitions.values():
            if op.parked:
                continue
            if op.log_end is None or op.position != op.log_end:
                return False
        return True

    def partition_caught_up(self, tp: TopicPartition) -> bool:
        """``tp`` is owned, not parked, fetched up to its log end, and none of its records is
        buffered (``caught_up`` for one partition)."""
        op = self.partitions.get(tp)
        return (
            op is not None
            and not op.parked
            and op.log_end is not None
            and op.position == op.log_end
            and not op.queue.records
        )

    # -- buffering -------------------------------------------------------------------------------

    def _discard(self, op: OwnedPartition) -> None:
        records, nbytes = op.queue.clear()
        if records or nbytes:
            self.buffered_records -= records
            self.budget.take_buffered(nbytes)
            if not self.buffered_records:
                self.data_ready.clear()
            self.budget.freed()  # any node may fetch again

    def append(self, op: OwnedPartition, batch: FetchedBatch, same_answer: bool = False) -> None:
        op.queue.append(batch, same_answer)
        op.position = batch.next_offset
        self.buffered_records += batch.next_offset - batch.first_offset
        self.budget.add_buffered(batch.nbytes)
        self.data_ready.set()

    def drain(self, max_bytes: int | None = None) -> list[FetchedBatch]:
        """Take buffered batches (at least one when any is there), oldest first per partition."""
        if not self.budget.buffered and not self.buffered_records:
            self.data_ready.clear()
            return []
        out: list[FetchedBatch] = []
        taken = 0
        ops = [op for op in self.partitions.values() if op.queue.batches]
        if ops:
            start = self._drain_start % len(ops)
            self._drain_start += 1
            for op in ops[start:] + ops[:start]:
                q = op.queue
                while q.batches:
                    if max_bytes is not None and out and taken + q.batches[0].nbytes > max_bytes:
                        break
                    batch = q.popleft()
                    taken += batch.nbytes
                    self.buffered_records -= batch.next_offset - batch.first_offset
                    out.append(batch)
                self.on_fetchable(op.pull_node)
                if max_bytes is not None and taken >= max_bytes:
                    break
        self.budget.take_buffered(taken)
        if not self.buffered_records:
            self.data_ready.clear()
        if out:
            self.budget.freed()
        return out
