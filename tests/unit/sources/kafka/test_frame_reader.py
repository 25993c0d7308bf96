"""FrameReader: Kafka frames read as aiokafka's connection reads them (size, then body), whatever
way the socket cuts the stream: every frame comes back whole and in order, a big one as one
buffer of exactly its size from Arrow's pool, and a stream that ends inside a frame raises
IncompleteReadError."""

from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.sources.kafka.frame_reader import BIG_FRAME, MAX_IN_PLACE, FrameReader

sizes = st.lists(
    st.sampled_from([0, 1, 100, BIG_FRAME - 1, BIG_FRAME, BIG_FRAME + 7, 3 * BIG_FRAME]), max_size=5
)


def stream(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(f)) + f for f in frames)


async def read_all(frames: list[bytes], cuts: list[int]) -> list[bytes]:
    reader = FrameReader()
    data = stream(frames)

    async def feed() -> None:
        pos = 0
        for cut in [*cuts, len(data)]:
            end = min(max(pos, cut), len(data))
            if end > pos:
                reader.feed_data(data[pos:end])
            pos = end
            await asyncio.sleep(0)  # let the reader take what came
        reader.feed_eof()

    feeder = asyncio.create_task(feed())
    got = []
    for _ in frames:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        body = await reader.readexactly(size)
        assert isinstance(body, np.ndarray) == (size >= BIG_FRAME)
        got.append(bytes(body))
    await feeder
    assert reader.at_eof()
    return got


@settings(max_examples=150, deadline=None)
@given(sizes, st.data())
def test_frames_come_back_whole_however_the_stream_is_cut(
    frame_sizes: list[int], data: st.DataObject
) -> None:
    """Random contents and random socket reads (many small ones, one frame and a half, several
    frames in one read): the frames read equal the frames sent."""
    frames = [
        data.draw(st.binary(min_size=n, max_size=n)) if n < 200 else bytes([n % 251]) * n for n in frame_sizes
    ]
    total = len(stream(frames))
    cuts = sorted(data.draw(st.lists(st.integers(0, max(total, 1)), max_size=12)))
    assert asyncio.run(read_all(frames, cuts)) == frames


def test_a_frame_larger_than_any_fetch_is_not_allocated_before_it_arrives() -> None:
    """A size prefix above MAX_IN_PLACE (a damaged stream) makes no buffer of that size up front:
    the read waits on asyncio's own growing buffer, holding only what arrived."""

    async def go() -> None:
        reader = FrameReader()
        reader.feed_data(b"z" * 1000)
        task = asyncio.create_task(reader.readexactly(MAX_IN_PLACE + 1))
        await asyncio.sleep(0)
        assert reader._sink is None  # nothing allocated for it
        reader.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as err:
            await asyncio.wait_for(task, 5)
        assert err.value.partial == b"z" * 1000

    asyncio.run(go())


def test_a_stream_ending_inside_a_big_frame_is_an_incomplete_read() -> None:
    """The broker closed the connection half way through an answer: the read fails with what
    arrived, as asyncio's own readexactly does, and nothing waits for ever."""

    async def go() -> None:
        reader = FrameReader()
        reader.feed_data(struct.pack(">i", 2 * BIG_FRAME) + b"x" * 1000)
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        task = asyncio.create_task(reader.readexactly(size))
        await asyncio.sleep(0)
        reader.feed_data(b"y" * 500)
        reader.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError) as err:
            await asyncio.wait_for(task, 5)
        assert err.value.partial == b"x" * 1000 + b"y" * 500

    asyncio.run(go())
