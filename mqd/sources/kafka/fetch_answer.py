"""A Fetch v12/v13 answer parsed in place: each partition's records a memoryview of the answer.

``mqd.sources.kafka.frame_reader`` hands the answer over as one buffer; this walks it field by
field (a few per partition, never per record) and gives the same shape aiokafka's struct decoding
gives (``API_VERSION``, ``error_code``, ``session_id``, ``topics``: (topic or topic id, partitions),
each partition the schema's tuple in order), so ``protocol_ext.fetched_partitions`` reads both.
The records stay views of the body, which lives until the decoder has copied the last of them.

Layout (flexible versions, KIP-482): response header v1 (correlation id, tagged fields); throttle,
error code, session id; topics as a compact array of (name or 16-byte id, partitions, tags); a
partition: index, error code, high watermark, last stable offset, log start, aborted transactions
(compact nullable array of (producer id, first offset, tags)), preferred read replica, records
(compact nullable bytes), tags (0: diverging epoch).
"""

from __future__ import annotations

import struct
from typing import Any

from mqd.sources.kafka.frame_reader import RawAnswer, answer_view

_I32 = struct.Struct(">i")
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error code, high watermark, LSO, log start
_ABORTED = struct.Struct(">qq")
_TOP = struct.Struct(">ihi")  # throttle, error code, session id


class MalformedAnswer(ValueError):
    """The answer does not parse as the Fetch version it answers."""


class FetchAnswer:
    """A parsed Fetch answer, shaped as aiokafka's decoded response struct."""

    __slots__ = ("API_VERSION", "body", "error_code", "session_id", "throttle_time_ms", "topics")

    def __init__(self, version: int, body: Any, top: tuple[int, int, int], topics: list[Any]) -> None:
        self.API_VERSION = version
        self.body = body
        self.throttle_time_ms, self.error_code, self.session_id = top
        self.topics = topics


class _Cursor:
    """A read position in a buffer; every read checks its bounds."""

    __slots__ = ("mv", "pos", "size")

    def __init__(self, mv: memoryview, pos: int) -> None:
        self.mv, self.pos, self.size = mv, pos, len(mv)

    def need(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.size:
            raise MalformedAnswer(f"truncated at byte {start} (wanted {n} more of {self.size})")
        self.pos = start + n
        return start

    def unpack(self, st: struct.Struct) -> tuple[Any, ...]:
        return st.unpack_from(self.mv, self.need(st.size))

    def uvarint(self) -> int:
        value = shift = 0
        mv, pos, size = self.mv, self.pos, self.size
        while pos < size and shift < 35:
            b = mv[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return value
            shift += 7
        raise MalformedAnswer(f"bad unsigned varint at byte {self.pos}")

    def view(self, n: int) -> memoryview:
        start = self.need(n)
        return self.mv[start : start + n]

    def tags(self) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = bytes(self.view(self.uvarint()))
        return out

    def count(self) -> int:
        """A compact array's length; -1 for null."""
        return self.uvarint() - 1


def parse_fetch_answer(raw: RawAnswer) -> FetchAnswer:
    """Parse a Fetch v12 or v13 answer; MalformedAnswer names what does not fit."""
    if raw.version not in (12, 13):
        raise MalformedAnswer(f"Fetch v{raw.version} answers are not parsed in place")
    cur = _Cursor(answer_view(raw.body), 4)  # after the correlation id, checked by the connection
    cur.tags()  # response header v1
    top = cur.unpack(_TOP)
    topics: list[Any] = []
    by_id = raw.version >= 13
    for _ in range(max(cur.count(), 0)):
        key = bytes(cur.view(16)).hex() if by_id else str(cur.view(cur.count()), "utf-8")
        parts: list[tuple[Any, ...]] = []
        for _ in range(max(cur.count(), 0)):
            head = cur.unpack(_PARTITION_HEAD)
            aborted = []
            for _ in range(max(cur.count(), 0)):
                pid, first = cur.unpack(_ABORTED)
                aborted.append((pid, first, cur.tags()))
            (replica,) = cur.unpack(_I32)
            n = cur.count()
            records = cur.view(n) if n >= 0 else None
            parts.append((*head, aborted, replica, records, cur.tags()))
        cur.tags()
        topics.append((key, parts))
    cur.tags()
    if cur.pos != cur.size:
        raise MalformedAnswer(f"{cur.size - cur.pos} bytes after the answer's end")
    return FetchAnswer(raw.version, raw.body, top, topics)


def parsed_fetch(resp: Any) -> Any:
    """Any Fetch answer as aiokafka's decoding shapes it: one read in place (a ``RawAnswer``, mqd's
    v12/v13 of 64 KiB or more) is parsed here as views of its body; any other arrives parsed.
    MalformedAnswer when a raw body does not parse."""
    return parse_fetch_answer(resp) if isinstance(resp, RawAnswer) else resp
