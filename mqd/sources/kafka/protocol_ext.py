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

from collections.abc import Mapping
from io import BytesIO
from typing import Any, TypeAlias

from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.fetch import FetchRequest as _AioFetchRequest
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
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
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


# -- Fetch v4-v11 with the current leader epoch (KIP-320) and a fetch session (KIP-227) ---------


class FetchRequest(_AioFetchRequest):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka's Fetch that also sends each partition's current leader epoch (v9+; aiokafka sends
    -1, unknown): a leader of a newer epoch than ours answers FENCED_LEADER_EPOCH rather than
    records of a log whose divergence we have not checked yet. ``leader_epochs``: (topic,
    partition) -> epoch, from Metadata v10; partitions without one send -1. v7+ also carries the
    fetch session (mqd.sources.kafka.fetch_session): its id, epoch and forgotten partitions
    (aiokafka sends id 0, epoch -1: no session)."""

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
    ) -> None:
        super().__init__(max_wait_time, min_bytes, max_bytes, isolation_level, topics)
        self._leader_epochs = leader_epochs or {}
        self._session = (session_id, session_epoch, forgotten or [])

    def build(self, request_struct_class: Any) -> Any:
        req = super().build(request_struct_class)
        if request_struct_class.API_VERSION >= 9 and self._leader_epochs:
            epochs = self._leader_epochs
            req.topics = [
                (t, [(p, epochs.get(TopicPartition(t, p), -1), *rest) for p, _unknown, *rest in parts])
                for t, parts in req.topics
            ]
        if request_struct_class.API_VERSION >= 7:
            req.session_id, req.session_epoch, req.forgotten_topics_data = self._session
        return req
