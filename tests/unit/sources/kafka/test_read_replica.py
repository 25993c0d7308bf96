"""KIP-392 leases (mqd.sources.kafka.read_replica): a replica the leader names is read from for one
metadata_refresh_interval, as Kafka's Java consumer keeps ``preferredReadReplica`` for
``metadata.max.age.ms``; then, on an error, or without a lease, the leader again."""

from __future__ import annotations

from mqd.sources.kafka.read_replica import ReadReplicas
from mqd.topic_partition import TopicPartition

TP = TopicPartition("t", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_named_replica_is_read_until_its_lease_ends() -> None:
    """The leader names replica 2: reads go there, its answers keep them there for the lease (they do
    not renew it: only a leader names one), and the first answer after it sends them to the leader,
    which names the replica again: a new lease from then."""
    clock = Clock()
    rr = ReadReplicas(30.0, clock)
    assert rr.named(TP, "2", "0", {"0", "1", "2"}) == "2"
    assert rr.replica(TP) == "2"
    clock.now += 29.9
    assert rr.answered(TP, "2", "0") is None
    clock.now += 0.2
    assert rr.replica(TP) is None and rr.answered(TP, "2", "0") == "0"
    assert rr.named(TP, "2", "0", {"0", "1", "2"}) == "2"
    clock.now += 29.9
    assert rr.answered(TP, "2", "0") is None
    assert rr.named_count == 2 and rr.ended == 0


def test_a_replica_that_is_not_live_is_not_followed() -> None:
    """A replica id missing from our metadata's live brokers (fenced, or not seen yet) is ignored,
    as the Java client's nodeIfOnline: the leader keeps serving, and an older lease ends."""
    clock = Clock()
    rr = ReadReplicas(30.0, clock)
    assert rr.named(TP, "2", "0", {"0", "1", "2"}) == "2"
    assert rr.named(TP, "2", "0", {"0", "1"}) is None
    assert rr.replica(TP) is None


def test_an_error_ends_the_lease_and_a_replica_without_one_suggests_the_leader() -> None:
    """An error from the leased replica ends the lease at once (counted); its next answer, or any
    answer from a replica the engine fell back to without a lease, suggests the leader. An error
    from another node leaves a lease alone."""
    clock = Clock()
    rr = ReadReplicas(30.0, clock)
    rr.named(TP, "2", "0", {"0", "1", "2"})
    rr.failed(TP, "1", "0", "NotLeaderOrFollowerError")
    assert rr.replica(TP) == "2" and rr.ended == 0
    rr.failed(TP, "2", "0", "OffsetOutOfRangeError")
    assert rr.ended == 1 and rr.replica(TP) is None
    assert rr.answered(TP, "2", "0") == "0"
    assert rr.answered(TopicPartition("t", 1), "1", "0") == "0"


def test_leases_of_partitions_gone_from_the_metadata_are_dropped() -> None:
    """A deleted topic's leases do not outlive it (a recreated topic starts on its leader)."""
    rr = ReadReplicas(30.0, Clock())
    rr.named(TP, "2", "0", {"0", "2"})
    rr.named(TopicPartition("u", 0), "2", "0", {"0", "2"})
    rr.forget({TopicPartition("u", 0)})
    assert rr.replica(TP) is None and rr.replica(TopicPartition("u", 0)) == "2"
