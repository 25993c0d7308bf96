"""Long polling (mqd/broker/long_poll.py) on a real event loop, no broker.

Proves that a held fetch is answered by an append to one of its partitions (not by a tick, and not
by an append elsewhere), at its timeout with its last attempt, at once when already ready, and at
once when the node closes the poll; and that a finished hold leaves nothing registered.
"""

from __future__ import annotations

import asyncio
import time

from mqd.broker.long_poll import LongPoll


class Attempts:
    """An attempt that becomes ready once ``ready`` is set; counts its calls."""

    def __init__(self, ready: bool = False) -> None:
        self.calls = 0
        self.ready = ready

    def __call__(self) -> tuple[int, bool]:
        self.calls += 1
        return self.calls, self.ready


async def test_ready_at_once_is_not_held() -> None:
    """An attempt that is ready on the first call returns without waiting."""
    attempt = Attempts(ready=True)
    assert await LongPoll().hold([("t", 0)], 10.0, attempt) == 1


async def test_append_to_a_held_partition_answers() -> None:
    """notify() on one of the held partitions re-runs the attempt at once."""
    poll, attempt = LongPoll(), Attempts()
    started = time.monotonic()
    held = asyncio.create_task(poll.hold([("t", 0), ("t", 1)], 10.0, attempt))
    await asyncio.sleep(0.01)
    assert attempt.calls == 1 and not held.done()
    attempt.ready = True
    poll.notify("t", 1)
    assert await asyncio.wait_for(held, 5) == 2
    assert time.monotonic() - started < 5


async def test_append_elsewhere_does_not_answer() -> None:
    """notify() on another partition leaves the hold alone until its timeout."""
    poll, attempt = LongPoll(), Attempts()
    held = asyncio.create_task(poll.hold([("t", 0)], 0.2, attempt))
    await asyncio.sleep(0.01)
    attempt.ready = True
    poll.notify("t", 1)
    poll.notify("u", 0)
    assert await held == 2  # the attempt after the timeout, not one per foreign notify
    assert attempt.calls == 2


async def test_timeout_returns_the_last_attempt() -> None:
    """Nothing ready: the hold ends after its timeout with the last attempt's result."""
    attempt = Attempts()
    started = time.monotonic()
    assert await LongPoll().hold([("t", 0)], 0.05, attempt) == attempt.calls
    assert time.monotonic() - started >= 0.05


async def test_close_answers_every_held_fetch_and_holds_no_new_one() -> None:
    """close() (the node is stopping) answers held fetches at once, and later ones are not held."""
    poll = LongPoll()
    held = [asyncio.create_task(poll.hold([("t", p)], 10.0, Attempts())) for p in range(3)]
    await asyncio.sleep(0.01)
    poll.close()
    assert await asyncio.wait_for(asyncio.gather(*held), 5) == [2, 2, 2]
    assert await asyncio.wait_for(poll.hold([("t", 0)], 10.0, Attempts()), 5) == 1


async def test_finished_and_cancelled_holds_unregister() -> None:
    """A hold that ended or was cancelled (client gone) leaves no waiter behind."""
    poll = LongPoll()
    await poll.hold([("t", 0)], 0.01, Attempts())
    held = asyncio.create_task(poll.hold([("t", 1)], 10.0, Attempts()))
    await asyncio.sleep(0.01)
    held.cancel()
    await asyncio.gather(held, return_exceptions=True)
    assert poll._waiters == {}
