"""ByteBudget, table-driven: what is charged (buffered vs pinned with ``held``, reservations), when
an answer fits, when fetching is blocked and what frees it."""

from __future__ import annotations

import asyncio
import gc

import pytest

from mqd.config import ConsumerConfig
from mqd.consumer.budget import ByteBudget


class Body(bytearray):
    """Like mqd.wire.client.FetchBody: a bytearray subclass takes weak references."""


@pytest.mark.parametrize(
    ("held", "buffered", "reserved", "pinned", "left"),
    [
        (False, 0, 0, 0, 1000),
        (False, 300, 200, 900, 500),  # not held: pinned bodies are the caller's
        (True, 300, 200, 900, -100),  # held: the pinned bodies are charged
        (True, 300, 200, 100, 500),  # held, untracked batches: max(pinned, buffered)
    ],
)
def test_left(held: bool, buffered: int, reserved: int, pinned: int, left: int) -> None:
    """left() = limit - (pinned or buffered, whichever is larger when held; buffered otherwise) - reserved."""
    b = ByteBudget(1000, held=held)
    b.add_buffered(buffered)
    b.reserve(reserved)
    b.pinned = pinned
    assert b.left() == left
    assert b.exhausted() == (left <= 0)


@pytest.mark.parametrize(
    ("buffered", "nbytes", "fits"),
    [(0, 5000, True), (900, 100, True), (900, 101, False), (1000, 0, True)],
)
def test_fits(buffered: int, nbytes: int, fits: bool) -> None:
    """A batch fits within the limit; an empty buffer always takes one batch (progress)."""
    b = ByteBudget(1000)
    b.add_buffered(buffered)
    assert b.fits(nbytes) is fits


def test_block_until_freed_and_waiters_learn_of_releases() -> None:
    """block() holds every node until freed(), which calls on_freed; release() says whether a
    fetcher was waiting, once."""
    b = ByteBudget(1000)
    freed: list[int] = []
    b.on_freed = lambda: freed.append(1)
    b.block()
    assert b.blocked and b.exhausted()
    b.freed()
    assert not b.blocked and freed == [1]
    b.reserve(600)
    b.wait("m")
    assert b.release(600) is True
    assert b.release(0) is False and b.reserved == -0


def test_memory_bound() -> None:
    """memory_bound(low): blocked, or less than ``low`` left."""
    b = ByteBudget(1000)
    assert not b.memory_bound(100)
    b.reserve(950)
    assert b.memory_bound(100)
    b.release(950)
    b.block()
    assert b.memory_bound(100)


async def test_pin_charges_a_body_until_it_is_gone() -> None:
    """A pinned body is charged until garbage; a held budget is freed when it goes; plain bytes
    cannot be tracked."""
    b = ByteBudget(1000, held=True)
    freed: list[int] = []
    b.on_freed = lambda: freed.append(1)
    body = Body(300)
    assert b.pin(body, 300) and (b.pinned, b.pinned_bodies) == (300, 1)
    assert b.pin(b"plain", 5) is False
    del body
    gc.collect()
    await asyncio.sleep(0)
    assert (b.pinned, b.pinned_bodies, freed) == (0, 0, [1])


def test_one_default_the_configs() -> None:
    """The budget has no default of its own: the config's 80 MiB is the one default."""
    assert ConsumerConfig().max_buffered_bytes == 80 * 1024 * 1024
    with pytest.raises(TypeError):
        ByteBudget()  # type: ignore[call-arg]
