"""When the consumer counts as caught up, the condition a burst run exits on (CI of stop 44: a burst
after a Kafka unclean election exited with nothing landed)."""

from __future__ import annotations

from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition

TP = TopicPartition("cut", 0)


def state_at(position: int) -> SubscriptionState:
    state = SubscriptionState(FlowLimits(), ByteBudget(1 << 20))
    state.assign(TP, position, "2")
    return state


def test_a_position_past_the_log_end_is_not_caught_up() -> None:
    """Landed up to 20, the log cut back to 15 by an unclean election: the log-end poll (15) may be
    applied before the fetch that finds the cut. Fails with the old `position >= log_end`."""
    state = state_at(20)
    state.partitions[TP].log_end = 15
    assert not state.caught_up()


def test_a_position_at_the_log_end_is_caught_up_and_an_unknown_end_is_not() -> None:
    state = state_at(20)
    assert not state.caught_up()
    state.partitions[TP].log_end = 21
    assert not state.caught_up()
    state.partitions[TP].log_end = 20
    assert state.caught_up()


def test_a_parked_partition_does_not_hold_the_others_back() -> None:
    """Parked partitions are not fetched, so they cannot catch up: they are not waited for."""
    state = state_at(20)
    state.partitions[TP].log_end = 30
    state.partitions[TP].parked = "offset policy: fail"
    assert state.caught_up()
