"""Answering a fetch: plan every partition from the in-memory indexes, then read once.

While a fetch is held, each attempt only *plans*: per partition the offset status
(:mod:`mqd.broker.offset_check`), the node to pull from next (:mod:`mqd.broker.pull_suggestion`)
and, for FOUND, the byte ranges of whole batches within the budget, all without I/O. Once the
answer is ready every range is read with ``preadv`` straight into one buffer, which goes to the
socket as is: stored bytes are copied once in user space and never parsed (the offset after the
last batch comes from the index too).

A consumer that asks for ``changes_only`` gets no entry for a partition with nothing new (its log
end is the offset asked for, under the incarnation asked for, nothing to suggest): an idle
consumer of a thousand partitions then gets answers of a few bytes, and neither side does
per-partition work for them (docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mqd.broker.cluster_state import ClusterState
from mqd.broker.offset_check import check_offset
from mqd.broker.pull_suggestion import master_suggestion, slave_suggestion
from mqd.broker.replica_progress import ReplicaProgress
from mqd.broker.storage import PartitionLog, ReadPlan, Storage
from mqd.config import BrokerConfig
from mqd.wire.protocol import FetchAnswerHeader, PartitionHeader, Status, frame_fetch_answer

# a partition's planned read: the log and the byte ranges in it (None: nothing to read)
PlannedRead = tuple[PartitionLog, ReadPlan] | None

# the statuses of a partition whose log ends at the offset asked for (held, nothing new to say)
_AT_LOG_END = (Status.OFFSET_OVERFLOW_ONE, Status.NO_MESSAGE_IN_QUEUE)


@dataclass(slots=True)
class FetchItem:
    """One partition of a fetch request."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    # the incarnation the consumer's offset belongs to; None: it does not know yet
    incarnation: str | None = None
    # the ones it fetched under before, oldest first, each with the first offset it fetched under
    # the next (mqd/broker/incarnation.py: a log that lost the newest still knows an older one)
    lineage: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True)
class FetchPlan:
    """A planned answer: one header entry and one planned read per requested partition."""

    entries: list[PartitionHeader]
    reads: list[PlannedRead]


class FetchPlanner:
    """Plans fetch answers over this node's logs and reads them into one buffer."""

    def __init__(
        self, config: BrokerConfig, state: ClusterState, storage: Storage, replica_progress: ReplicaProgress
    ) -> None:
        self._state = state
        self._storage = storage
        self._replica_progress = replica_progress
        # fixed for the node's life; read once per partition of every fetch attempt
        self._is_master = state.is_master
        self._offset_check_in_slave = config.offset_check_in_slave
        self._suggest_lag_bytes = config.slave_suggest_lag_bytes

    def plan(
        self,
        items: list[FetchItem],
        min_bytes: int,
        max_bytes: int,
        replica: bool,
        *,
        changes_only: bool = False,
    ) -> tuple[FetchPlan, bool]:
        """Plan every partition once; the flag says the answer should go out without waiting.
        With ``changes_only`` a partition with nothing new gets no entry (:func:`unchanged`)."""
        plan = FetchPlan([], [])
        total = 0
        urgent = False  # a status the client must act on now (moved offset, not served)
        for it in items:
            budget = min(it.max_bytes, max_bytes - total)
            entry, planned, waitable = self._plan_partition(it, budget, total, replica)
            if changes_only and planned is None and unchanged(it, entry):
                continue
            plan.entries.append(entry)
            plan.reads.append(planned)
            if planned is not None:
                total += planned[1].size
            urgent = urgent or not waitable
        return plan, urgent or (total > 0 and total >= min_bytes) or min_bytes == 0

    def read(self, node_id: str, plan: FetchPlan) -> tuple[bytes, memoryview]:
        """Read every planned range into one buffer (the only copy of the stored bytes before the
        socket); returns the framed head and that buffer. Call with no await since :meth:`plan`:
        a plan's file descriptors stay valid until then."""
        # np.empty, not bytearray: the reads fill every byte, so zeroing it first is a wasted pass
        view = np.empty(sum(read[1].size for read in plan.reads if read is not None), dtype=np.uint8).data
        chunks: list[memoryview] = []
        at = 0
        for planned in plan.reads:
            if planned is None:
                chunks.append(view[at:at])
                continue
            plog, read_plan = planned
            chunk = view[at : at + read_plan.size]
            plog.read_into(read_plan, chunk)
            chunks.append(chunk)
            at += read_plan.size
        parts = frame_fetch_answer(FetchAnswerHeader(node_id, tuple(plan.entries)), chunks)
        return b"".join(parts), view

    def _plan_partition(
        self, it: FetchItem, budget: int, pos: int, replica: bool
    ) -> tuple[PartitionHeader, PlannedRead, bool]:
        """``pos``: where this partition's batches will start in the answer's data (the bytes
        planned before it; 0: it is the first to read)."""
        topic, partition, offset = it.topic, it.partition, it.offset
        state = self._state
        plog = self._storage.get(topic, partition) if state.holds(topic, partition) else None
        # replicas copy from the master only
        if plog is None or (replica and not self._is_master):
            broker_group = state.broker_group_of(topic, partition)
            if broker_group is None:
                error = "unknown_partition"
            elif replica:
                error = "not_master"
            else:
                error = f"not_served: partition lives on group {broker_group.name}"
            check = check_offset(offset, 0, 0, served=False, is_master=self._is_master)
            entry = PartitionHeader(
                topic,
                partition,
                check.status,
                next_offset=check.next_offset,
                min_offset=0,
                max_offset=0,
                error=error,
                pos=pos,
            )
            return entry, None, check.waitable
        lo, hi = plog.min_offset, plog.max_offset
        current = plog.incarnation
        diverged: int | None = None
        known = True
        if it.incarnation is not None and it.incarnation != current:
            diverged = plog.diverged_at(it.incarnation, it.lineage)
            known = plog.knows_incarnation(it.incarnation)
        lost = plog.fenced_at(offset)
        check = check_offset(
            offset,
            lo,
            hi,
            is_master=self._is_master,
            offset_check_in_slave=self._offset_check_in_slave,
            diverged_at=diverged,
            incarnation_known=known,
            lost_last=None if lost is None else lost[1],
        )
        next_offset = check.next_offset
        planned: PlannedRead = None
        first = pos == 0
        if check.status is Status.FOUND and (budget > 0 or first):
            # the first partition gets at least one whole batch, even one larger than the budget
            read_plan = plog.plan_read(offset, max(budget, 1))
            if read_plan is not None and (read_plan.size <= budget or first):
                planned = (plog, read_plan)
                next_offset = read_plan.next_offset
        changed = check.status is Status.INCARNATION_CHANGED
        lost_range = lost if check.status is Status.DATA_LOST else None
        entry = PartitionHeader(
            topic,
            partition,
            check.status,
            next_offset=next_offset,
            min_offset=lo,
            max_offset=hi,
            suggest=None if replica else self._suggest(plog, check.status, offset, next_offset),
            incarnation=current,
            diverged_at=diverged if changed else None,
            lost_first=None if lost_range is None else lost_range[0],
            lost_last=None if lost_range is None else lost_range[1],
            history=tuple(plog.history) if replica else None,
            pos=pos,
            length=0 if planned is None else planned[1].size,
        )
        return entry, planned, check.waitable

    def _suggest(self, plog: PartitionLog, status: Status, offset: int, next_offset: int) -> str | None:
        threshold = self._suggest_lag_bytes
        if self._is_master:
            progress = self._replica_progress
            return master_suggestion(
                status,
                offset,
                next_offset,
                plog.bytes_behind,
                threshold,
                lambda: progress.live_slave_ends(plog.topic, plog.partition),
            )
        master = self._state.broker_group.master
        alive = self._state.alive(master.id)
        return slave_suggestion(status, next_offset, plog.bytes_behind, threshold, master.id, alive)


def unchanged(it: FetchItem, entry: PartitionHeader) -> bool:
    """The planned entry tells the consumer nothing it does not know: the log ends at the offset it
    asked for, under the incarnation it named, with no error and no other node to pull from."""
    return (
        entry.status in _AT_LOG_END
        and entry.next_offset == it.offset == entry.max_offset
        and it.incarnation is not None
        and entry.incarnation == it.incarnation
        and entry.suggest is None
        and entry.error is None
    )
