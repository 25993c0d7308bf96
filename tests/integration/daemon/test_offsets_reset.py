"""`mqd offsets show` / `mqd offsets reset` end to end: real brokers, the daemon as a process (issue 17).

The landing decides where a partition resumes, so a reset is recorded in the landing and applied by
the daemon's start-position hook: a forward reset skips a range (logged and counted), a reset below
the landed head is refused with the reason, a running daemon refuses any reset, and a broker-side
commit that differs from the landing is warned about at start.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import mqd, produce, write_config
from support.harness import Cluster
from support.landing import read_manifest

from mqd.process.reset_records import reset_path
from mqd.topic_partition import TopicPartition
from mqd.wire.client import BrokerClient

PARTITIONS = 2


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": PARTITIONS})


def _landed(landing: Path) -> dict[int, list[int]]:
    """Every landed offset per partition, in manifest order (duplicates kept)."""
    out: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for r in read_manifest(landing, "events"):
        out[r.partition].extend(range(r.first_offset, r.last_offset + 1))
    return out


def _burst(cfg: Path) -> str:
    res = mqd("run", "--config", str(cfg), "--burst", timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return str(res.stdout) + str(res.stderr)


def _events(output: str, event: str) -> list[dict[str, object]]:
    out = []
    for line in output.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == event:
            out.append(rec)
    return out


def test_forward_reset_skips_a_range_and_backward_replays_it_once_more(
    tmp_path: Path, cluster: Cluster
) -> None:
    """A forward reset lands from the new offset on, logs and counts what it skipped; a reset below
    the landed head lands that range exactly once more, under a replay id, and is reported; a
    dry run changes nothing; both apply once and are cleared when the landing moved past them."""
    cfg = write_config(tmp_path, cluster, consumer={"group": "resets"})
    landing = tmp_path / "landing"
    produce(cluster, 400, batch=20)
    _burst(cfg)
    first = _landed(landing)
    assert sum(len(v) for v in first.values()) == 400
    ends = {p: max(v) + 1 for p, v in first.items()}

    produce(cluster, 400, batch=20)
    shown = mqd("offsets", "show", "--config", str(cfg))
    assert shown.returncode == 0, shown.stderr
    row0 = next(line.split() for line in shown.stdout.splitlines() if line.startswith("events:0 "))
    assert row0[1] == str(ends[0])  # LANDED: where the daemon resumes

    target = ends[0] + 30
    dry = mqd("offsets", "reset", "--config", str(cfg), "events:0", "--to", str(target), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"skips 30 offsets ({ends[0]}..{target - 1})" in dry.stdout and "dry run" in dry.stdout
    assert not reset_path(landing, TopicPartition("events", 0)).exists()

    replay_from = ends[1] - 50
    back = mqd("offsets", "reset", "--config", str(cfg), "events:1", "--to", str(replay_from))
    assert back.returncode == 0, back.stderr + back.stdout
    assert f"replays 50 offsets ({replay_from}..{ends[1] - 1})" in back.stdout
    assert reset_path(landing, TopicPartition("events", 1)).exists()

    done = mqd("offsets", "reset", "--config", str(cfg), "events:0", "--to", str(target))
    assert done.returncode == 0, done.stderr + done.stdout
    assert reset_path(landing, TopicPartition("events", 0)).exists()
    shown = mqd("offsets", "show", "--config", str(cfg), "events:0")
    row0 = next(line.split() for line in shown.stdout.splitlines() if line.startswith("events:0 "))
    assert row0[-1] == str(target)  # PENDING: the reset not applied yet

    out = _burst(cfg)
    applied = {str(a["tp"]): a for a in _events(out, "offsets reset applied")}
    assert applied["events/0"]["skipped_offsets"] == 30, applied
    assert applied["events/0"]["skipped_range"] == f"{ends[0]}..{target - 1}"
    assert applied["events/1"]["replayed_offsets"] == 50
    assert applied["events/1"]["replayed_range"] == f"{replay_from}..{ends[1] - 1}"
    after = _landed(landing)
    # partition 0: nothing of the skipped range, no duplicates
    p0 = after[0]
    assert len(p0) == len(set(p0))
    assert not set(range(ends[0], target)) & set(p0)
    assert set(range(target, max(p0) + 1)) <= set(p0)
    # partition 1: every offset once, the replayed range exactly twice, under the replay id
    p1 = after[1]
    twice = {o for o in set(p1) if p1.count(o) == 2}
    assert twice == set(range(replay_from, ends[1])) and max(p1.count(o) for o in set(p1)) == 2
    assert sorted(set(p1)) == list(range(max(p1) + 1))
    replay_id = str(applied["events/1"]["replay_id"])
    replayed = [r for r in read_manifest(landing, "events") if r.incarnation == replay_id]
    assert sum(r.count for r in replayed) == 50 and all(r.partition == 1 for r in replayed)
    assert sum(len(v) for v in after.values()) == 800 - 30 + 50

    # applied once: the landing moved past it, so a later start ignores (and removes) the record
    out = _burst(cfg)
    assert not _events(out, "offsets reset applied")
    assert not reset_path(landing, TopicPartition("events", 0)).exists()
    assert not reset_path(landing, TopicPartition("events", 1)).exists()
    assert _landed(landing) == after


def test_reset_refused_while_the_daemon_runs_and_committed_difference_is_warned(
    tmp_path: Path, cluster: Cluster
) -> None:
    """A reset with the daemon running is refused; a commit moved by a broker-side tool is not
    followed, and the daemon says so (which one wins, how to reset deliberately)."""
    cfg = write_config(tmp_path, cluster, consumer={"group": "warned"})
    produce(cluster, 100, batch=20)
    _burst(cfg)
    started = mqd("start", "--config", str(cfg))
    assert started.returncode == 0, started.stderr
    try:
        res = mqd("offsets", "reset", "--config", str(cfg), "events", "--to", "latest")
        assert res.returncode == 1 and "the daemon is running" in res.stderr
    finally:
        stopped = mqd("stop", "--config", str(cfg))
        assert stopped.returncode == 0, stopped.stderr

    async def force_commit() -> None:
        async with BrokerClient() as client:
            await client.commit(
                cluster.bootstrap,
                "warned",
                "tool",
                [{"topic": "events", "partition": 0, "offset": 0}],
                force=True,
            )

    asyncio.run(force_commit())
    out = _burst(cfg)
    warned = _events(out, "committed offset differs from the landed position; the landing wins")
    assert any(w["tp"] == "events/0" and w["committed"] == 0 for w in warned), out[-3000:]
    assert "mqd offsets reset" in str(warned[0]["hint"])


async def test_a_restart_with_the_replay_at_the_landed_head_continues_under_the_log(
    tmp_path: Path, cluster: Cluster
) -> None:
    """After a replay the landed head carries the replay id; the next start must resume after it
    under the log's own incarnation (the broker never sees the replay id, nothing lands a third
    time), land new records normally, and clear the record once the landing moved past it."""
    from support.daemon import daemon_config, produce_numbered

    from mqd.operator.offsets_command import now_iso
    from mqd.process.daemon import Daemon
    from mqd.process.reset_records import ResetRecord, write_reset

    landing = tmp_path / "landing"
    cfg = daemon_config(cluster, tmp_path, consumer={"group": "mid"}, max_records=10)
    async with BrokerClient() as client:
        await produce_numbered(client, cluster, PARTITIONS, 200, per_batch=10)
    await asyncio.wait_for(Daemon(cfg, burst=True).run(), 60)
    tp = TopicPartition("events", 0)
    heads = [r for r in read_manifest(landing, "events") if r.partition == 0]
    inc = heads[-1].incarnation
    assert heads[-1].last_offset == 199 and inc is not None
    rid = "f" * 32
    write_reset(landing, ResetRecord(tp, 100, 200, inc, now_iso(), replay_id=rid, replay_end=199))

    def replayed() -> int:
        return sum(r.count for r in read_manifest(landing, "events") if r.incarnation == rid)

    d = Daemon(cfg, burst=True)
    await asyncio.wait_for(d.run(), 60)
    assert replayed() == 100 and d.stats["reset_replayed_offsets"] == 100
    assert [r for r in read_manifest(landing, "events") if r.partition == 0][-1].incarnation == rid
    async with BrokerClient() as client:
        await produce_numbered(client, cluster, PARTITIONS, 20, start=200, per_batch=10)
    d = Daemon(cfg, burst=True)
    await asyncio.wait_for(d.run(), 60)
    # the broker was asked for the log's incarnation: no incarnation change, nothing fetched again
    assert d.stats["records_cut"] == 0 and d.consumer.snapshot().totals.incarnation_changes == 0
    assert reset_path(landing, tp).exists()  # cleared by the next start, once the head is the log's
    await asyncio.wait_for(Daemon(cfg, burst=True).run(), 60)
    assert not reset_path(landing, tp).exists()
    assert replayed() == 100
    ranges = [r for r in read_manifest(landing, "events") if r.partition == 0]
    p0 = [o for r in ranges for o in range(r.first_offset, r.last_offset + 1)]
    assert sorted(p0) == sorted([*range(220), *range(100, 200)])
    assert {r.incarnation for r in ranges if r.first_offset >= 200} == {inc}


@pytest.mark.parametrize("command", ["offsets show", "offsets reset"])
def test_offsets_commands_have_help_with_an_example(command: str) -> None:
    """--help works and shows at least one example, as for every command."""
    res = mqd(*command.split(), "--help")
    assert res.returncode == 0 and "Example" in res.stdout, res.stdout
