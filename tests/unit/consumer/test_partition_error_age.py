"""A partition's fetch error carries its age into the status JSON, and an answer that says the
partition is caught up clears it (issue 17: a stale fetch error stayed on `mqd top` for good, since
only an answer with records cleared it)."""

from __future__ import annotations

from support.fetch_answers import answer, batches, deliver, manager

from mqd.wire.protocol import Status


def test_a_caught_up_answer_clears_an_earlier_fetch_error() -> None:
    """Offset gap -> last_error set and stamped; the next answer is "caught up" (OFFSET_OVERFLOW_ONE
    at the log end) -> the error is gone with its stamp. Fails without the fetcher's clearing."""
    m = manager()
    ps = deliver(m, 0, answer(Status.FOUND, 20, batches((10, 10))))
    assert ps.last_error is not None and "offset gap" in ps.last_error
    assert ps.last_error_at is not None and ps.last_error_at <= m.clock()
    deliver(m, 0, answer(Status.OFFSET_OVERFLOW_ONE, 0, max_offset=0))
    assert (ps.last_error, ps.last_error_at) == (None, None)


def test_a_parked_partition_keeps_its_reason_on_a_caught_up_answer() -> None:
    """The reason a partition is parked is its error until it is unparked: not cleared as stale."""
    m = manager()
    ps = deliver(m, 0, answer(Status.FOUND, 20, batches((10, 10))))
    ps.parked = ps.last_error = "offset policy: fail"
    deliver(m, 0, answer(Status.OFFSET_OVERFLOW_ONE, 0, max_offset=0))
    assert ps.last_error == "offset policy: fail"


def test_every_set_restamps_the_error() -> None:
    """The same error again is a new occurrence: its age starts over (the view says how recent)."""
    m = manager()
    ps = deliver(m, 0, answer(Status.FOUND, 20, batches((10, 10))))
    first = ps.last_error_at
    assert first is not None
    ps.last_error_at = first - 30  # as if set 30 s ago
    deliver(m, 0, answer(Status.FOUND, 20, batches((10, 10))))
    assert ps.last_error_at is not None and ps.last_error_at >= first
