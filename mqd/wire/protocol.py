"""Wire shapes shared by the broker and its clients (docs/protocol.md is the reference).

Requests and most answers are JSON. A fetch answer is binary so stored batches go out as they
lie on disk: ``b"MQF1" | u32 json_length | json | zero padding to 8 | data``; each partition's
JSON entry names its slice of ``data`` (``pos``, ``len``), relative to the start of ``data``. That
header is :class:`FetchAnswerHeader` on both sides: the broker frames it (:func:`frame_fetch_answer`),
clients parse and check it (:func:`decode_fetch_answer`); dicts only at its ``to_json``/``from_json``.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from mqd.errors import MqdError
from mqd.wire.incarnation import IncarnationEntry, IncarnationError, entries_from_json, entries_to_json

FETCH_MAGIC = b"MQF1"
FETCH_CONTENT_TYPE = "application/x-mqd-fetch"
BATCH_CONTENT_TYPE = "application/x-mqd-batches"
_PREFIX = struct.Struct("<4sI")
_T = TypeVar("_T")


class Status(enum.StrEnum):
    """Per-partition fetch status, after RocketMQ's GetMessageStatus (DESIGN.md §1 table)."""

    FOUND = "FOUND"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    # not an offset status: the node cannot serve this partition (unknown, not its group)
    NOT_SERVED = "NOT_SERVED"
    # the request named an incarnation that is not the log's current one: see ``diverged_at``
    INCARNATION_CHANGED = "INCARNATION_CHANGED"
    # the offset lies in a fenced range (damaged, not repairable): ``lost_first..lost_last``
    DATA_LOST = "DATA_LOST"


@dataclass(slots=True)
class PartitionFetch:
    """One partition of a fetch answer. ``data`` is a memoryview of whole batches."""

    topic: str
    partition: int
    status: Status
    next_offset: int
    min_offset: int
    max_offset: int
    suggest: str | None  # node id to pull from next, or None to stay
    data: memoryview = field(repr=False)
    error: str | None = None
    # the log's current incarnation (None: the node does not serve the partition, or is older)
    incarnation: str | None = None
    # INCARNATION_CHANGED: first offset from which the log no longer holds the named incarnation
    diverged_at: int | None = None
    # DATA_LOST: the fenced range (inclusive) holding the requested offset
    lost_first: int | None = None
    lost_last: int | None = None
    # replica fetch answers only: the master's incarnation history, oldest first
    history: list[IncarnationEntry] | None = None


@dataclass(slots=True)
class FetchAnswer:
    node: str
    partitions: list[PartitionFetch]
    buffer: bytes = field(repr=False)  # keeps the memory the views point into


@dataclass(frozen=True, slots=True)
class PartitionHeader:
    """One partition's entry in a fetch answer's JSON header: what the broker planned for it and
    where its batches lie in the answer's data (``pos``, ``length``: the wire's ``pos``, ``len``,
    relative to the start of the data). Optional fields are left out of the JSON when None."""

    topic: str
    partition: int
    status: Status
    next_offset: int
    min_offset: int
    max_offset: int
    suggest: str | None = None  # node id to pull from next, or None to stay
    error: str | None = None  # why the node does not serve the partition (NOT_SERVED)
    incarnation: str | None = None  # the log's current incarnation (None: not served)
    diverged_at: int | None = None  # INCARNATION_CHANGED
    lost_first: int | None = None  # DATA_LOST: the fenced range, inclusive
    lost_last: int | None = None
    history: tuple[IncarnationEntry, ...] | None = None  # replica answers: oldest first
    pos: int = 0
    length: int = 0

    def to_json(self) -> dict[str, object]:
        """The wire form (keys in the order the broker has always written them)."""
        out: dict[str, object] = {
            "topic": self.topic,
            "partition": self.partition,
            "status": self.status.value,
            "next_offset": self.next_offset,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "suggest": self.suggest,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.incarnation is not None:
            out["incarnation"] = self.incarnation
        if self.diverged_at is not None:
            out["diverged_at"] = self.diverged_at
        if self.lost_first is not None:
            out["lost_first"] = self.lost_first
        if self.lost_last is not None:
            out["lost_last"] = self.lost_last
        if self.history is not None:
            out["history"] = entries_to_json(self.history)
        out["pos"] = self.pos
        out["len"] = self.length
        return out

    @classmethod
    def from_json(cls, raw: object, where: str = "partition") -> PartitionHeader:
        """Parse and check one entry; ProtocolError names the field that is wrong (``where``
        prefixes it). Keys it does not know are ignored (a newer broker may add some)."""
        if not isinstance(raw, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(raw).__name__}")
        status = _field(raw, "status", str, where)
        try:
            parsed_status = Status(status)
        except ValueError:
            raise ProtocolError(f"{where}.status: unknown status {status!r}") from None
        history = raw.get("history")
        try:
            entries = None if history is None else tuple(entries_from_json(history))
        except IncarnationError as exc:
            raise ProtocolError(f"{where}.history: {exc}") from None
        pos, length = _field(raw, "pos", int, where), _field(raw, "len", int, where)
        if pos < 0 or length < 0:
            raise ProtocolError(f"{where}: negative slice pos={pos} len={length}")
        return cls(
            topic=_field(raw, "topic", str, where),
            partition=_field(raw, "partition", int, where),
            status=parsed_status,
            next_offset=_field(raw, "next_offset", int, where),
            min_offset=_field(raw, "min_offset", int, where),
            max_offset=_field(raw, "max_offset", int, where),
            suggest=_optional(raw, "suggest", str, where),
            error=_optional(raw, "error", str, where),
            incarnation=_optional(raw, "incarnation", str, where),
            diverged_at=_optional(raw, "diverged_at", int, where),
            lost_first=_optional(raw, "lost_first", int, where),
            lost_last=_optional(raw, "lost_last", int, where),
            history=entries,
            pos=pos,
            length=length,
        )


@dataclass(frozen=True, slots=True)
class FetchAnswerHeader:
    """A fetch answer's JSON header: the answering node and one entry per partition, in the order
    of their slices in the data. The broker writes it (:func:`frame_fetch_answer`), clients read it
    (:func:`decode_fetch_answer`); the dict form exists only in ``to_json``/``from_json``."""

    node: str
    partitions: tuple[PartitionHeader, ...]

    def to_json(self) -> bytes:
        return json.dumps(
            {"node": self.node, "partitions": [p.to_json() for p in self.partitions]},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FetchAnswerHeader:
        """Parse and check a header; ProtocolError says what is malformed and where."""
        try:
            head = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError too
            raise ProtocolError(f"fetch answer header is not JSON: {exc}") from None
        if not isinstance(head, dict):
            raise ProtocolError(f"fetch answer header: expected an object, got {type(head).__name__}")
        node = _field(head, "node", str, "fetch answer header")
        parts = _field(head, "partitions", list, "fetch answer header")
        return cls(node, tuple(PartitionHeader.from_json(p, f"partitions[{i}]") for i, p in enumerate(parts)))


def _field(raw: dict[str, object], key: str, kind: type[_T], where: str) -> _T:
    """``raw[key]``, which must be a ``kind`` (an int is never a bool)."""
    if key not in raw:
        raise ProtocolError(f"{where}.{key}: missing")
    return _checked(raw[key], key, kind, where)


def _optional(raw: dict[str, object], key: str, kind: type[_T], where: str) -> _T | None:
    value = raw.get(key)
    return None if value is None else _checked(value, key, kind, where)


def _checked(value: object, key: str, kind: type[_T], where: str) -> _T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ProtocolError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def frame_fetch_answer(header: FetchAnswerHeader, chunks: Sequence[bytes | memoryview]) -> list[bytes]:
    """Frame a fetch answer: ``header.partitions[i]`` describes ``chunks[i]`` (its ``pos`` and
    ``length`` must be where the chunk lies in the data); returns the prefix, the header and the
    padding to send before the chunks."""
    pos = 0
    for p, chunk in zip(header.partitions, chunks, strict=True):
        size = len(chunk)
        if p.pos != pos or p.length != size:
            raise ValueError(f"{p.topic}/{p.partition}: slice {p.pos}+{p.length}, its chunk is {pos}+{size}")
        pos += size
    head = header.to_json()
    pad = (-(_PREFIX.size + len(head))) % 8
    return [_PREFIX.pack(FETCH_MAGIC, len(head)), head, b"\0" * pad]


def encode_fetch_answer(
    node: str, entries: Sequence[Mapping[str, object]], chunks: list[bytes]
) -> list[bytes]:
    """Frame a hand-built answer (tests, fakes): ``entries[i]``, a partition's entry in wire form
    without ``pos``/``len``, describes ``chunks[i]``; each entry is checked as a received one would
    be. Returns the byte parts to send."""
    parts = []
    pos = 0
    for i, (entry, chunk) in enumerate(zip(entries, chunks, strict=True)):
        parts.append(PartitionHeader.from_json({**entry, "pos": pos, "len": len(chunk)}, f"entries[{i}]"))
        pos += len(chunk)
    return [*frame_fetch_answer(FetchAnswerHeader(node, tuple(parts)), chunks), *chunks]


class ProtocolError(MqdError, ValueError):
    """A broker answer that does not parse. Retriable: the next fetch may be fine."""

    retriable = True


def decode_fetch_answer(body: bytes) -> FetchAnswer:
    if len(body) < _PREFIX.size:
        raise ProtocolError("fetch answer shorter than its prefix")
    magic, hlen = _PREFIX.unpack_from(body, 0)
    if magic != FETCH_MAGIC:
        raise ProtocolError(f"bad fetch answer magic {magic!r}")
    start = _PREFIX.size + hlen
    if start > len(body):
        raise ProtocolError("fetch answer header truncated")
    header = FetchAnswerHeader.from_json(body[_PREFIX.size : start])
    data_start = start + (-start) % 8
    mv = memoryview(body)
    parts = []
    for p in header.partitions:
        first = data_start + p.pos
        if first + p.length > len(body):
            raise ProtocolError(f"partition {p.topic}/{p.partition} slice out of range")
        parts.append(
            PartitionFetch(
                topic=p.topic,
                partition=p.partition,
                status=p.status,
                next_offset=p.next_offset,
                min_offset=p.min_offset,
                max_offset=p.max_offset,
                suggest=p.suggest,
                data=mv[first : first + p.length],
                error=p.error,
                incarnation=p.incarnation,
                diverged_at=p.diverged_at,
                lost_first=p.lost_first,
                lost_last=p.lost_last,
                history=None if p.history is None else list(p.history),
            )
        )
    return FetchAnswer(node=header.node, partitions=parts, buffer=body)
