"""Repair a log's fenced ranges from a replica: read exactly that range from a peer, replace the hole.

A fenced range (damaged bytes found at open, see storage.py) is data this node cannot serve. Where
a peer of the broker group still holds those offsets whole, with the same batch boundaries, the
batches are copied verbatim (signed replica fetch, batch-checked) and
:meth:`PartitionLog.repair_fenced` puts them in place of the hole. Used by a master at start
(master_recovery.py, from each slave) and by a slave while it follows (replication.py, from its
master).
"""

from __future__ import annotations

import structlog

from mqd.broker.replica_client import ReplicaClient
from mqd.broker.storage import PartitionLog, StorageError
from mqd.config import NodeSpec
from mqd.wire import format as fmt
from mqd.wire.client import BrokerError
from mqd.wire.protocol import ProtocolError, Status

log = structlog.get_logger(__name__)

COPY_MAX_BYTES = 8 * 1024 * 1024  # one range fetch


async def read_range(
    client: ReplicaClient, peer: NodeSpec, topic: str, partition: int, first: int, last: int
) -> bytes | None:
    """``peer``'s batches for exactly ``first..last``; None when it does not hold them whole."""
    out = bytearray()
    offset = first
    while offset <= last:
        answer = await client.fetch(
            peer,
            [{"topic": topic, "partition": partition, "offset": offset, "max_bytes": COPY_MAX_BYTES}],
            max_wait_ms=0,
            max_bytes=COPY_MAX_BYTES,
        )
        p = answer.partitions[0]
        if p.status is not Status.FOUND or len(p.data) == 0:
            return None  # the peer lacks them too (or lost them the same way)
        chunk = bytes(p.data)
        infos = fmt.validate(chunk)
        if infos[0].base_offset != offset:
            return None
        end = len(chunk)
        for info in infos:
            if info.base_offset > last:
                end = info.position  # the rest lies after the hole
                break
            if info.next_offset > last + 1:
                return None  # batch boundaries differ from the hole's: cannot fill it exactly
            offset = info.next_offset
        out += chunk[infos[0].position : end]
    return bytes(out)


async def repair_from(
    client: ReplicaClient, peer: NodeSpec, plog: PartitionLog
) -> tuple[list[tuple[int, int]], list[str]]:
    """Try every fenced range of ``plog`` from ``peer``: the ranges repaired, and one problem line
    per range that failed (an error; a range the peer does not hold whole is neither: it stays
    fenced, the caller may ask again later)."""
    repaired: list[tuple[int, int]] = []
    problems: list[str] = []
    for first, last in plog.fenced_ranges():
        try:
            data = await read_range(client, peer, plog.topic, plog.partition, first, last)
            if data is None:
                continue
            plog.repair_fenced(data, fmt.validate(data))
        except (StorageError, fmt.BatchError, BrokerError, ProtocolError) as exc:
            problems.append(
                f"{plog.topic}/{plog.partition}: fenced {first}..{last} not repaired from {peer.id}: {exc}"
            )
            log.error("fenced range not repaired", peer=peer.id, problem=problems[-1])
            continue
        repaired.append((first, last))
    return repaired, problems
