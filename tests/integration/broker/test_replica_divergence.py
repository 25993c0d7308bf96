"""A slave tells divergence by content, never deletes below its floor (replication.py over real storage).

Answers are fed to a Replicator directly (no processes): the master's incarnation history in each
answer decides where the slave's log stops holding the master's records, also when the offsets and
batch boundaries line up (what offsets alone cannot see, issue 13.2); and a cut below what the slave
reported to its master (its floor) is refused and reported, never done (issue 12.2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mqd.broker.consumer_groups import ConsumerGroupStore
from mqd.broker.replica_auth import ReplicaAuth, ReplicaCredentials
from mqd.broker.replica_client import ReplicaClient
from mqd.broker.replica_floor import ReplicaFloor
from mqd.broker.replication import Replicator
from mqd.broker.storage import PartitionLog, Storage
from mqd.config import BrokerGroupSpec, NodeSpec, StorageConfig
from mqd.wire import format as fmt
from mqd.wire.incarnation import IncarnationEntry
from mqd.wire.protocol import FetchAnswer, PartitionFetch, Status

TOPIC = "events"
A, B, C = "a" * 32, "b" * 32, "c" * 32


def batch(count: int, base: int, tag: str) -> bytes:
    buf = bytearray(fmt.encode_batch([f"{tag}-{i}".encode() for i in range(count)], timestamps=[1] * count))
    fmt.set_base_offset(buf, 0, base)
    return bytes(buf)


class Slave:
    """A Replicator of node "s" (master "m") over real storage in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.storage = Storage(root, StorageConfig(segment_bytes=4096, fsync="never"))
        self.storage.open([(TOPIC, 0)])
        self.floor = ReplicaFloor(root)
        self.floor.load()
        group = BrokerGroupSpec(
            name="broker-a",
            nodes=[
                NodeSpec(id="m", url="http://127.0.0.1:9", role="master"),
                NodeSpec(id="s", url="http://127.0.0.1:10", role="slave"),
            ],
        )
        creds = ReplicaCredentials("c", "s", {"s": "0" * 64, "m": "1" * 64})
        self.replicator = Replicator(
            node_id="s",
            broker_group=group,
            storage=self.storage,
            partitions=[(TOPIC, 0)],
            client=ReplicaClient(ReplicaAuth(creds, ["m"])),
            consumer_groups=ConsumerGroupStore(root),
            floor=self.floor,
            on_append=lambda t, p: None,
            wait_ms=10,
        )

    @property
    def log(self) -> PartitionLog:
        plog = self.storage.get(TOPIC, 0)
        assert plog is not None
        return plog

    def feed(
        self,
        status: Status,
        data: bytes,
        master_max: int,
        history: list[IncarnationEntry],
        *,
        reported: int | None = None,
    ) -> None:
        """One master answer; ``reported``: the log end this slave's request named (its floor)."""
        p = PartitionFetch(TOPIC, 0, status, 0, 0, master_max, None, memoryview(data), history=history)
        asked = None if reported is None else {(TOPIC, 0): reported}
        self.replicator._apply(FetchAnswer("m", [p], data), 0.0, asked)

    def partition_status(self) -> dict[str, object]:
        parts = self.replicator.status()["partitions"]
        assert isinstance(parts, list)
        got: dict[str, object] = parts[0]
        return got


@pytest.fixture
def slave(tmp_path: Path) -> Iterator[Slave]:
    s = Slave(tmp_path)
    yield s
    s.storage.close()


def test_divergence_with_aligned_batches_is_found_by_history(slave: Slave) -> None:
    """The slave holds 0..7 under A; the master truncated at 4 and wrote other records 4..7 under B
    (same offsets, same batch boundaries, same log end). The master's history [A@0, B@4] makes the
    slave cut to 4, take the history, and copy the master's 4..7."""
    first, second = batch(4, 0, "x"), batch(4, 4, "old")
    slave.feed(Status.FOUND, first + second, 8, [IncarnationEntry(A, 0)])
    assert slave.log.max_offset == 8 and slave.log.incarnation == A
    master_history = [IncarnationEntry(A, 0), IncarnationEntry(B, 4)]
    slave.feed(Status.NO_MESSAGE_IN_QUEUE, b"", 8, master_history)
    assert slave.log.max_offset == 4
    assert slave.log.history == master_history
    new = batch(4, 4, "new")
    slave.feed(Status.FOUND, new, 8, master_history)
    assert slave.log.read(0, 10**6) == first + new


def test_a_cut_below_the_floor_is_refused_and_reported(slave: Slave) -> None:
    """Same divergence, but the slave had reported its end 8 to the master (acks=all may have
    acknowledged 4..7): it keeps its records, parks the partition and counts the refusal; the floor
    is saved and survives a restart of the slave."""
    first, second = batch(4, 0, "x"), batch(4, 4, "acked")
    slave.feed(Status.FOUND, first + second, 8, [IncarnationEntry(A, 0)])
    slave.feed(Status.NO_MESSAGE_IN_QUEUE, b"", 8, [IncarnationEntry(A, 0)], reported=8)
    slave.feed(
        Status.NO_MESSAGE_IN_QUEUE, b"", 8, [IncarnationEntry(A, 0), IncarnationEntry(B, 4)], reported=8
    )
    assert slave.log.read(0, 10**6) == first + second
    status = slave.partition_status()
    assert status["parked"] is True and status["floor"] == 8
    assert "not truncating" in str(status["error"])
    assert slave.replicator.truncations_refused == 1
    assert slave.replicator.health_problems()
    slave.floor.save(force=True)
    again = ReplicaFloor(slave.root)
    again.load()
    assert again.floor(TOPIC, 0) == 8 and again.synced(TOPIC, 0)


def test_a_master_with_a_foreign_history_is_not_followed_by_offsets(slave: Slave) -> None:
    """After the slave took its master's history once, a master whose history shares nothing with
    it (a replaced data dir accepted by an operator) and whose log is longer is not trusted by
    offsets: the slave does not append the master's records after its own (they would mix two
    logs); it parks at its floor instead."""
    mine = batch(4, 0, "acked")
    slave.feed(Status.FOUND, mine, 4, [IncarnationEntry(A, 0)])
    slave.feed(Status.NO_MESSAGE_IN_QUEUE, b"", 4, [IncarnationEntry(A, 0)], reported=4)
    foreign = batch(4, 4, "other-log")
    slave.feed(Status.FOUND, foreign, 12, [IncarnationEntry(C, 0)], reported=4)
    assert slave.log.read(0, 10**6) == mine
    assert slave.partition_status()["parked"] is True


def test_a_new_pair_without_shared_history_follows_offsets_and_adopts(slave: Slave) -> None:
    """A slave log that never took a master history (new, or upgraded from before incarnations)
    and a master with its own: offsets decide, and the slave takes the master's history."""
    own = slave.log.incarnation
    slave.feed(Status.FOUND, batch(3, 0, "x"), 3, [IncarnationEntry(C, 0)])
    assert slave.log.max_offset == 3
    assert slave.log.incarnation == C != own


def test_a_hole_in_the_masters_log_is_copied_as_a_hole(slave: Slave) -> None:
    """The master answers DATA_LOST 4..7 at the slave's log end 4 (a fenced range no replica
    repaired): the slave fences the same offsets and asks on from 8, where it appends again."""
    history = [IncarnationEntry(A, 0)]
    slave.feed(Status.FOUND, batch(4, 0, "x"), 12, history)
    p = PartitionFetch(
        TOPIC,
        0,
        Status.DATA_LOST,
        8,
        0,
        12,
        None,
        memoryview(b""),
        history=history,
        lost_first=4,
        lost_last=7,
    )
    slave.replicator._apply(FetchAnswer("m", [p], b""), 0.0, {(TOPIC, 0): 4})
    assert slave.log.max_offset == 8 and slave.log.fenced_ranges() == [(4, 7)]
    slave.feed(Status.FOUND, batch(4, 8, "after"), 12, history)
    assert slave.log.max_offset == 12
    assert slave.partition_status()["error"] is None
