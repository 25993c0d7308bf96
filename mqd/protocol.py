"""Wire shapes shared by the broker and its clients (docs/protocol.md is the reference).

Requests and most answers are JSON. A fetch answer is binary so stored batches go out as they
lie on disk: ``b"MQF1" | u32 json_length | json | zero padding to 8 | data``; each partition's
JSON entry names its slice of ``data`` (``pos``, ``len``), relative to the start of ``data``.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from mqd.broker.incarnation import IncarnationEntry, IncarnationError, entries_from_json
from mqd.errors import MqdError

FETCH_MAGIC = b"MQF1"
FETCH_CONTENT_TYPE = "application/x-mqd-fetch"
BATCH_CONTENT_TYPE = "application/x-mqd-batches"
_PREFIX = struct.Struct("<4sI")


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


def encode_fetch_answer(node: str, entries: list[dict[str, Any]], chunks: list[bytes]) -> list[bytes]:
    """Frame a fetch answer. ``entries[i]`` describes ``chunks[i]``; returns the byte parts to send."""
    pos = 0
    for entry, chunk in zip(entries, chunks, strict=True):
        entry["pos"] = pos
        entry["len"] = len(chunk)
        pos += len(chunk)
    head = json.dumps({"node": node, "partitions": entries}, separators=(",", ":")).encode()
    pad = (-(_PREFIX.size + len(head))) % 8
    return [_PREFIX.pack(FETCH_MAGIC, len(head)), head, b"\0" * pad, *chunks]


class ProtocolError(MqdError, ValueError):
    """A broker answer that does not parse. Retriable: the next fetch may be fine."""

    retriable = True


def _opt_int(entry: dict[str, Any], key: str) -> int | None:
    value = entry.get(key)
    return None if value is None else int(value)


def decode_fetch_answer(body: bytes) -> FetchAnswer:
    if len(body) < _PREFIX.size:
        raise ProtocolError("fetch answer shorter than its prefix")
    magic, hlen = _PREFIX.unpack_from(body, 0)
    if magic != FETCH_MAGIC:
        raise ProtocolError(f"bad fetch answer magic {magic!r}")
    start = _PREFIX.size + hlen
    if start > len(body):
        raise ProtocolError("fetch answer header truncated")
    try:
        head = json.loads(body[_PREFIX.size : start])
        data_start = start + (-start) % 8
        mv = memoryview(body)
        parts = []
        for e in head["partitions"]:
            pos, ln = int(e["pos"]), int(e["len"])
            if pos < 0 or ln < 0 or data_start + pos + ln > len(body):
                raise ProtocolError(f"partition {e.get('topic')}/{e.get('partition')} slice out of range")
            parts.append(
                PartitionFetch(
                    topic=str(e["topic"]),
                    partition=int(e["partition"]),
                    status=Status(e["status"]),
                    next_offset=int(e["next_offset"]),
                    min_offset=int(e["min_offset"]),
                    max_offset=int(e["max_offset"]),
                    suggest=e.get("suggest"),
                    data=mv[data_start + pos : data_start + pos + ln],
                    error=e.get("error"),
                    incarnation=e.get("incarnation"),
                    diverged_at=_opt_int(e, "diverged_at"),
                    lost_first=_opt_int(e, "lost_first"),
                    lost_last=_opt_int(e, "lost_last"),
                    history=None if e.get("history") is None else entries_from_json(e["history"]),
                )
            )
        return FetchAnswer(node=str(head["node"]), partitions=parts, buffer=body)
    except ProtocolError:
        raise
    except (KeyError, TypeError, ValueError, IncarnationError) as exc:
        raise ProtocolError(f"malformed fetch answer: {exc}") from exc
