"""A scripted Kafka broker on 127.0.0.1, built only from aiokafka's own protocol structs, for the
paths Tansu cannot show: aborted-transaction lists, partition error codes (OFFSET_OUT_OF_RANGE,
NOT_LEADER_OR_FOLLOWER) and malformed record batches served as is.

It speaks ApiVersions v0, Metadata v1, Fetch v4 and ListOffsets v2 (what it advertises, so the
client negotiates those), one node, one topic. Each partition's log is a list of raw record batches
(bytes, served whole from the first batch that holds the requested offset); the test changes
``errors``, ``aborted`` and ``log_start`` at any time. Every Fetch is recorded in ``fetches``.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import defaultdict
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

import crc32c
from aiokafka.protocol.admin import ApiVersionResponse_v0
from aiokafka.protocol.fetch import FetchRequest_v4, FetchResponse_v4
from aiokafka.protocol.metadata import MetadataResponse_v1
from aiokafka.protocol.offset import OffsetRequest_v2, OffsetResponse_v2
from aiokafka.record.default_records import DefaultRecordBatchBuilder

API_VERSIONS = 18
METADATA = 3
FETCH = 1
LIST_OFFSETS = 2
NODE_ID = 1
OFFSET_OUT_OF_RANGE = 1
Header = tuple[str, bytes | None]
Rec = tuple[bytes | None, bytes | None, list[Header]]


def build(base: int, recs: list[Rec], codec: int = 0, *, txn: bool = False, pid: int = -1) -> bytes:
    """One v2 record batch from aiokafka's own builder, at ``base``."""
    seq = 0 if pid >= 0 else -1
    b = DefaultRecordBatchBuilder(2, codec, int(txn), pid, seq, seq, 2**30)
    for i, (k, v, h) in enumerate(recs):
        b.append(i, 1_700_000_000_000 + i, k, v, h)
    buf = b.build()
    struct.pack_into(">q", buf, 0, base)
    return bytes(buf)


def values(base: int, *vals: bytes, **kw: Any) -> bytes:
    return build(base, [(None, v, []) for v in vals], **kw)


def control(base: int, pid: int, commit: bool) -> bytes:
    """A transaction marker: a builder batch flagged as control, its CRC-32C recomputed."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    buf = bytearray(build(base, [(key, struct.pack(">hi", 0, 0), [])], txn=True, pid=pid))
    attrs = struct.unpack_from(">h", buf, 21)[0] | 0x20
    struct.pack_into(">h", buf, 21, attrs)
    return recrc(buf)


def recrc(buf: bytes | bytearray) -> bytes:
    """The batch with its CRC-32C made right again (to hand-craft malformed records that pass it)."""
    out = bytearray(buf)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def batch_bounds(batch: bytes) -> tuple[int, int]:
    """(base offset, next offset) of one v2 record batch."""
    base = struct.unpack_from(">q", batch, 0)[0]
    last_delta = struct.unpack_from(">i", batch, 23)[0]
    return base, base + last_delta + 1


@dataclass
class FakeKafka:
    topic: str
    partitions: int
    logs: dict[int, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[int, int] = field(default_factory=dict)  # partition -> error code of every answer
    aborted: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (producer id, first offset)
    log_start: dict[int, int] = field(default_factory=dict)
    fetches: list[dict[int, int]] = field(default_factory=list)  # partition -> offset, per request
    port: int = 0
    _server: asyncio.Server | None = None

    def high(self, p: int) -> int:
        log = self.logs[p]
        return batch_bounds(log[-1])[1] if log else self.log_start.get(p, 0)

    async def start(self) -> FakeKafka:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                data = BytesIO(await reader.readexactly(size))
                api_key, _version, correlation = struct.unpack(">hhi", data.read(8))
                (n,) = struct.unpack(">h", data.read(2))
                data.read(max(n, 0))  # client id
                body = (await self._answer(api_key, data)).encode()
                writer.write(struct.pack(">ii", len(body) + 4, correlation) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            # a client gone, or the server stopping: this connection ends
            pass
        finally:
            writer.close()

    async def _answer(self, api_key: int, data: BytesIO) -> Any:
        if api_key == API_VERSIONS:
            versions = [(API_VERSIONS, 0, 0), (METADATA, 1, 1), (FETCH, 4, 4), (LIST_OFFSETS, 2, 2)]
            return ApiVersionResponse_v0(0, versions)
        if api_key == METADATA:
            parts = [(0, p, NODE_ID, [NODE_ID], [NODE_ID]) for p in range(self.partitions)]
            return MetadataResponse_v1(
                [(NODE_ID, "127.0.0.1", self.port, None)], NODE_ID, [(0, self.topic, False, parts)]
            )
        if api_key == FETCH:
            return await self._fetch(FetchRequest_v4.decode(data))
        if api_key == LIST_OFFSETS:
            req = OffsetRequest_v2.decode(data)
            out: list[tuple[str, list[tuple[int, int, int, int]]]] = []
            for topic, parts in req.topics:
                rows = []
                for p, ts in parts:
                    offset = self.log_start.get(p, 0) if ts == -2 else self.high(p)
                    rows.append((p, 0, -1, offset))
                out.append((topic, rows))
            return OffsetResponse_v2(0, out)
        raise ConnectionError(f"fake broker: API {api_key} not scripted")

    async def _fetch(self, req: Any) -> Any:
        asked = {p: off for _topic, parts in req.topics for p, off, _max in parts}
        self.fetches.append(asked)
        out: list[tuple[int, int, int, int, list[tuple[int, int]], bytes]] = []
        any_data = False
        for p, offset in asked.items():
            err = self.errors.get(p, 0)
            if not err and not self.log_start.get(p, 0) <= offset <= self.high(p):
                err = OFFSET_OUT_OF_RANGE
            if err:
                out.append((p, err, -1, -1, [], b""))
                continue
            data = b"".join(b for b in self.logs[p] if batch_bounds(b)[1] > offset)
            any_data = any_data or bool(data)
            high = self.high(p)
            out.append((p, 0, high, high, self.aborted.get(p, []), data))
        if not any_data:
            await asyncio.sleep(min(req.max_wait_time, 200) / 1000)  # a long poll, shortened
        return FetchResponse_v4(0, [(self.topic, out)])
