"""Kafka answers read into one buffer of their announced size; Fetch answers handed over raw.

aiokafka reads every answer through asyncio's ``StreamReader``: the buffer grows by ``extend`` as
the answer arrives (a ~5 MB bytearray reallocated dozens of times per Fetch), ``readexactly`` copies
it out into a ``bytes``, and the protocol structs copy each partition's records out again. On the
Kafka source that was three transient copies of every answer in the event loop's heap, and the
holes they left between long-lived decoded records were most of the daemon's memory above its
idle baseline (docs/decisions/043-fetch-answers-in-place-jemalloc.md).

Here a connection of mqd's client reads an answer of at least ``BIG_FRAME`` bytes straight into a
buffer of its size from Arrow's pool (:func:`answer_buffer`; a kernel copy, then one copy per socket
read into place; no growth, no copy out), and an answer to a request whose struct says ``RAW_ANSWER``
(mqd's Fetch v12 and v13) is handed to the caller as a :class:`RawAnswer`, which
``mqd.sources.kafka.fetch_answer`` parses in place: the records stay memoryviews of the body until
the decoder copies them into its arena. Every other answer takes aiokafka's own path.

aiokafka creates its connections itself, so :class:`FrameClient` upgrades each one it hands out:
the connection and its reader get this module's subclasses, which add behaviour and no state
aiokafka could miss. It is tied to aiokafka's connection internals (``_requests``,
``_handle_frame``, a ``StreamReader`` read by ``readexactly``), which is why pyproject pins
aiokafka's version; a connection that is not aiokafka's own class is left as it is.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka.client import AIOKafkaClient
from aiokafka.conn import AIOKafkaConnection, CloseReason
from aiokafka.errors import CorrelationIdError

from mqd.lazy_import import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pyarrow as pa
else:  # the first answer, not the start, imports them (docs/decisions/047-*.md)
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")

# answers from this size on are read in place: the small ones (metadata, heartbeats, commits) stay
# on aiokafka's path, where a copy costs nothing
BIG_FRAME = 64 * 1024
# nor is a buffer of a size no Fetch asks for made before its bytes arrive (a damaged size prefix
# must not allocate gigabytes at once): such a frame grows as aiokafka's does
MAX_IN_PLACE = 512 * 1024 * 1024
_INT32 = struct.Struct(">i")


def answer_buffer(n: int) -> npt.NDArray[np.uint8]:
    """``n`` writable bytes from Arrow's pool, left as they are (the socket fills them). In the
    pool with the decoder's arenas and the landing's encoder, an answer's memory is reused by
    whichever needs it next, not kept as a hole in glibc's heap; an ndarray takes weak
    references, so the byte budget pins it until its last view is gone."""
    return np.frombuffer(pa.allocate_buffer(n), np.uint8)


def answer_view(body: bytes | npt.NDArray[np.uint8]) -> memoryview:
    """The bytes of an answer as one memoryview (its slices keep the body alive)."""
    return memoryview(body)  # type: ignore[arg-type]  # numpy's stubs lack __buffer__ before 3.12


@dataclass(frozen=True)
class RawAnswer:
    """An answer to a ``RAW_ANSWER`` request: the frame after the size prefix (correlation id
    first) and the version it answers."""

    version: int
    # an answer_buffer from the connection; bytes where a test builds one
    body: bytes | npt.NDArray[np.uint8]


class FrameReader(asyncio.StreamReader):
    """A StreamReader whose ``readexactly`` of a big frame fills one buffer of the frame's size:
    what is already buffered is moved in, and every later read lands in place (``feed_data``)."""

    _sink: memoryview | None = None
    _filled = 0

    def feed_data(self, data: bytes) -> None:  # type: ignore[override]  # the protocol passes bytes
        sink = self._sink
        if sink is None:
            super().feed_data(data)
            return
        pos = self._filled
        take = min(len(data), len(sink) - pos)
        sink[pos : pos + take] = data if take == len(data) else memoryview(data)[:take]
        self._filled = pos + take
        if take < len(data):
            super().feed_data(memoryview(data)[take:])
        elif self._filled == len(sink):
            self._wakeup_waiter()  # type: ignore[attr-defined]  # asyncio's StreamReader

    async def readexactly(self, n: int) -> bytes:
        if not BIG_FRAME <= n <= MAX_IN_PLACE:
            return await super().readexactly(n)
        body = answer_buffer(n)
        view = answer_view(body)
        buffered: bytearray = self._buffer  # type: ignore[attr-defined]
        have = min(len(buffered), n)
        if have:
            view[:have] = buffered[:have]
            del buffered[:have]
        self._filled = have
        try:
            if have < n:
                self._sink = view
                while self._filled < n:
                    if self._exception is not None:  # type: ignore[attr-defined]
                        raise self._exception  # type: ignore[attr-defined]
                    if self._eof:  # type: ignore[attr-defined]
                        raise asyncio.IncompleteReadError(bytes(view[: self._filled]), n)
                    await self._wait_for_data("readexactly")  # type: ignore[attr-defined]
        finally:
            self._sink = None
            view.release()
        self._maybe_resume_transport()  # type: ignore[attr-defined]
        return body  # type: ignore[return-value]  # only FrameConnection._handle_frame sees it


class FrameConnection(AIOKafkaConnection):  # type: ignore[misc]  # aiokafka is untyped
    """An aiokafka connection that hands ``RAW_ANSWER`` answers over unparsed."""

    def _handle_frame(self, resp: bytes | npt.NDArray[np.uint8]) -> None:
        correlation_id, request, fut = self._requests[0]
        if correlation_id is None or not getattr(request, "RAW_ANSWER", False):
            # aiokafka parses from a BytesIO, which shares a bytes object but copies anything else
            super()._handle_frame(resp if isinstance(resp, bytes) else resp.tobytes())
            return
        got = _INT32.unpack_from(answer_view(resp))[0] if len(resp) >= 4 else None
        if got != correlation_id:
            if not fut.done():
                fut.set_exception(
                    CorrelationIdError(f"Correlation ids do not match: sent {correlation_id}, recv {got}")
                )
            self.close(reason=CloseReason.OUT_OF_SYNC)
            return
        if not fut.done():
            # a small answer is copied into the pool too, so the budget can pin it
            if isinstance(resp, bytes):
                body = answer_buffer(len(resp))
                body[:] = memoryview(resp)
            else:
                body = resp
            fut.set_result(RawAnswer(request.API_VERSION, body))
        self._last_action = time.monotonic()
        self._requests.popleft()


def upgrade(conn: Any) -> None:
    """Give an aiokafka connection and its reader this module's behaviour (once; a connection of
    another class is left alone)."""
    if type(conn) is AIOKafkaConnection:
        conn.__class__ = FrameConnection
    reader = getattr(conn, "_reader", None)
    if type(reader) is asyncio.StreamReader:
        reader.__class__ = FrameReader


class FrameClient(AIOKafkaClient):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka's client whose connections read big answers in place and pass raw ones through."""

    async def _get_conn(self, node_id: Any, **kwargs: Any) -> Any:
        conn = await super()._get_conn(node_id, **kwargs)
        if conn is not None:
            upgrade(conn)
        return conn
