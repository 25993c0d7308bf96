"""The source seam: everything the consumer engine needs from a queue, and the typed data it gets.

The engine (fetcher, process queues, budget, rebalance, offset reset, facade) talks to a queue only
through :class:`Source`. The mqd HTTP broker is the first implementation
(mqd.sources.mqd_broker.MqdBrokerSource); a Kafka-protocol source plugs in by implementing the same
methods. Nothing here is HTTP- or broker-specific.

Contracts:

- **Metadata**: ``cluster`` is the last good layout (None before the first); listeners run after
  every refresh; ``request_refresh()`` asks for one soon (a routing error, a dead node).
- **Fetch**: one request per node for many partitions. Each partition's result carries a source-
  neutral status, offsets, an optional suggested pull node, the log *incarnation* (an id that
  changes when the partition's log is created empty, recreated or truncated, so its offsets may hold
  other records than before; None when the source cannot tell), and ``decode``: decoding is source-
  specific and lazy, so the engine re-checks ownership first and never decodes data it will drop.
  ``decode`` returns Arrow record batches (columns offset, timestamp, key, value, headers) cut to
  start at the requested offset, zero-copy (no Python object per record), stopping at the first bad
  batch with the good ones before it. ``FetchResult.body`` is the object whose lifetime bounds every
  slice: the budget pins it. A request names the incarnation its offset belongs to (None: not known
  yet). When that is not the log's current one, the answer is INCARNATION_CHANGED with
  ``diverged_at``: the first offset from which the log no longer holds the requested incarnation's
  records (0 when it never held them). A fetch inside a range the source lost for good (a fenced
  hole) answers DATA_LOST with the range (``lost_first``..``lost_last``, inclusive) and
  ``next_offset`` after it. (Kafka: topic ids and OffsetsForLeaderEpoch map onto the same fields.)
- **Membership**: the source builds the consumer-group membership. The engine only asks "my
  assignment of these subscribed partitions, and its member version, or not known yet"; where the
  allocation strategy runs is the source's business (the mqd broker hands every member the sorted
  member list and each runs the strategy itself; Kafka's group protocol runs it on an elected
  leader). Broadcast mode does not ask the source: it uses mqd.consumer.membership.Broadcast.
- **Committed offsets**: the source builds the group's offset store; broadcast mode keeps the local
  file store whatever the source.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mqd.consumer.errors import ConsumerError
from mqd.lazy_import import lazy_import
from mqd.topic_partition import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

    from mqd.consumer.offset_store import OffsetStore
else:
    pa = lazy_import("pyarrow")  # the start path does not decode (mqd/lazy_import.py)

# -- cluster metadata ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    alive: bool
    role: str  # "master" | "replica": for status and logs; the engine routes by PartitionRoute.leader


@dataclass(frozen=True, slots=True)
class PartitionRoute:
    leader: str
    replicas: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Cluster:
    """One immutable snapshot of the layout as the engine needs it."""

    nodes: Mapping[str, Node]
    partitions: Mapping[TopicPartition, PartitionRoute]
    topics: Mapping[str, Sequence[TopicPartition]] = field(default_factory=dict)  # sorted, per topic

    def partitions_for(self, topics: Iterable[str]) -> list[TopicPartition]:
        """Sorted partitions of ``topics`` (RocketMQ's mqSet); unknown topics contribute none."""
        out: list[TopicPartition] = []
        for t in sorted(set(topics)):
            out.extend(self.topics.get(t, ()))
        return out

    def is_alive(self, node_id: str) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and node.alive

    def candidates(self, tp: TopicPartition) -> list[str]:
        """Nodes that can serve reads of ``tp``, leader first."""
        route = self.partitions.get(tp)
        return [] if route is None else [route.leader, *route.replicas]


# -- fetch ---------------------------------------------------------------------------------------


class FetchStatus(enum.StrEnum):
    """Per-partition fetch status. The values are the mqd broker's (mqd.wire.protocol.Status, after
    RocketMQ's GetMessageStatus); other sources map their answers onto these members."""

    FOUND = "FOUND"
    NO_MESSAGE = "NO_MESSAGE_IN_QUEUE"  # the log is empty
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # below the log start
    CAUGHT_UP = "OFFSET_OVERFLOW_ONE"  # exactly at the log end
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # beyond the log end
    NOT_SERVED = "NOT_SERVED"  # this node does not serve the partition (routing, not offsets)
    INCARNATION_CHANGED = "INCARNATION_CHANGED"  # the requested incarnation is not the log's current one
    DATA_LOST = "DATA_LOST"  # the offset is inside a range the log lost for good (a fenced hole)


ILLEGAL_OFFSET = frozenset(
    {FetchStatus.OFFSET_TOO_SMALL, FetchStatus.OFFSET_OVERFLOW_BADLY, FetchStatus.NO_MESSAGE}
)


@dataclass(frozen=True, slots=True)
class LandedEpoch:
    """The last landed record of a partition and the source's leader epoch of it, as the landing
    kept it (mqd.landing.store.PartitionHead): a source with leader epochs (Kafka, KIP-320) checks
    a position of ``incarnation`` right after ``offset`` against the log before fetching it, so a
    log truncated while no daemon ran is found. A fact about that record, passed with every fetch;
    the source decides when it applies."""

    incarnation: str | None
    offset: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    tp: TopicPartition
    offset: int
    max_bytes: int
    incarnation: str | None = None  # the incarnation ``offset`` belongs to; None: not known yet
    landed: LandedEpoch | None = None  # the partition's last landed record, as assigned
    # incarnations fetched under before ``incarnation``, oldest first, each with the first offset
    # fetched under the next one (mqd/consumer/incarnation_lineage.py); a source without
    # incarnation histories of its own (Kafka's are derived) ignores it
    lineage: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    records: pa.RecordBatch  # columns offset, timestamp, key, value, headers
    first_offset: int  # offset of records[0] (the requested offset for the first batch)
    next_offset: int
    nbytes: int  # wire bytes of the whole batch
    # the source's leader epoch of the record before next_offset (Kafka, KIP-320; None: none)
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class Decoded:
    batches: list[DecodedBatch]
    error: str | None = None  # why decoding stopped before the end of the data
    # memory a copying decode (Kafka) allocated for the batches, beside the answer body: (owner,
    # bytes), the owner alive exactly while that memory is. The engine charges it to the byte budget
    # like the body, so decoded records held by queues and the landing stay counted.
    held: tuple[tuple[object, int], ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionResult:
    tp: TopicPartition
    status: FetchStatus
    # where the node says to fetch next; FOUND: where the answer's whole batches end (the engine
    # sends its next fetch from there before decoding, and drops that answer if the records end
    # elsewhere), or the requested offset when the source cannot tell without decoding
    next_offset: int
    log_start: int
    log_end: int
    suggested_node: str | None  # node to pull from next, or None to stay
    incarnation: str | None  # which log these offsets belong to; None: the source cannot tell
    error: str | None
    # (start_offset, check_crc) -> the partition's batches from start_offset on
    decode: Callable[[int, bool], Decoded] = field(repr=False)
    diverged_at: int | None = None  # INCARNATION_CHANGED: the first offset the logs differ at
    lost_first: int | None = None  # DATA_LOST: the lost range, inclusive
    lost_last: int | None = None


@dataclass(frozen=True, slots=True)
class FetchResult:
    partitions: list[PartitionResult]
    body: object = field(repr=False)  # owns the memory every decoded batch points into
    nbytes: int  # what the budget charges for ``body``


class SourceError(ConsumerError):
    """A request to the source failed. ``kind`` labels the fetch_errors metric; ``node_down`` says
    the node itself failed (transport error, 5xx) and its partitions should move to a replica."""

    def __init__(self, message: str, *, kind: str, node_down: bool, retriable: bool = True) -> None:
        super().__init__(message, retriable=retriable)
        self.kind = kind
        self.node_down = node_down


# -- membership ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assignment:
    """This member's share of the subscribed partitions, and the membership it was computed for."""

    partitions: frozenset[TopicPartition]
    member_version: int | None  # the member list's version (None: no group)
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """What a consumer-group membership needs; reloadable ones are passed again to ``update``."""

    group: str
    member_id: str
    topics: tuple[str, ...]
    allocation: str  # strategy name (mqd.consumer.allocation)
    heartbeat_interval: float
    session_timeout: float
    request_timeout: float


class Membership(Protocol):
    """The engine's view of membership: "my assignment and its member version"."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Leave (the others rebalance now); idempotent."""

    def assignment(self, partitions: Sequence[TopicPartition]) -> Assignment | None:
        """This member's share of ``partitions`` (sorted), or None while it is not known yet."""

    def update(self, settings: GroupSettings) -> None:
        """Apply reloaded settings (topics, allocation, intervals); rejoins when they matter."""

    @property
    def members(self) -> tuple[str, ...]: ...

    @property
    def member_version(self) -> int | None: ...

    @property
    def coordinator(self) -> str | None: ...

    @property
    def last_error(self) -> str | None: ...


@runtime_checkable
class ReleasingMembership(Protocol):
    """A membership that must hear when the engine let go of partitions before it tells the group
    (Kafka's consumer protocol, KIP-848: a revocation is acknowledged only after the release)."""

    def released(self, held: frozenset[TopicPartition]) -> None:
        """The engine holds nothing outside ``held`` any more: partitions it gave up are not
        fetched, their publications in flight ended and their offsets were committed."""


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    membership: Membership
    offsets: OffsetStore


class Source(Protocol):
    """Everything the engine needs from a queue (see the module docstring for the contracts)."""

    # Cancelling a fetch in flight ends it at the node at once, so the engine may cut a long poll
    # short for a partition that was routed to its node meanwhile (decision 073)
    cuts_long_polls: bool

    async def start(self, timeout: float) -> None:
        """Connect and read the metadata once; raises ConsumerError (retriable) after ``timeout``."""

    async def stop(self) -> None: ...

    @property
    def cluster(self) -> Cluster | None: ...

    @property
    def metadata_error(self) -> str | None: ...

    def add_metadata_listener(self, fn: Callable[[Cluster], None]) -> None: ...

    def request_refresh(self) -> None: ...

    def fetch(
        self, node_id: str, requests: list[FetchRequest], *, max_wait_ms: int, min_bytes: int, max_bytes: int
    ) -> Awaitable[FetchResult]:
        """One request to ``node_id``; raises SourceError."""

    async def list_offsets(
        self, node_id: str, tps: list[TopicPartition], spec: str, timestamp: int | None = None
    ) -> dict[TopicPartition, int]:
        """``earliest`` / ``latest`` / ``timestamp`` offsets served by ``node_id``; raises
        ConsumerError (retriable) when any is missing."""

    def consumer_group(self, settings: GroupSettings, on_change: Callable[[], None]) -> ConsumerGroup:
        """The group membership (``on_change`` asks for a rebalance) and the group's offset store."""
