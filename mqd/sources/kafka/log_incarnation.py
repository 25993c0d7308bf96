"""A Kafka partition's log incarnation, as the engine's seam carries it (pure logic, no I/O).

Kafka has no incarnation id; two facts make one (KIP-516 topic ids, KIP-101/KIP-320 leader epochs):
- the topic id: a recreated topic has a new one, and none of the old log's offsets survive in it;
- a truncation: after a leader change, OffsetsForLeaderEpoch(epoch of our position) answers an end
  offset below the position: the new leader's log diverged there.

The incarnation string is 32 lowercase hex chars (what the landing stores in file names and state):
the topic id itself while no truncation has been seen, and after a truncation at end offset D of
epoch E, ``H(topic id)[:16] + H(previous incarnation, E, D)[:16]`` (H: BLAKE2b). Both halves are
deterministic, so every daemon that sees the same truncation names it the same, and the first half
says which topic a derived id belongs to: after a restart, a requested id that starts with this
topic's prefix is a truncation this process did not see and is adopted as is (the truncations before
it were handled before it was landed); any other id than the current one is another topic's log
(the topic was recreated): INCARNATION_CHANGED with ``diverged_at = 0``. Where the broker has no
topic ids (Metadata below v10, or the zero UUID) the incarnation is None, as before.

Per partition this also keeps the leader epochs seen in fetched batches (where the epoch changes,
a short list), so the epoch of a position is known for OffsetsForLeaderEpoch, and which partitions
wait for that validation (a higher leader epoch in Metadata, a fenced or unknown leader epoch, or
a restart whose landed record's epoch, kept by the landing, must be checked against the log).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from mqd.consumer.source import LandedEpoch
from mqd.topic_partition import TopicPartition

_MAX_EPOCHS = 16  # epoch changes kept per partition (a seek further back loses validation only)


_UNSEEN = -1  # an epoch "transition" where records this process never fetched begin


def epoch_before(transitions: list[tuple[int, int]], position: int) -> int | None:
    """The epoch of the record before ``position`` among (first offset, epoch) transitions in
    offset order (None: before the first, or in a stretch this process never fetched)."""
    epoch = None
    for first, e in transitions:
        if first >= position:
            break
        epoch = e
    return None if epoch == _UNSEEN else epoch


def _h(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def topic_prefix(topic_id: str) -> str:
    """The first half of every derived incarnation of ``topic_id``'s partitions."""
    return _h(topic_id)


def derived(topic_id: str, previous: str, epoch: int, end_offset: int) -> str:
    """The incarnation after a truncation at ``end_offset`` of leader epoch ``epoch``."""
    return topic_prefix(topic_id) + _h(f"{previous}:{epoch}:{end_offset}")


@dataclass
class _Partition:
    topic_id: str
    current: str
    # old incarnation -> (the one that replaced it, the first offset where they differ)
    successors: dict[str, tuple[str, int]] = field(default_factory=dict)
    epochs: list[tuple[int, int]] = field(default_factory=list)  # (first offset, leader epoch)
    seen_end: int | None = None  # the offset after the last fetched batch whose epoch is in epochs


class LogIncarnations:
    """Every fetched partition's incarnation, epochs seen and pending validation."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition] = {}
        self._leader_epochs: dict[TopicPartition, int] = {}
        self.pending: set[TopicPartition] = set()  # wait for an OffsetsForLeaderEpoch check

    def _part(self, tp: TopicPartition, topic_id: str) -> _Partition:
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition(topic_id, topic_id)
        elif part.topic_id != topic_id:
            # the topic was recreated: nothing of the old log survives (offsets from 0 differ)
            new = _Partition(topic_id, topic_id, dict(part.successors))
            new.successors[part.current] = (topic_id, 0)
            part = self._parts[tp] = new
            self.pending.discard(tp)
        return part

    def check(
        self, tp: TopicPartition, requested: str | None, topic_id: str | None
    ) -> tuple[str | None, int | None]:
        """(the partition's current incarnation, ``diverged_at`` when ``requested`` is another one
        and the engine must move: None when it may fetch as asked)."""
        if topic_id is None:
            return None, None
        part = self._part(tp, topic_id)
        if requested is None or requested == part.current:
            return part.current, None
        if requested in part.successors:
            diverged, seen, inc = None, set(), requested
            while inc in part.successors and inc not in seen:
                seen.add(inc)
                inc, at = part.successors[inc]
                diverged = at if diverged is None else min(diverged, at)
            if inc == part.current and diverged is not None:
                return part.current, diverged
        if requested.startswith(topic_prefix(topic_id)) and len(requested) == 32:
            part.current = requested  # a truncation before this process: landed under it already
            return requested, None
        return part.current, 0  # another topic id: the topic was recreated

    def saw_batches(self, tp: TopicPartition, transitions: list[tuple[int, int]], end: int) -> None:
        """Epoch changes of fetched batches (record_batch.leader_epochs), in offset order, and
        ``end``, the offset after the last one."""
        part = self._parts.get(tp)
        if part is None or not transitions:
            return
        epochs = [e for e in part.epochs if e[0] < transitions[0][0]]
        for first, epoch in transitions:
            if not epochs or epochs[-1][1] != epoch:
                epochs.append((first, epoch))
        part.epochs = epochs[-_MAX_EPOCHS:]
        part.seen_end = end

    def epoch_at(self, tp: TopicPartition, position: int) -> int | None:
        """The leader epoch of the record before ``position`` (None: not seen)."""
        part = self._parts.get(tp)
        return None if part is None else epoch_before(part.epochs, position)

    def landed(self, tp: TopicPartition, position: int, requested: str | None, landed: LandedEpoch) -> bool:
        """A position right after the last landed record (``landed``, from the landing) in the
        incarnation it was landed in, whose epoch this process does not know: that record's epoch
        becomes the position's, and the partition waits for validation, so a log truncated while no
        daemon read it is found before anything after it is fetched. True if so.

        Two cases: no epoch seen yet in this process (a restart), and epochs seen that are older
        than the landed record's (the partition was read here, revoked, landed further by another
        daemon across a leader change, and handed back: the epochs seen here end where this daemon
        stopped, and taken for the position they would read the other daemon's records as a
        truncation of an older epoch and land them again)."""
        part = self._parts.get(tp)
        if (
            part is None
            or position != landed.offset + 1
            or requested != part.current
            or landed.incarnation != part.current
        ):
            return False
        if part.epochs:
            known = epoch_before(part.epochs, position)
            if known is None or known >= landed.leader_epoch:  # fetched here from the position on
                return False
        epochs = [e for e in part.epochs if e[0] < landed.offset and e[1] < landed.leader_epoch]
        if epochs and (part.seen_end is None or part.seen_end < landed.offset):
            # what this process fetched ends before the landed record: the records between were
            # fetched elsewhere, in epochs it does not know (taken for its last epoch, a position
            # moved back into them read the log as truncated there: chaos seed 349514 landed 2,020
            # records twice)
            epochs.append((part.seen_end if part.seen_end is not None else epochs[-1][0] + 1, _UNSEEN))
        part.epochs = epochs
        part.epochs.append((landed.offset, landed.leader_epoch))
        part.seen_end = landed.offset + 1
        self.pending.add(tp)
        return True

    def forget_epochs(self, tp: TopicPartition) -> None:
        """Drop the epochs seen for ``tp`` (its positions are no longer validated until new batches
        are fetched)."""
        part = self._parts.get(tp)
        if part is not None:
            part.epochs = []
            part.seen_end = None

    def leader_epochs(self, epochs: dict[TopicPartition, int]) -> None:
        """Leader epochs from Metadata: a higher one means a leader change; check for truncation."""
        for tp, epoch in epochs.items():
            old = self._leader_epochs.get(tp)
            self._leader_epochs[tp] = epoch
            if old is not None and epoch > old and tp in self._parts:
                self.pending.add(tp)

    def divergence(
        self, tp: TopicPartition, asked: int, epoch: int, end_offset: int, position: int
    ) -> int | None:
        """Where the leader's log diverged from ours, given its answer for our epoch ``asked`` (the
        epoch of the record before ``position``): (``epoch``, ``end_offset``), the largest epoch it
        knows up to ``asked`` and where that ends (OffsetsForLeaderEpoch, or a Fetch v12+
        diverging_epoch). None: not before ``position``. An end below the position is the cut. An
        older epoch that ends at or after the position means the leader never had our epoch: its
        records there were written in another epoch, so ours differ from the first offset we saw of
        ``asked`` on (the landed record's offset when only the landing told it: an upper bound)."""
        if 0 <= end_offset < position:
            return end_offset
        if 0 <= epoch < asked:
            part = self._parts.get(tp)
            first = next((f for f, e in part.epochs if e == asked), None) if part else None
            if first is not None and first < position:
                return first
        return None

    def truncated(self, tp: TopicPartition, epoch: int, end_offset: int) -> str:
        """The log diverged at ``end_offset``: a new incarnation from there on (returned)."""
        part = self._parts[tp]
        new = derived(part.topic_id, part.current, epoch, end_offset)
        part.successors[part.current] = (new, end_offset)
        part.current = new
        part.epochs = [e for e in part.epochs if e[0] < end_offset]
        if part.seen_end is not None:
            part.seen_end = min(part.seen_end, end_offset)
        self.pending.discard(tp)
        return new
