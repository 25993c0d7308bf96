"""The one way to wait: for an asyncio event with a timeout, or (tests, tools) for a condition.

``wait_event`` uses asyncio.timeout(), not wait_for(): on Python 3.11 wait_for() can swallow a
cancel that arrives as the event is set, and a stop() waiting for the cancelled task would hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; True when it is set."""
    if timeout is None:
        await event.wait()
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(timeout, 0.0)):
            await event.wait()
    return event.is_set()


async def cancel_and_wait(task: asyncio.Task[object] | None) -> None:
    """Cancel a background task and wait until it has finished (a stop() must not return while
    the task still runs); None is nothing to do."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# Two overloads so mypy infers T from a sync and from an async condition alike (one signature with
# ``T | Awaitable[T]`` leaves T unsolved for an async one). ``T | None`` -> ``T``: None is falsy, so
# a condition that answers "not yet" with None never has it returned.
@overload
async def wait_until(
    cond: Callable[[], Awaitable[T | None]], timeout: float, what: str = ..., *, interval: float = ...
) -> T: ...
@overload
async def wait_until(
    cond: Callable[[], T | None], timeout: float, what: str = ..., *, interval: float = ...
) -> T: ...
async def wait_until(
    cond: Callable[[], object],
    timeout: float,
    what: str = "condition",
    *,
    interval: float = 0.02,
) -> object:
    """Poll ``cond`` (sync or async) until it returns something truthy, and return that; raises
    TimeoutError naming ``what`` after ``timeout`` seconds. Bounded: never waits forever."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_until_sync(
    cond: Callable[[], T | None], timeout: float, what: str = "condition", *, interval: float = 0.02
) -> T:
    """``wait_until`` for code without an event loop (process managers, benchmarks)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)
