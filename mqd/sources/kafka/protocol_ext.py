"""Kafka protocol structs beyond aiokafka 0.14's, on aiokafka's own protocol types.

aiokafka's structs stop at Metadata v5 and Fetch v11 and have no OffsetsForLeaderEpoch; the Kafka
source needs topic ids (Metadata v10+) and leader epochs (Metadata v7+, OffsetsForLeaderEpoch v2+)
to tell a log's incarnation. Each request here is an aiokafka ``Request``: the version is negotiated
per connection against the broker's ApiVersions like aiokafka's own (the highest both know), and a
broker that knows only older versions gets aiokafka's structs (Metadata) or an
IncompatibleBrokerVersion the caller turns into "not supported" (OffsetsForLeaderEpoch).

``split_metadata`` turns any Metadata answer into the v5 shape every existing reader expects
(aiokafka's ClusterMetadata, mqd.sources.kafka.metadata.to_cluster) plus the topic ids and leader
epochs it carried (empty when the broker answered an older version).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from io import BytesIO
from typing import Any, TypeAlias

from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.fetch import FetchRequest as _AioFetchRequest
from aiokafka.protocol.fetch import (
    FetchRequest_v4,
    FetchRequest_v5,
    FetchRequest_v6,
    FetchRequest_v7,
    FetchRequest_v8,
    FetchRequest_v9,
    FetchRequest_v10,
    FetchRequest_v11,
)
from aiokafka.protocol.metadata import (
    MetadataRequest as _AioMetadataRequest,
)
from aiokafka.protocol.metadata import (
    MetadataRequest_v1,
    MetadataRequest_v2,
    MetadataRequest_v3,
    MetadataRequest_v4,
    MetadataRequest_v5,
    MetadataResponse_v5,
)
from aiokafka.protocol.types import (
    Array,
    Boolean,
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
    UnsignedVarInt32,
)

from mqd.topic_partition import TopicPartition

NO_TOPIC_ID = "0" * 32  # Kafka's zero UUID: the broker has no id for the topic


class Uuid(AbstractType[str]):  # type: ignore[misc]  # aiokafka is untyped
    """A Kafka UUID (16 raw bytes) as 32 lowercase hex chars."""

    @classmethod
    def encode(cls, value: str) -> bytes:
        return bytes.fromhex(value)

    @classmethod
    def decode(cls, data: BytesIO) -> str:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("truncated UUID")
        return raw.hex()


# -- Metadata v10 (flexible; topic ids) ----------------------------------------------------------


class MetadataResponse_v10(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("topic", CompactString("utf-8")),
                ("topic_id", Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader", Int32),
                        ("leader_epoch", Int32),
                        ("replicas", CompactArray(Int32)),
                        ("isr", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", TaggedFields),
    )


class MetadataRequest_v10(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 10
    RESPONSE_TYPE = MetadataResponse_v10
    SCHEMA = Schema(
        # null: every topic
        (
            "topics",
            CompactArray(("topic_id", Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


MetadataStruct: TypeAlias = (
    MetadataRequest_v1
    | MetadataRequest_v2
    | MetadataRequest_v3
    | MetadataRequest_v4
    | MetadataRequest_v5
    | MetadataRequest_v10
)


class MetadataRequest(Request[MetadataStruct]):  # type: ignore[misc]  # aiokafka is untyped
    """Metadata for ``topics`` (None: all): v10 where the broker knows it, else aiokafka's v1-v5."""

    API_KEY = 3

    def __init__(self, topics: list[str] | None = None) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[MetadataStruct]) -> MetadataStruct:
        if request_struct_class is MetadataRequest_v10:
            topics: list[tuple[str, str, dict[int, bytes]]] | None = (
                None if self._topics is None else [(NO_TOPIC_ID, t, {}) for t in self._topics]
            )
            return MetadataRequest_v10(topics, False, False, False, {})
        return _AioMetadataRequest(self._topics).build(request_struct_class)


def split_metadata(resp: Any) -> tuple[Any, dict[str, str], dict[TopicPartition, int]]:
    """(the answer in aiokafka's v1-v5 shape, topic -> topic id, partition -> leader epoch).

    Topic ids are 32 lowercase hex chars; a broker without ids (an older version, or the zero UUID)
    contributes none. Leader epochs come only with v10 here (v7-v9 are never negotiated)."""
    if resp.API_VERSION < 10:
        return resp, {}, {}
    topic_ids: dict[str, str] = {}
    epochs: dict[TopicPartition, int] = {}
    topics = []
    for error_code, name, topic_id, internal, parts, _ops, _tags in resp.topics:
        if error_code == 0 and topic_id != NO_TOPIC_ID:
            topic_ids[name] = topic_id
        legacy = []
        for p_error, partition, leader, epoch, replicas, isr, offline, _ptags in parts:
            legacy.append((p_error, partition, leader, replicas, isr, offline))
            if p_error == 0 and epoch >= 0:
                epochs[TopicPartition(name, partition)] = epoch
        topics.append((error_code, name, internal, legacy))
    brokers = [(node_id, host, port, rack) for node_id, host, port, rack, _tags in resp.brokers]
    v5 = MetadataResponse_v5(resp.throttle_time_ms, brokers, resp.cluster_id, resp.controller_id, topics)
    return v5, topic_ids, epochs


# -- OffsetsForLeaderEpoch v2-v3 (KIP-101/KIP-320) -----------------------------------------------

_OFLE_RESPONSE = Schema(
    ("throttle_time_ms", Int32),
    (
        "topics",
        Array(
            ("topic", String("utf-8")),
            (
                "partitions",
                Array(
                    ("error_code", Int16),
                    ("partition", Int32),
                    ("leader_epoch", Int32),
                    ("end_offset", Int64),
                ),
            ),
        ),
    ),
)
_OFLE_TOPICS = Array(
    ("topic", String("utf-8")),
    (
        "partitions",
        Array(("partition", Int32), ("current_leader_epoch", Int32), ("leader_epoch", Int32)),
    ),
)


class OffsetsForLeaderEpochResponse_v2(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 23
    API_VERSION = 2
    SCHEMA = _OFLE_RESPONSE


class OffsetsForLeaderEpochResponse_v3(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 23
    API_VERSION = 3
    SCHEMA = _OFLE_RESPONSE


class OffsetsForLeaderEpochRequest_v2(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 23
    API_VERSION = 2
    RESPONSE_TYPE = OffsetsForLeaderEpochResponse_v2
    SCHEMA = Schema(("topics", _OFLE_TOPICS))


class OffsetsForLeaderEpochRequest_v3(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 23
    API_VERSION = 3
    RESPONSE_TYPE = OffsetsForLeaderEpochResponse_v3
    SCHEMA = Schema(("replica_id", Int32), ("topics", _OFLE_TOPICS))


OffsetsForLeaderEpochStruct: TypeAlias = OffsetsForLeaderEpochRequest_v2 | OffsetsForLeaderEpochRequest_v3


class OffsetsForLeaderEpochRequest(Request[OffsetsForLeaderEpochStruct]):  # type: ignore[misc]  # aiokafka is untyped
    """The end offset of ``leader_epoch`` on the partition's current leader, per partition:
    ``{topic: [(partition, leader_epoch)]}``; the current leader epoch is sent as -1 (unknown)."""

    API_KEY = 23

    def __init__(self, topics: dict[str, list[tuple[int, int]]]) -> None:
        self._topics = [(t, [(p, -1, epoch) for p, epoch in parts]) for t, parts in topics.items()]

    def build(self, request_struct_class: type[OffsetsForLeaderEpochStruct]) -> OffsetsForLeaderEpochStruct:
        if request_struct_class is OffsetsForLeaderEpochRequest_v3:
            return OffsetsForLeaderEpochRequest_v3(-1, self._topics)
        return OffsetsForLeaderEpochRequest_v2(self._topics)


def epoch_end_offsets(resp: Any) -> dict[TopicPartition, tuple[int, int, int]]:
    """An OffsetsForLeaderEpoch answer as partition -> (error code, leader epoch, end offset)."""
    out: dict[TopicPartition, tuple[int, int, int]] = {}
    for topic, parts in resp.topics:
        for error_code, partition, epoch, end_offset in parts:
            out[TopicPartition(topic, partition)] = (error_code, epoch, end_offset)
    return out


# -- Fetch v4-v13: current leader epoch (KIP-320), sessions (KIP-227), topic ids (KIP-516) -----


class Tags(AbstractType[dict[int, bytes]]):  # type: ignore[misc]  # aiokafka is untyped
    """Tagged fields as {tag: raw bytes}; unlike aiokafka's TaggedFields it encodes tag 0 too (Fetch
    v12's diverging_epoch is tag 0)."""

    @classmethod
    def encode(cls, value: dict[int, bytes]) -> bytes:
        out = UnsignedVarInt32.encode(len(value))
        for tag in sorted(value):
            out += UnsignedVarInt32.encode(tag) + UnsignedVarInt32.encode(len(value[tag])) + value[tag]
        return bytes(out)

    @classmethod
    def decode(cls, data: BytesIO) -> dict[int, bytes]:
        return dict(TaggedFields.decode(data))


def _fetch_request_schema(topic: Any) -> Schema:
    return Schema(
        ("replica_id", Int32),
        ("max_wait_time", Int32),
        ("min_bytes", Int32),
        ("max_bytes", Int32),
        ("isolation_level", Int8),
        ("session_id", Int32),
        ("session_epoch", Int32),
        (
            "topics",
            CompactArray(
                topic,
                (
                    "partitions",
                    CompactArray(
                        ("partition", Int32),
                        ("current_leader_epoch", Int32),
                        ("fetch_offset", Int64),
                        ("last_fetched_epoch", Int32),
                        ("log_start_offset", Int64),
                        ("max_bytes", Int32),
                        ("tags", Tags),
                    ),
                ),
                ("tags", Tags),
            ),
        ),
        ("forgotten_topics_data", CompactArray(topic, ("partitions", CompactArray(Int32)), ("tags", Tags))),
        ("rack_id", CompactString("utf-8")),
        ("tags", Tags),
    )


def _fetch_response_schema(topic: Any) -> Schema:
    return Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("session_id", Int32),
        (
            "topics",
            CompactArray(
                topic,
                (
                    "partitions",
                    CompactArray(
                        ("partition", Int32),
                        ("error_code", Int16),
                        ("highwater_offset", Int64),
                        ("last_stable_offset", Int64),
                        ("log_start_offset", Int64),
                        (
                            "aborted_transactions",
                            CompactArray(("producer_id", Int64), ("first_offset", Int64), ("tags", Tags)),
                        ),
                        ("preferred_read_replica", Int32),
                        ("message_set", CompactBytes),
                        ("tags", Tags),  # 0: diverging_epoch, 1: current_leader, 2: snapshot_id
                    ),
                ),
                ("tags", Tags),
            ),
        ),
        ("tags", Tags),
    )


class FetchResponse_v12(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 1
    API_VERSION = 12
    SCHEMA = _fetch_response_schema(("topic", CompactString("utf-8")))


class FetchResponse_v13(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 1
    API_VERSION = 13
    SCHEMA = _fetch_response_schema(("topic_id", Uuid))


class FetchRequest_v12(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    """KIP-320 in the fetch path: each partition carries the leader epoch of the record before its
    fetch offset; a log that diverged from it answers ``diverging_epoch`` (a tagged field)."""

    FLEXIBLE_VERSION = True
    RAW_ANSWER = True  # read in place: mqd.sources.kafka.frame_reader, fetch_answer
    API_KEY = 1
    API_VERSION = 12
    RESPONSE_TYPE = FetchResponse_v12
    SCHEMA = _fetch_request_schema(("topic", CompactString("utf-8")))


class FetchRequest_v13(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    """KIP-516: topics named by topic id; a recreated topic answers UNKNOWN_TOPIC_ID."""

    FLEXIBLE_VERSION = True
    RAW_ANSWER = True
    API_KEY = 1
    API_VERSION = 13
    RESPONSE_TYPE = FetchResponse_v13
    SCHEMA = _fetch_request_schema(("topic_id", Uuid))


FetchStruct: TypeAlias = (
    FetchRequest_v4
    | FetchRequest_v5
    | FetchRequest_v6
    | FetchRequest_v7
    | FetchRequest_v8
    | FetchRequest_v9
    | FetchRequest_v10
    | FetchRequest_v11
    | FetchRequest_v12
    | FetchRequest_v13
)


class FetchRequest(Request[FetchStruct]):  # type: ignore[misc]  # aiokafka is untyped
    """A Fetch in the highest version both sides know, from v4 (aiokafka's structs up to v11, mqd's
    v12 and v13). Beyond what aiokafka sends: each partition's current leader epoch (v9+; aiokafka
    sends -1, unknown), so a leader of a newer epoch answers FENCED_LEADER_EPOCH rather than records
    of a log whose divergence we have not checked; the fetch session (v7+,
    mqd.sources.kafka.fetch_session: its id, epoch and forgotten partitions; aiokafka sends none);
    the leader epoch of the record before each fetch offset (v12+, ``last_epochs``; -1 unknown); and
    topics by topic id (v13+, ``topic_ids``: topic -> id); the client's rack (v11+, ``rack_id``, KIP-392:
    a leader with a replica selector may name a follower to read from). v13 is sent only when every
    topic of the request has an id; otherwise v12 goes out (a broker that knows v13 knows v12).
    ``leader_epochs`` and ``last_epochs``: (topic, partition) -> epoch."""

    API_KEY = 1

    def __init__(
        self,
        max_wait_time: int,
        min_bytes: int,
        max_bytes: int,
        isolation_level: int,
        topics: list[tuple[str, list[tuple[int, int, int]]]],
        leader_epochs: Mapping[TopicPartition, int] | None = None,
        session_id: int = 0,
        session_epoch: int = -1,
        forgotten: list[tuple[str, list[int]]] | None = None,
        last_epochs: Mapping[TopicPartition, int] | None = None,
        topic_ids: Mapping[str, str] | None = None,
        rack_id: str = "",
    ) -> None:
        self._args = (max_wait_time, min_bytes, max_bytes, isolation_level)
        self._rack_id = rack_id
        self._topics = topics
        self._leader_epochs = leader_epochs or {}
        self._session = (session_id, session_epoch, forgotten or [])
        self._last_epochs = last_epochs or {}
        self._topic_ids = topic_ids or {}

    @property
    def topics(self) -> list[tuple[str, list[tuple[int, int, int]]]]:
        return self._topics

    def build(self, request_struct_class: type[FetchStruct]) -> FetchStruct:
        version = request_struct_class.API_VERSION
        if version >= 12:
            return self._build_flexible(version)
        req = _AioFetchRequest(*self._args, self._topics, self._rack_id).build(request_struct_class)
        if version >= 9 and self._leader_epochs:
            epochs = self._leader_epochs
            req.topics = [
                (t, [(p, epochs.get(TopicPartition(t, p), -1), *rest) for p, _unknown, *rest in parts])
                for t, parts in req.topics
            ]
        if version >= 7:
            req.session_id, req.session_epoch, req.forgotten_topics_data = self._session
        return req

    def _build_flexible(self, version: int) -> FetchRequest_v12 | FetchRequest_v13:
        session_id, session_epoch, forgotten = self._session
        ids = self._topic_ids
        names = {t for t, _ in self._topics} | {t for t, _ in forgotten}
        by_id = version >= 13 and all(ids.get(t, NO_TOPIC_ID) != NO_TOPIC_ID for t in names)
        key = (lambda t: ids[t]) if by_id else (lambda t: t)
        epochs, last = self._leader_epochs, self._last_epochs
        topics: list[tuple[Any, ...]] = []
        for t, parts in self._topics:
            rows: list[tuple[Any, ...]] = []
            for p, offset, max_bytes in parts:
                tp = TopicPartition(t, p)
                rows.append((p, epochs.get(tp, -1), offset, last.get(tp, -1), -1, max_bytes, {}))
            topics.append((key(t), rows, {}))
        gone: list[tuple[Any, ...]] = [(key(t), parts, {}) for t, parts in forgotten]
        cls = FetchRequest_v13 if by_id else FetchRequest_v12
        return cls(-1, *self._args, session_id, session_epoch, topics, gone, self._rack_id, {})


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch answer of any version, named by topic; -1 where the version has no
    such field. ``diverging``: (epoch, end offset) when the broker said the fetch position's epoch
    diverged (v12+), else None."""

    topic: str | None  # None: a v13 topic id this client does not know
    topic_id: str | None
    partition: int
    error_code: int
    highwater: int
    last_stable: int
    log_start: int
    aborted: list[tuple[int, int]]
    preferred_replica: int
    records: bytes | memoryview | None  # a view of the answer where it was read in place
    diverging: tuple[int, int] | None


_DIVERGING = struct.Struct(">iq")


def fetched_partitions(resp: Any, names: Mapping[str, str]) -> list[FetchedPartition]:
    """A Fetch answer (aiokafka's v4-v11, mqd's v12-v13, or fetch_answer's FetchAnswer of the same
    shape) as one list; ``names``: topic id -> topic, for v13 answers."""
    version = resp.API_VERSION
    out: list[FetchedPartition] = []
    for topic_key, parts in ((t[0], t[1]) for t in resp.topics):
        topic, topic_id = (names.get(topic_key), topic_key) if version >= 13 else (topic_key, None)
        for part in parts:
            diverging = None
            if version >= 12:
                raw = part[8].get(0)
                if raw is not None and len(raw) >= _DIVERGING.size:
                    epoch, end = _DIVERGING.unpack_from(raw)
                    diverging = (epoch, end) if epoch >= 0 and end >= 0 else None
                aborted = [(pid, first) for pid, first, _tags in part[5] or ()]
                records = part[7]
            else:
                aborted = list((part[5] if version >= 5 else part[4]) or ())
                records = part[-1]
            out.append(
                FetchedPartition(
                    topic=topic,
                    topic_id=topic_id,
                    partition=part[0],
                    error_code=part[1],
                    highwater=part[2],
                    last_stable=part[3],
                    log_start=part[4] if version >= 5 else -1,
                    aborted=aborted,
                    preferred_replica=part[6] if version >= 11 else -1,
                    records=records,
                    diverging=diverging,
                )
            )
    return out


def diverging_epoch(epoch: int, end_offset: int) -> dict[int, bytes]:
    """The tagged field a v12+ answer carries for a diverged partition (for scripted brokers)."""
    return {0: _DIVERGING.pack(epoch, end_offset) + b"\x00"}


# -- KIP-848: ConsumerGroupHeartbeat v1, OffsetCommit v9, OffsetFetch v9 --------------------------
# Verified on Apache Kafka 4.4 (ApiVersions): ConsumerGroupHeartbeat 0-1, OffsetCommit 2-10,
# OffsetFetch 1-10. v1 of the heartbeat has the client make its member id (KIP-1082); OffsetCommit
# v9 / OffsetFetch v9 are the first a consumer-protocol member may use (they carry its member id and
# epoch; v10 names topics by id only). Each Request below knows only that version, so a broker
# without it raises IncompatibleBrokerVersion when the request is prepared.


class NullableStruct(AbstractType[tuple[Any, ...] | None]):  # type: ignore[misc]  # aiokafka is untyped
    """A nullable struct field of a flexible message: one byte, -1 for null, 1 then the struct."""

    def __init__(self, *fields: Any) -> None:
        self._schema = Schema(*fields)

    def encode(self, value: tuple[Any, ...] | None) -> bytes:
        if value is None:
            return bytes(Int8.encode(-1))
        return bytes(Int8.encode(1) + self._schema.encode(value))

    def decode(self, data: BytesIO) -> tuple[Any, ...] | None:
        if Int8.decode(data) < 0:
            return None
        return tuple(self._schema.decode(data))


_TOPIC_PARTITIONS = CompactArray(
    ("topic_id", Uuid), ("partitions", CompactArray(Int32)), ("tags", TaggedFields)
)


class ConsumerGroupHeartbeatResponse_v1(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 68
    API_VERSION = 1
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", CompactString("utf-8")),
        ("member_id", CompactString("utf-8")),
        ("member_epoch", Int32),
        ("heartbeat_interval_ms", Int32),
        # null: unchanged since the last answer; else (topic_partitions, tags)
        ("assignment", NullableStruct(("topic_partitions", _TOPIC_PARTITIONS), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class ConsumerGroupHeartbeatRequest_v1(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 68
    API_VERSION = 1
    RESPONSE_TYPE = ConsumerGroupHeartbeatResponse_v1
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        ("member_id", CompactString("utf-8")),
        ("member_epoch", Int32),
        ("instance_id", CompactString("utf-8")),  # null: none, or unchanged
        ("rack_id", CompactString("utf-8")),
        ("rebalance_timeout_ms", Int32),  # -1: unchanged
        ("subscribed_topic_names", CompactArray(CompactString("utf-8"))),  # null: unchanged
        ("subscribed_topic_regex", CompactString("utf-8")),
        ("server_assignor", CompactString("utf-8")),  # null: the broker's default, or unchanged
        ("topic_partitions", _TOPIC_PARTITIONS),  # null: unchanged; else what the member owns
        ("tags", TaggedFields),
    )


class ConsumerGroupHeartbeatRequest(Request[ConsumerGroupHeartbeatRequest_v1]):  # type: ignore[misc]  # aiokafka is untyped
    """KIP-848's one group request: join (epoch 0), heartbeat and acknowledge (the owned partitions
    by topic id), leave (epoch -1, a static member -2). ``None`` fields go out as null (unchanged)."""

    API_KEY = 68

    def __init__(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        *,
        instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout_ms: int = -1,
        topics: list[str] | None = None,
        server_assignor: str | None = None,
        owned: Mapping[str, list[int]] | None = None,
    ) -> None:
        owned_rows: list[tuple[Any, ...]] | None = (
            None if owned is None else [(t, sorted(ps), {}) for t, ps in sorted(owned.items())]
        )
        self._fields: tuple[Any, ...] = (
            group_id,
            member_id,
            member_epoch,
            instance_id,
            rack_id,
            rebalance_timeout_ms,
            topics,
            None,
            server_assignor,
            owned_rows,
            {},
        )

    def build(
        self, request_struct_class: type[ConsumerGroupHeartbeatRequest_v1]
    ) -> ConsumerGroupHeartbeatRequest_v1:
        return ConsumerGroupHeartbeatRequest_v1(*self._fields)


def heartbeat_assignment(resp: Any) -> dict[str, list[int]] | None:
    """A heartbeat answer's assignment as topic id -> partitions (None: unchanged since the last)."""
    if resp.assignment is None:
        return None
    out: dict[str, list[int]] = {}
    for topic_id, partitions, _tags in resp.assignment[0]:
        out.setdefault(topic_id, []).extend(partitions)
    return out


class OffsetCommitResponse_v9(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 8
    API_VERSION = 9
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(("partition", Int32), ("error_code", Int16), ("tags", TaggedFields)),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class OffsetCommitRequest_v9(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 8
    API_VERSION = 9
    RESPONSE_TYPE = OffsetCommitResponse_v9
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        ("generation_or_member_epoch", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition", Int32),
                        ("offset", Int64),
                        ("leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class OffsetCommitRequest(Request[OffsetCommitRequest_v9]):  # type: ignore[misc]  # aiokafka is untyped
    """A consumer-protocol member's commit: ``offsets`` {topic: [(partition, offset)]} with its
    member id and epoch (Kafka refuses such a member's commits below v9)."""

    API_KEY = 8

    def __init__(
        self,
        group_id: str,
        member_epoch: int,
        member_id: str,
        instance_id: str | None,
        offsets: Mapping[str, list[tuple[int, int]]],
    ) -> None:
        topics: list[tuple[Any, ...]] = [
            (t, [(p, off, -1, "", {}) for p, off in sorted(parts)], {})
            for t, parts in sorted(offsets.items())
        ]
        self._fields: tuple[Any, ...] = (group_id, member_epoch, member_id, instance_id, topics, {})

    def build(self, request_struct_class: type[OffsetCommitRequest_v9]) -> OffsetCommitRequest_v9:
        return OffsetCommitRequest_v9(*self._fields)


class OffsetFetchResponse_v9(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 9
    API_VERSION = 9
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "groups",
            CompactArray(
                ("group_id", CompactString("utf-8")),
                (
                    "topics",
                    CompactArray(
                        ("name", CompactString("utf-8")),
                        (
                            "partitions",
                            CompactArray(
                                ("partition", Int32),
                                ("offset", Int64),
                                ("leader_epoch", Int32),
                                ("metadata", CompactString("utf-8")),
                                ("error_code", Int16),
                                ("tags", TaggedFields),
                            ),
                        ),
                        ("tags", TaggedFields),
                    ),
                ),
                ("error_code", Int16),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v9(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 9
    API_VERSION = 9
    RESPONSE_TYPE = OffsetFetchResponse_v9
    SCHEMA = Schema(
        (
            "groups",
            CompactArray(
                ("group_id", CompactString("utf-8")),
                ("member_id", CompactString("utf-8")),
                ("member_epoch", Int32),
                (
                    "topics",
                    CompactArray(
                        ("name", CompactString("utf-8")),
                        ("partitions", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest(Request[OffsetFetchRequest_v9]):  # type: ignore[misc]  # aiokafka is untyped
    """A consumer-protocol member's read of its group's committed offsets ({topic: [partition]}),
    naming its member id and epoch (validated by the coordinator)."""

    API_KEY = 9

    def __init__(
        self, group_id: str, member_id: str, member_epoch: int, partitions: Mapping[str, list[int]]
    ) -> None:
        topics: list[tuple[Any, ...]] = [(t, sorted(ps), {}) for t, ps in sorted(partitions.items())]
        self._fields: tuple[Any, ...] = ([(group_id, member_id, member_epoch, topics, {})], False, {})

    def build(self, request_struct_class: type[OffsetFetchRequest_v9]) -> OffsetFetchRequest_v9:
        return OffsetFetchRequest_v9(*self._fields)


def fetched_offsets(resp: Any) -> tuple[int, list[tuple[TopicPartition, int, int]]]:
    """An OffsetFetch v9 answer of one group: (group error code, [(partition, offset, error code)])."""
    group_error = 0
    out: list[tuple[TopicPartition, int, int]] = []
    for _group, topics, error_code, _tags in resp.groups:
        group_error = group_error or error_code
        for name, parts, _ttags in topics:
            for partition, offset, _epoch, _meta, p_error, _ptags in parts:
                out.append((TopicPartition(name, partition), offset, p_error))
    return group_error, out
