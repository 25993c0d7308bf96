"""The Kafka source's incarnation rule (mqd.sources.kafka.log_incarnation), pure logic."""

from __future__ import annotations

from mqd.consumer.source import LandedEpoch
from mqd.landing.layout import check_incarnation
from mqd.sources.kafka.log_incarnation import LogIncarnations, derived
from mqd.topic_partition import TopicPartition

TP = TopicPartition("t", 0)
A, B = "0" * 31 + "a", "0" * 31 + "b"


def test_the_topic_id_until_a_truncation_then_a_derived_id_the_landing_accepts() -> None:
    """No truncation seen: the incarnation is the topic id; after one it is a derived 32-hex id that
    the landing stores, and a request naming the old one is told where the logs diverged."""
    incs = LogIncarnations()
    assert incs.check(TP, None, A) == (A, None)
    incs.saw_batches(TP, [(0, 0), (5, 1)], 12)
    assert (incs.epoch_at(TP, 5), incs.epoch_at(TP, 6), incs.epoch_at(TP, 0)) == (0, 1, None)
    new = incs.truncated(TP, 1, 8)
    assert new == derived(A, A, 1, 8) and check_incarnation(new) == new
    assert incs.check(TP, new, A) == (new, None)
    assert incs.check(TP, A, A) == (new, 8)


def test_a_derived_id_of_the_same_topic_is_adopted_after_a_restart() -> None:
    """A fresh process (no history) asked for a derived id of this topic adopts it (the truncation
    happened before it started); a derived id of another topic, or another topic id, is another
    log: diverged at 0."""
    before = derived(A, A, 3, 100)
    incs = LogIncarnations()
    assert incs.check(TP, before, A) == (before, None)
    other = LogIncarnations()
    assert other.check(TP, derived(B, B, 3, 100), A) == (A, 0)
    assert other.check(TP, B, A) == (A, 0)


def test_a_recreated_topic_and_leader_epochs() -> None:
    """A new topic id replaces the partition's log (diverged at 0 for the old id); a higher leader
    epoch in metadata marks a fetched partition for an epoch check, a first sighting does not."""
    incs = LogIncarnations()
    incs.check(TP, None, A)
    incs.leader_epochs({TP: 2})
    assert not incs.pending
    incs.leader_epochs({TP: 3})
    assert incs.pending == {TP}
    assert incs.check(TP, A, B) == (B, 0)
    assert not incs.pending
    assert incs.check(TP, None, None) == (None, None)


def test_divergence_from_an_epoch_answer() -> None:
    """An end offset below the position is the cut; at or above it with the same epoch nothing
    diverged; an older epoch that runs past the position (the leader never had ours) diverges where
    we first saw our epoch."""
    incs = LogIncarnations()
    incs.check(TP, None, A)
    incs.saw_batches(TP, [(0, 0), (5, 2)], 12)
    assert incs.divergence(TP, 2, 2, 7, 10) == 7
    assert incs.divergence(TP, 2, 2, 10, 10) is None
    assert incs.divergence(TP, 2, 1, 12, 10) == 5
    assert incs.divergence(TP, 2, -1, -1, 10) is None  # the leader knows no epoch: no answer to judge


def test_the_landed_epoch_seeds_a_restart_only_right_after_the_landed_record() -> None:
    """At a restart (no epoch seen in this process) a position right after the landed record, in
    the incarnation it was landed in, takes the landed epoch and waits for validation; another
    position, another incarnation, or a partition that already fetched batches of that epoch or a
    later one is left alone."""
    landed = LandedEpoch(A, 9, 3)
    incs = LogIncarnations()
    incs.check(TP, A, A)
    assert not incs.landed(TP, 11, A, landed)
    assert not incs.landed(TP, 10, A, LandedEpoch(B, 9, 3))
    assert incs.landed(TP, 10, A, landed)
    assert incs.epoch_at(TP, 10) == 3 and TP in incs.pending
    fetched = LogIncarnations()
    fetched.check(TP, A, A)
    fetched.saw_batches(TP, [(10, 4)], 12)
    assert not fetched.landed(TP, 10, A, landed)


def test_a_partition_handed_back_takes_the_newer_landed_epoch() -> None:
    """Epochs seen before a revocation (epoch 0 up to offset 100) are older than the landed record's
    (another daemon landed up to 199 in epoch 1): the position takes epoch 1, not 0, so the check
    against the log asks about epoch 1 and finds no truncation (chaos seed 152326 landed 14,620
    records twice when it asked about epoch 0)."""
    incs = LogIncarnations()
    incs.check(TP, A, A)
    incs.saw_batches(TP, [(0, 0)], 101)
    assert incs.epoch_at(TP, 200) == 0
    assert incs.landed(TP, 200, A, LandedEpoch(A, 199, 1))
    assert incs.epoch_at(TP, 200) == 1 and TP in incs.pending
    assert incs.epoch_at(TP, 50) == 0  # positions in what this process fetched keep what it saw
    assert incs.epoch_at(TP, 101) == 0
    assert incs.divergence(TP, 1, 1, 250, 200) is None  # the leader's epoch 1 ends past the position
    assert not incs.landed(TP, 200, A, LandedEpoch(A, 199, 1))  # known now: nothing more to do


def test_a_position_moved_back_past_what_this_process_fetched_has_no_epoch() -> None:
    """Handed back after another daemon landed up to 8599 in epoch 5, a partition this process had
    read up to 6559 in epoch 3 knows no epoch for the records between: a position moved back into
    them (an out-of-range answer from a lagging leader moved it to 8580) fetches without a last
    epoch. Before, it took epoch 3 for them, the leader answered that epoch 3 ended at 6560, and
    2,020 records still in the log were landed again as a new incarnation (chaos seed 349514)."""
    incs = LogIncarnations()
    incs.check(TP, A, A)
    incs.saw_batches(TP, [(0, 0), (4000, 3)], 6560)
    assert incs.landed(TP, 8600, A, LandedEpoch(A, 8599, 5))
    assert incs.epoch_at(TP, 8600) == 5
    assert incs.epoch_at(TP, 6560) == 3  # the record before it was fetched here
    assert incs.epoch_at(TP, 6561) is None
    assert incs.epoch_at(TP, 8580) is None
    assert incs.epoch_at(TP, 5000) == 3
    # fetched again from 8580: those records' epochs are known, the stretch before stays unknown
    incs.saw_batches(TP, [(8580, 5)], 8700)
    assert incs.epoch_at(TP, 8600) == 5 and incs.epoch_at(TP, 6561) is None
