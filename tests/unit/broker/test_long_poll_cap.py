"""The cap on held fetches (LongPoll.max_held) and the burst signal the memory trim reads.

Proves that a fetch that would be held over the cap raises LongPollFull (retriable) while one that
is ready at once, has no wait, or is uncapped (a replica fetch) is still served; that a place freed
by an ended or cancelled hold is reused; and that take_peak()/burst_ended() report a burst once.
"""

from __future__ import annotations

import asyncio

import pytest

from mqd.broker.long_poll import LongPoll, LongPollFull
from mqd.memory_trim import TRIM_AFTER_HELD, burst_ended


def never() -> tuple[str, bool]:
    return "empty", False


def ready() -> tuple[str, bool]:
    return "data", True


async def _held(poll: LongPoll, n: int) -> list[asyncio.Task[str]]:
    tasks = [asyncio.create_task(poll.hold([("t", i)], 10.0, never)) for i in range(n)]
    await asyncio.sleep(0.01)
    return tasks


async def test_over_the_cap_is_refused_and_the_rest_is_served() -> None:
    """Two held of max 2: a third hold raises LongPollFull; ready, no-wait and uncapped still answer."""
    poll = LongPoll(max_held=2)
    held = await _held(poll, 2)
    assert poll.held == 2
    with pytest.raises(LongPollFull) as caught:
        await poll.hold([("t", 0)], 10.0, never)
    assert caught.value.retriable and caught.value.limit == 2
    assert await poll.hold([("t", 0)], 10.0, ready) == "data"
    assert await poll.hold([("t", 0)], 0.0, never) == "empty"
    uncapped = asyncio.create_task(poll.hold([("t", 0)], 0.05, never, capped=False))
    assert await asyncio.wait_for(uncapped, 5) == "empty"
    for t in held:
        t.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    assert poll.held == 0 and poll._waiters == {}


async def test_a_freed_place_is_reused() -> None:
    """When a held fetch ends (notify made it ready), the next one is held again."""
    poll = LongPoll(max_held=1)
    answer = {"ready": False}

    def attempt() -> tuple[str, bool]:
        return ("data" if answer["ready"] else "empty"), answer["ready"]

    first = asyncio.create_task(poll.hold([("t", 0)], 10.0, attempt))
    await asyncio.sleep(0.01)
    answer["ready"] = True
    poll.notify("t", 0)
    assert await asyncio.wait_for(first, 5) == "data"
    answer["ready"] = False
    second = asyncio.create_task(poll.hold([("t", 0)], 0.05, attempt))
    assert await asyncio.wait_for(second, 5) == "empty"


async def test_the_peak_is_reported_once_and_a_burst_is_recognised() -> None:
    """take_peak() returns the most held since the last call, then restarts from what is held now."""
    poll = LongPoll(max_held=TRIM_AFTER_HELD * 2)
    held = await _held(poll, TRIM_AFTER_HELD)
    for t in held[1:]:
        t.cancel()
    await asyncio.gather(*held[1:], return_exceptions=True)
    peak = poll.take_peak()
    assert peak == TRIM_AFTER_HELD and burst_ended(peak, poll.held)
    assert poll.take_peak() == 1 and not burst_ended(1, poll.held)
    assert not burst_ended(TRIM_AFTER_HELD, TRIM_AFTER_HELD)  # still held: no burst has ended
    held[0].cancel()
    await asyncio.gather(held[0], return_exceptions=True)
