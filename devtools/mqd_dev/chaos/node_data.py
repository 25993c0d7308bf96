"""Faults on a broker node's data: what a replaced disk, a bad sector or an operator does to it.

Each fault stops the node(s) it needs, changes the files, and starts them again (and waits until
they answer ``/v1/health``); the runner picks them with its seeded schedule:

- ``master_dir_loss``: the master is killed, its data dir moved away (a replaced disk), and started
  on an empty dir. Its slave still holds every ``acks=all`` record.
- ``segment_bitflip`` / ``segment_truncate``: on a stopped node (master or slave), one byte of a
  closed segment's ``.log`` inverted, or the file cut short. A replica still holds the data.
- ``topic_recreate``: every node of a group stopped, the topic's partition folders removed on all of
  them, the nodes started: the partitions come back empty under the running daemons. The produce
  load of those partitions is paused first and the landing allowed to catch up, so nothing
  acknowledged is lost with the folders (an operator's deletion is not the pipeline's loss); the
  ledger starts a new generation for them.

Broker layout (mqd.broker.storage): ``<data_dir>/logs/<topic>-<partition>/<base:020d>.log``; the
last ``.log`` of a partition is its active segment, every earlier one is closed.
"""

from __future__ import annotations

import random
import shutil
import signal
from pathlib import Path

from mqd_dev.chaos.procs import ChaosCluster, Node


def partition_dir(data_dir: Path, topic: str, partition: int) -> Path:
    return data_dir / "logs" / f"{topic}-{partition}"


def closed_segments(data_dir: Path, topic: str, partitions: list[int]) -> list[Path]:
    """The closed (not last) non-empty ``.log`` files of ``partitions`` on one node."""
    out: list[Path] = []
    for p in partitions:
        logs = sorted(partition_dir(data_dir, topic, p).glob("*.log"))
        out.extend(f for f in logs[:-1] if f.stat().st_size > 0)
    return out


def flip_byte(path: Path, rng: random.Random) -> int:
    """Invert one byte of ``path`` at a seeded position; returns the position."""
    size = path.stat().st_size
    pos = rng.randrange(size)
    with open(path, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0xFF]))
    return pos


def truncate_file(path: Path, rng: random.Random) -> tuple[int, int]:
    """Cut ``path`` to a seeded length in [1, size); returns (old size, new size)."""
    size = path.stat().st_size
    new = rng.randrange(1, size) if size > 1 else 0
    with open(path, "r+b") as fh:
        fh.truncate(new)
    return size, new


def group_partitions(cluster: ChaosCluster, group: str) -> list[int]:
    return [p for p in range(cluster.partitions) if cluster.master_of(p).group == group]


async def master_dir_loss(cluster: ChaosCluster, node: Node, lost_dir: Path) -> str:
    await node.stop_async(signal.SIGKILL)
    lost_dir.parent.mkdir(parents=True, exist_ok=True)
    if node.data_dir.exists():
        node.data_dir.rename(lost_dir)  # kept for a post-mortem; the node starts on an empty dir
    await cluster.restart(node)
    return f"master_dir_loss {node.id} (data dir moved to {lost_dir.name})"


async def damage_segment(cluster: ChaosCluster, node: Node, rng: random.Random, *, flip: bool) -> str:
    """Stop ``node``, flip a byte in / truncate one of its closed segments, start it."""
    kind = "segment_bitflip" if flip else "segment_truncate"
    await node.stop_async(signal.SIGTERM)
    segments = closed_segments(node.data_dir, cluster.topic, group_partitions(cluster, node.group))
    if not segments:
        note = f"{kind} {node.id}: no closed segment yet, only restarted"
    else:
        seg = rng.choice(segments)
        where = f"{seg.parent.name}/{seg.name}"
        if flip:
            note = f"{kind} {node.id} {where} byte {flip_byte(seg, rng)}"
        else:
            old, new = truncate_file(seg, rng)
            note = f"{kind} {node.id} {where} {old} -> {new} bytes"
    await cluster.restart(node)
    return note


async def recreate_topic(cluster: ChaosCluster, group: str) -> list[Path]:
    """Stop every node of ``group``, remove the topic's partition folders on each, start them again.
    Returns the folders removed."""
    nodes = [n for n in cluster.nodes.values() if n.group == group]
    parts = group_partitions(cluster, group)
    for n in nodes:
        await n.stop_async(signal.SIGTERM)
    removed: list[Path] = []
    for n in nodes:
        for p in parts:
            d = partition_dir(n.data_dir, cluster.topic, p)
            if d.exists():
                shutil.rmtree(d)
                removed.append(d)
    for n in nodes:  # masters first: a slave starting first would only wait for its master
        if n.role == "master":
            await cluster.restart(n)
    for n in nodes:
        if n.role != "master":
            await cluster.restart(n)
    return removed
