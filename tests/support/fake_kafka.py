"""A scripted Kafka broker on 127.0.0.1, built only from protocol structs (aiokafka's, and mqd's
own in mqd.sources.kafka.protocol_ext where aiokafka's stop), for the paths Tansu cannot show:
aborted-transaction lists, partition error codes (OFFSET_OUT_OF_RANGE, NOT_LEADER_OR_FOLLOWER),
malformed record batches served as is, leader epochs and OffsetsForLeaderEpoch (truncation).

It speaks ApiVersions v0, Metadata v1 and v10 (topic id, leader epochs), Fetch v4 (and v12 with
diverging epochs, v13 by topic id, up to ``fetch_version``), ListOffsets v2
and OffsetsForLeaderEpoch v3 (what it advertises, so the client negotiates those; ``legacy=True``
advertises Metadata v1 only and no OffsetsForLeaderEpoch), one node, one topic. Each partition's
log is a list of raw record batches (bytes, served whole from the first batch that holds the
requested offset), each stamped with its partition leader epoch; the end offset of an epoch is
computed from the log as a broker does (the first offset of a later epoch, else the log end). The
test changes ``logs``, ``errors``, ``aborted``, ``log_start``, ``leader_epoch`` and ``topic_id`` at
any time. Every Fetch is recorded in ``fetches``, every OffsetsForLeaderEpoch in ``epoch_checks``.

With ``sessions=True`` it also speaks Fetch v7 with incremental fetch sessions (KIP-227) as Kafka's
broker keeps them: a full request (id 0, epoch 0) creates one; an incremental request (its id, the
next epoch) updates the partitions it lists, drops ``forgotten_topics_data`` and is answered only for
partitions with records, new bounds or an error; an unknown id answers FETCH_SESSION_ID_NOT_FOUND, a
wrong epoch INVALID_FETCH_SESSION_EPOCH. Every v7 request is recorded in ``session_requests``;
``sessions_dropped()`` forgets every session (a broker restart or eviction).

With ``groups=True`` it is also the coordinator of any consumer group with one member, for the
paths Tansu cannot show (KIP-345's FENCED_INSTANCE_ID: Tansu hands a second process with the same
group_instance_id the first one's member id): FindCoordinator v0, JoinGroup v5 (the member is the
leader; every join is recorded in ``joins`` as (member id asked, group_instance_id)), SyncGroup v3
(the leader's own assignment back), Heartbeat v1 and LeaveGroup v1 (recorded in ``leaves``). The test
sets ``group_errors[api_key]`` to make every answer of that API carry an error code.

The consumer's side of the tests against it is here too: the topic ``T`` (``TP0``, ``TP1``), a fast
Kafka-source consumer config on the fake broker (``kafka_config``) and ``drain``, values per
partition until a condition holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any
from uuid import uuid4

import crc32c
from aiokafka.protocol.admin import ApiVersionResponse_v0
from aiokafka.protocol.coordination import FindCoordinatorResponse_v0
from aiokafka.protocol.fetch import FetchRequest_v4, FetchRequest_v7, FetchResponse_v4, FetchResponse_v7
from aiokafka.protocol.group import (
    HeartbeatRequest_v1,
    HeartbeatResponse_v1,
    JoinGroupRequest_v5,
    JoinGroupResponse_v5,
    LeaveGroupRequest_v1,
    LeaveGroupResponse_v1,
    SyncGroupRequest_v3,
    SyncGroupResponse_v3,
)
from aiokafka.protocol.metadata import MetadataResponse_v1, MetadataResponse_v5
from aiokafka.protocol.offset import OffsetRequest_v2, OffsetResponse_v2
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mqd.config import ConsumerConfig
from mqd.consumer import Consumer, FetchedBatch, TopicPartition
from mqd.sources.kafka.protocol_ext import (
    FetchRequest_v12,
    FetchRequest_v13,
    FetchResponse_v12,
    FetchResponse_v13,
    MetadataResponse_v10,
    OffsetsForLeaderEpochRequest_v3,
    OffsetsForLeaderEpochResponse_v3,
    diverging_epoch,
)
from support.consumer import FAST

API_VERSIONS = 18
METADATA = 3
FETCH = 1
LIST_OFFSETS = 2
OFFSETS_FOR_LEADER_EPOCH = 23
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
NODE_ID = 1
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_ID = 100
Header = tuple[str, bytes | None]
Rec = tuple[bytes | None, bytes | None, list[Header]]


def build(
    base: int, recs: list[Rec], codec: int = 0, *, txn: bool = False, pid: int = -1, epoch: int = 0
) -> bytes:
    """One v2 record batch from aiokafka's own builder, at ``base``, written in leader ``epoch``
    (the partition leader epoch is outside the CRC, as the broker stamps it)."""
    seq = 0 if pid >= 0 else -1
    b = DefaultRecordBatchBuilder(2, codec, int(txn), pid, seq, seq, 2**30)
    for i, (k, v, h) in enumerate(recs):
        b.append(i, 1_700_000_000_000 + i, k, v, h)
    buf = b.build()
    struct.pack_into(">q", buf, 0, base)
    struct.pack_into(">i", buf, 12, epoch)
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


def batch_epoch(batch: bytes) -> int:
    return int(struct.unpack_from(">i", batch, 12)[0])


@dataclass
class FakeKafka:
    topic: str
    partitions: int
    logs: dict[int, list[bytes]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[int, int] = field(default_factory=dict)  # partition -> error code of every answer
    aborted: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (producer id, first offset)
    log_start: dict[int, int] = field(default_factory=dict)
    fetches: list[dict[int, int]] = field(default_factory=list)  # partition -> offset, per request
    topic_id: str = field(default_factory=lambda: uuid4().hex)
    leader_epoch: dict[int, int] = field(default_factory=dict)  # partition -> epoch (default 0)
    epoch_checks: list[dict[int, int]] = field(default_factory=list)  # partition -> epoch asked
    legacy: bool = False  # Metadata v1 only, no OffsetsForLeaderEpoch
    offsets_for_leader_epoch: bool = True  # advertise OffsetsForLeaderEpoch (unless legacy)
    sessions: bool = False  # Fetch v7 with incremental fetch sessions
    # the highest Fetch version: 4, 7 (sessions), 12 (diverging epoch) or 13 (topic ids)
    fetch_version: int = 4
    fetch_versions: list[int] = field(default_factory=list)  # the version of every Fetch
    # (session id, epoch, partitions listed, partitions forgotten) per v7 request
    session_requests: list[tuple[int, int, list[int], list[int]]] = field(default_factory=list)
    # session id -> (next epoch, partition -> fetch offset, partition -> last answered high watermark)
    _sessions: dict[int, tuple[int, dict[int, int], dict[int, int]]] = field(default_factory=dict)
    groups: bool = False  # the coordinator of one-member consumer groups
    group_errors: dict[int, int] = field(default_factory=dict)  # api key -> error code of every answer
    joins: list[tuple[str, str | None]] = field(default_factory=list)  # (member id asked, instance id)
    leaves: list[str] = field(default_factory=list)  # member ids
    generation: int = 0
    port: int = 0
    _server: asyncio.Server | None = None

    def high(self, p: int) -> int:
        log = self.logs[p]
        return batch_bounds(log[-1])[1] if log else self.log_start.get(p, 0)

    def epoch_end(self, p: int, epoch: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch`` in the log, its end offset), as Kafka answers it."""
        later = [batch_bounds(b)[0] for b in self.logs[p] if batch_epoch(b) > epoch]
        known = [batch_epoch(b) for b in self.logs[p] if batch_epoch(b) <= epoch]
        if not known:
            return -1, -1
        return max(known), (later[0] if later else self.high(p))

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
                api_key, version, correlation = struct.unpack(">hhi", data.read(8))
                (n,) = struct.unpack(">h", data.read(2))
                data.read(max(n, 0))  # client id
                flexible = (api_key == METADATA and version >= 9) or (api_key == FETCH and version >= 12)
                if flexible:
                    data.read(1)  # the request header's (empty) tagged fields
                body = (await self._answer(api_key, version, data)).encode()
                head = struct.pack(">i", correlation) + (b"\x00" if flexible else b"")
                writer.write(struct.pack(">i", len(head) + len(body)) + head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            # a client gone, or the server stopping: this connection ends
            pass
        finally:
            writer.close()

    async def _answer(self, api_key: int, version: int, data: BytesIO) -> Any:
        if api_key == API_VERSIONS:
            versions = [(API_VERSIONS, 0, 0), (METADATA, 1, 1), (FETCH, 4, 4), (LIST_OFFSETS, 2, 2)]
            if self.sessions:
                versions[2] = (FETCH, 4, 7)
            if self.fetch_version > 7:
                versions[2] = (FETCH, 4, self.fetch_version)
            if self.groups:
                versions += [
                    (FIND_COORDINATOR, 0, 0),
                    (JOIN_GROUP, 5, 5),
                    (HEARTBEAT, 1, 1),
                    (LEAVE_GROUP, 1, 1),
                    (SYNC_GROUP, 3, 3),
                ]
            if not self.legacy:
                versions[1] = (METADATA, 1, 10)
                if self.offsets_for_leader_epoch:
                    versions.append((OFFSETS_FOR_LEADER_EPOCH, 3, 3))
            return ApiVersionResponse_v0(0, versions)
        if api_key == METADATA and version >= 10:
            parts10: list[tuple[Any, ...]] = [
                (0, p, NODE_ID, self.leader_epoch.get(p, 0), [NODE_ID], [NODE_ID], [], {})
                for p in range(self.partitions)
            ]
            topics: list[tuple[Any, ...]] = [(0, self.topic, self.topic_id, False, parts10, -(2**31), {})]
            return MetadataResponse_v10(
                0, [(NODE_ID, "127.0.0.1", self.port, None, {})], None, NODE_ID, topics, -(2**31), {}
            )
        if api_key == OFFSETS_FOR_LEADER_EPOCH:
            oreq = OffsetsForLeaderEpochRequest_v3.decode(data)
            answer = []
            for topic, oparts in oreq.topics:
                self.epoch_checks.append({p: epoch for p, _current, epoch in oparts})
                answer.append((topic, [(0, p, *self.epoch_end(p, epoch)) for p, _current, epoch in oparts]))
            return OffsetsForLeaderEpochResponse_v3(0, answer)
        if api_key == METADATA and version >= 5:  # aiokafka's own (bootstrap) asks v5
            parts5: list[tuple[Any, ...]] = [
                (0, p, NODE_ID, [NODE_ID], [NODE_ID], []) for p in range(self.partitions)
            ]
            return MetadataResponse_v5(
                0, [(NODE_ID, "127.0.0.1", self.port, None)], None, NODE_ID, [(0, self.topic, False, parts5)]
            )
        if api_key == METADATA:
            parts = [(0, p, NODE_ID, [NODE_ID], [NODE_ID]) for p in range(self.partitions)]
            return MetadataResponse_v1(
                [(NODE_ID, "127.0.0.1", self.port, None)], NODE_ID, [(0, self.topic, False, parts)]
            )
        if api_key == FETCH:
            self.fetch_versions.append(version)
            if version >= 12:
                return await self._fetch_flexible(version, data)
            if version >= 7:
                return await self._fetch_in_session(FetchRequest_v7.decode(data))
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
        if self.groups and api_key in (FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP):
            return self._group_answer(api_key, data, self.group_errors.get(api_key, 0))
        raise ConnectionError(f"fake broker: API {api_key} not scripted")

    def _group_answer(self, api_key: int, data: BytesIO, err: int) -> Any:
        if api_key == FIND_COORDINATOR:
            return FindCoordinatorResponse_v0(err, NODE_ID, "127.0.0.1", self.port)
        if api_key == JOIN_GROUP:
            join = JoinGroupRequest_v5.decode(data)
            self.joins.append((join.member_id, join.group_instance_id))
            member = join.member_id or f"member-{join.group_instance_id or uuid4().hex}"
            self.generation += 1
            (protocol, meta), *_ = join.group_protocols
            members = [(member, join.group_instance_id, meta)]
            return JoinGroupResponse_v5(0, err, self.generation, protocol, member, member, members)
        if api_key == SYNC_GROUP:
            sync = SyncGroupRequest_v3.decode(data)
            mine = [a for m, a in sync.group_assignment if m == sync.member_id]
            return SyncGroupResponse_v3(0, err, mine[0] if mine else b"")
        if api_key == HEARTBEAT:
            HeartbeatRequest_v1.decode(data)
            return HeartbeatResponse_v1(0, err)
        leave = LeaveGroupRequest_v1.decode(data)
        self.leaves.append(leave.member_id)
        return LeaveGroupResponse_v1(0, err)

    def sessions_dropped(self) -> None:
        self._sessions.clear()

    def _partition_answer(
        self, p: int, offset: int
    ) -> tuple[int, int, int, int, list[tuple[int, int]], bytes]:
        err = self.errors.get(p, 0)
        if not err and not self.log_start.get(p, 0) <= offset <= self.high(p):
            err = OFFSET_OUT_OF_RANGE
        if err:
            return (p, err, -1, -1, [], b"")
        data = b"".join(b for b in self.logs[p] if batch_bounds(b)[1] > offset)
        high = self.high(p)
        return (p, 0, high, high, self.aborted.get(p, []), data)

    async def _fetch_in_session(self, req: Any) -> Any:
        listed = {p: off for _topic, parts in req.topics for p, off, _start, _max in parts}
        gone = [p for _topic, parts in req.forgotten_topics_data for p in parts]
        self.session_requests.append((req.session_id, req.session_epoch, list(listed), gone))
        sid, epoch = req.session_id, req.session_epoch
        if sid == 0:  # full: epoch 0 creates a session, -1 none
            asked, highs = listed, dict[int, int]()
            if epoch == 0:
                sid = max(self._sessions, default=0) + 1
                self._sessions[sid] = (1, dict(listed), highs)
        else:
            if sid not in self._sessions:
                return FetchResponse_v7(0, 70, 0, [])
            expected, asked, highs = self._sessions[sid]
            if epoch != expected:
                return FetchResponse_v7(0, 71, 0, [])
            for p in gone:
                asked.pop(p, None)
                highs.pop(p, None)
            asked.update(listed)
            self._sessions[sid] = (expected + 1, asked, highs)
        self.fetches.append(dict(asked))
        rows = [self._partition_answer(p, off) for p, off in asked.items()]
        if req.session_id != 0:  # incremental: only what is new
            rows = [r for r in rows if r[1] or r[5] or highs.get(r[0]) != r[2]]
        for r in rows:
            highs[r[0]] = r[2]
        if not any(r[5] for r in rows):
            await asyncio.sleep(min(req.max_wait_time, 200) / 1000)  # a long poll, shortened
        out = [
            (p, err, high, lso, self.log_start.get(p, 0) if err == 0 else -1, aborted, data)
            for p, err, high, lso, aborted, data in rows
        ]
        return FetchResponse_v7(0, 0, sid, [(self.topic, out)] if out else [])

    async def _fetch_flexible(self, version: int, data: BytesIO) -> Any:
        """Fetch v12/v13 without a session: ``last_fetched_epoch`` is checked as Kafka's broker does
        (its epoch's end below the fetch offset, or a leader that never had it: diverging_epoch and
        no records); v13 names the topic by id, any other id than ``topic_id`` is UNKNOWN_TOPIC_ID."""
        req = (FetchRequest_v13 if version >= 13 else FetchRequest_v12).decode(data)
        asked: dict[int, int] = {}
        out: list[tuple[Any, list[tuple[Any, ...]], dict[int, bytes]]] = []
        any_data = False
        for key, parts, _tags in req.topics:
            rows: list[tuple[Any, ...]] = []
            for p, _current, offset, last_epoch, _start, _max, _ptags in parts:
                asked[p] = offset
                if version >= 13 and key != self.topic_id:
                    rows.append((p, UNKNOWN_TOPIC_ID, -1, -1, -1, [], -1, b"", {}))
                    continue
                if last_epoch >= 0:
                    epoch, end = self.epoch_end(p, last_epoch)
                    if epoch < last_epoch or end < offset:
                        high = self.high(p)
                        start = self.log_start.get(p, 0)
                        rows.append((p, 0, high, high, start, [], -1, b"", diverging_epoch(epoch, end)))
                        continue
                p0, err, high, lso, aborted, records = self._partition_answer(p, offset)
                any_data = any_data or bool(records)
                start = self.log_start.get(p, 0) if err == 0 else -1
                txns: list[tuple[int, int, dict[int, bytes]]] = [(pid, first, {}) for pid, first in aborted]
                rows.append((p0, err, high, lso, start, txns, -1, records, {}))
            out.append((key, rows, {}))
        self.fetches.append(asked)
        if not any_data:
            await asyncio.sleep(min(req.max_wait_time, 200) / 1000)  # a long poll, shortened
        response = FetchResponse_v13 if version >= 13 else FetchResponse_v12
        return response(0, 0, 0, out, {})

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


# the consumer's side: the topic, a consumer config on the fake broker, draining it

T = "events"
TP0, TP1 = TopicPartition(T, 0), TopicPartition(T, 1)


def kafka_config(broker: FakeKafka, tmp_path: Path, **overrides: Any) -> ConsumerConfig:
    return ConsumerConfig(
        **{
            **FAST,
            "source": "kafka",
            "mode": "broadcast",
            "consume_from": "first",
            "client_id": f"fake-{time.monotonic_ns() % 10**6}",
            "bootstrap": [broker.bootstrap],
            "topics": [T],
            "offset_file": tmp_path / "offsets.json",
            **overrides,
        }
    )


async def drain(
    consumer: Consumer,
    until: Callable[[dict[TopicPartition, list[bytes | None]]], bool],
    timeout: float = 10.0,
) -> dict[TopicPartition, list[bytes | None]]:
    """Values per partition, drained until ``until`` holds (bounded by ``timeout``)."""
    got: dict[TopicPartition, list[bytes | None]] = {}
    batches: list[FetchedBatch] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"got {got}; status {consumer.status()}")
        await consumer.wait_for_data(min(left, 0.2))
        for b in consumer.fetched_batches():
            batches.append(b)
            got.setdefault(b.tp, []).extend(b.records.column("value").to_pylist())
            consumer.mark_consumed(b.tp, b.next_offset)
    return got
