"""The fetch-answer callback as pure logic: real answers framed with mqd.wire.protocol, real batches from
mqd.wire.format, no broker. Integration tests cover the same paths end to end; these pin every branch
of the status table and the race checks exactly."""

from __future__ import annotations

import pytest
from support.fetch_answers import TP, answer, batches, deliver, manager

from mqd.consumer.fetcher import FetchManager, _Sent
from mqd.wire.protocol import Status


def offsets(m: FetchManager) -> list[int]:
    return [o for b in m.state.drain() for o in b.records.column("offset").to_pylist()]


def test_found_cuts_records_below_the_requested_offset() -> None:
    """FOUND: the first batch is cut at the requested offset, position moves past the last record."""
    m = manager()
    ps = deliver(m, 5, answer(Status.FOUND, 20, batches((0, 10), (10, 10))))
    assert ps.position == 20
    assert offsets(m) == list(range(5, 20))


def test_bad_batch_keeps_good_prefix_then_parks_after_repeats() -> None:
    """A CRC mismatch in the second batch: the first is delivered, the partition retries with
    backoff, and three bad answers in a row park it with the reason."""
    m = manager()
    good, bad = batches((0, 5)), bytearray(batches((5, 5)))
    bad[-1] ^= 0xFF
    ps = deliver(m, 0, answer(Status.FOUND, 10, good + bytes(bad)))
    assert (ps.position, offsets(m), ps.parked) == (5, [0, 1, 2, 3, 4], None)
    assert ps.retry_at > 0 and "CRC mismatch" in (ps.last_error or "")
    deliver(m, 5, answer(Status.FOUND, 10, bytes(bad)))
    deliver(m, 5, answer(Status.FOUND, 10, bytes(bad)))
    assert ps.parked and "CRC mismatch" in ps.parked and ps.position == 5


def test_a_corrupt_park_is_probed_and_heals_when_the_data_decodes_again() -> None:
    """Damage on the path (a proxy, a NIC), not on disk: a partition parked after three bad answers
    is still fetched once per error_backoff_max; a probe that is still bad keeps it parked at the
    damaged batch, the first clean answer unparks it and its records flow. Nothing is skipped."""
    m = manager(error_backoff_max_ms=2000)
    good = batches((5, 5))
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    for _ in range(3):
        ps = deliver(m, 5, answer(Status.FOUND, 10, bytes(bad)))
    assert ps.parked and ps.probe_parked and ps.position == 5
    assert ps.retry_at >= m.clock() + 1.5  # probed at the longest backoff, not at once
    deliver(m, 5, answer(Status.FOUND, 10, bytes(bad)))
    assert ps.parked and ps.position == 5 and offsets(m) == []
    deliver(m, 5, answer(Status.FOUND, 10, good))
    assert (ps.parked, ps.probe_parked, ps.position, offsets(m)) == (None, False, 10, [5, 6, 7, 8, 9])


def test_offset_gap_is_an_error_not_a_skip() -> None:
    """Data starting after the requested offset is refused: never skip records silently."""
    m = manager()
    ps = deliver(m, 0, answer(Status.FOUND, 20, batches((10, 10))))
    assert ps.position == 0 and offsets(m) == [] and "offset gap" in (ps.last_error or "")


@pytest.mark.parametrize("race", ["seek", "paused", "revoked"])
def test_stale_answers_are_dropped(race: str) -> None:
    """An answer for a partition sought, paused or revoked since the fetch was sent is dropped and
    moves nothing."""
    m = manager()
    ps = m.state.assign(TP, 0, "m")
    sent = [_Sent(ps, ps.epoch, 0)]
    if race == "seek":
        m.state.seek(TP, 3)
    elif race == "paused":
        m.state.set_paused([TP], True)
    else:
        m.state.drop(TP)
    m.handle_answer("m", answer(Status.FOUND, 10, batches((0, 10))), sent)
    assert ps.position == (3 if race == "seek" else 0)
    assert ps.queue.records == 0 and m.state.buffered_records == 0


def test_overflow_one_keeps_position() -> None:
    """OFFSET_OVERFLOW_ONE: caught up; nothing moves, no reset, no backoff."""
    m = manager()
    ps = deliver(m, 7, answer(Status.OFFSET_OVERFLOW_ONE, 7, max_offset=7))
    assert (ps.position, ps.retry_at, m.offset_resets, ps.log_end) == (7, 0.0, 0, 7)


@pytest.mark.parametrize(
    "status", [Status.OFFSET_OVERFLOW_BADLY, Status.OFFSET_TOO_SMALL, Status.NO_MESSAGE_IN_QUEUE]
)
def test_slave_keeping_the_offset_is_not_a_reset(status: Status) -> None:
    """A slave answering with the requested offset: position kept, not counted, the partition backs
    off and goes to the (live) master, which is authoritative."""
    m = manager()
    ps = deliver(m, 50, answer(status, 50, node="s"), node="s")
    assert (ps.position, m.offset_resets, ps.parked) == (50, 0, None)
    assert ps.retry_at > 0 and ps.pull_node == "m"


@pytest.mark.parametrize(
    ("status", "requested", "next_offset"),
    [
        (Status.OFFSET_OVERFLOW_BADLY, 500, 100),
        (Status.OFFSET_TOO_SMALL, 0, 40),
        (Status.NO_MESSAGE_IN_QUEUE, 9, 0),
    ],
)
def test_master_illegal_offset_policies(status: Status, requested: int, next_offset: int) -> None:
    """From a master: "broker" follows next_offset, "fail" parks with the status in the reason;
    both count one reset."""
    follow = manager(on_offset_reset="broker")
    ps = deliver(follow, requested, answer(status, next_offset, min_offset=40 if next_offset == 40 else 0))
    assert (ps.position, follow.offset_resets) == (next_offset, 1)
    fail = manager(on_offset_reset="fail")
    ps = deliver(fail, requested, answer(status, next_offset))
    assert ps.position == requested and status.value in (ps.parked or "") and fail.offset_resets == 1


def test_not_served_switches_node_and_backs_off() -> None:
    """NOT_SERVED is a routing error: the partition moves to another replica and backs off."""
    m = manager()
    ps = deliver(m, 0, answer(Status.NOT_SERVED, 0))
    assert ps.pull_node == "s" and ps.retry_at > 0 and ps.position == 0


def test_suggestion_switches_pull_node() -> None:
    """A suggested node of the partition's group becomes the pull node."""
    m = manager()
    ps = deliver(m, 0, answer(Status.FOUND, 10, batches((0, 10)), suggest="s"))
    assert ps.pull_node == "s" and ps.position == 10


def test_budget_clips_answer_and_blocks_until_drained() -> None:
    """Batches beyond the daemon-wide budget are not buffered (refetched later from the first one
    left out); fetching is blocked until a drain."""
    data = batches((0, 10), (10, 10), (20, 10))
    budget = len(batches((0, 10), (10, 10)))
    m = manager(max_buffered_bytes=budget)
    ps = deliver(m, 0, answer(Status.FOUND, 30, data))
    assert ps.position == 20 and m.state.budget.buffered == budget and m.state.budget.blocked
    m.state.drain()
    assert not m.state.budget.blocked


def test_suggestion_of_a_node_we_just_failed_to_reach_is_ignored() -> None:
    """A replica may still think its master is alive moments after we failed to reach it: its
    suggestion is not followed until our own down mark has passed (no bouncing)."""
    m = manager()
    m.state.assign(TP, 0, "s")
    m.node_failed("m", 5.0)
    ps = deliver(m, 0, answer(Status.FOUND, 10, batches((0, 10)), suggest="m", node="s"), node="s")
    assert ps.pull_node == "s" and ps.position == 10
