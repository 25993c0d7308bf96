"""Group coordinator: membership, expiry, versions, routing, and durable forward-only commits."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.harness import Cluster
from support.replica import replica_offsets

from mqd.broker.consumer_groups import ConsumerGroupError, ConsumerGroupStore
from mqd.wire.client import BrokerClient, BrokerError

# -- ConsumerGroupStore (pure logic and its file) ---------------------------------------------------


def test_membership_versions_and_expiry() -> None:
    """Joins, topic changes, leaves and expiries bump the version; repeat heartbeats do not."""
    gs = ConsumerGroupStore(Path("/nonexistent"))
    assert gs.heartbeat("g", "b", ["t"], 1000) == (["b"], 1)
    assert gs.heartbeat("g", "a", ["t"], 200) == (["a", "b"], 2)
    assert gs.heartbeat("g", "a", ["t"], 200) == (["a", "b"], 2)
    assert gs.heartbeat("g", "a", ["t", "u"], 200) == (["a", "b"], 3)
    assert gs.leave("g", "zzz") == (["a", "b"], 3)
    now = time.monotonic()
    assert gs.expire(now + 0.1) == 0
    assert gs.expire(now + 0.5) == 1  # a's 200 ms session ran out, b's 1 s did not
    assert gs.members("g") == (["b"], 4)
    assert gs.leave("g", "b") == ([], 5)
    assert gs.members("other") == ([], 0)


async def test_commit_is_forward_only_durable_and_atomic(tmp_path: Path) -> None:
    """Commits below the stored offset are ignored unless forced; a new store reads them back;
    no temp file is left behind."""
    gs = ConsumerGroupStore(tmp_path)
    gs.load()
    assert await gs.commit("g", [("t", 0, 10), ("t", 1, 3)], force=False) == [
        {"topic": "t", "partition": 0, "offset": 10},
        {"topic": "t", "partition": 1, "offset": 3},
    ]
    assert (await gs.commit("g", [("t", 0, 5)], force=False))[0]["offset"] == 10
    assert (await gs.commit("g", [("t", 1, 2)], force=True))[0]["offset"] == 2
    again = ConsumerGroupStore(tmp_path)
    again.load()
    assert again.committed("g", []) == [
        {"topic": "t", "partition": 0, "offset": 10},
        {"topic": "t", "partition": 1, "offset": 2},
    ]
    assert again.committed("g", [("t", 1), ("t", 9)]) == [{"topic": "t", "partition": 1, "offset": 2}]
    assert sorted(p.name for p in await asyncio.to_thread(lambda: list(tmp_path.iterdir()))) == [
        "offsets.json"
    ]


def test_merge_offsets_keeps_the_maximum(tmp_path: Path) -> None:
    """A slave's max-merge never moves an offset back, and what it merged survives a reload."""
    gs = ConsumerGroupStore(tmp_path)
    gs.load()
    gs.merge_offsets({"g": [{"topic": "t", "partition": 0, "offset": 7}]})
    gs.merge_offsets(
        {"g": [{"topic": "t", "partition": 0, "offset": 4}, {"topic": "t", "partition": 1, "offset": 1}]}
    )
    again = ConsumerGroupStore(tmp_path)
    again.load()
    assert again.offsets_snapshot() == {
        "g": [{"topic": "t", "partition": 0, "offset": 7}, {"topic": "t", "partition": 1, "offset": 1}]
    }


def test_corrupt_offsets_file_is_a_clear_error(tmp_path: Path) -> None:
    """A damaged offsets file stops the node with a message naming the file, not a guess."""
    (tmp_path / "offsets.json").write_text('{"groups": {"g": [{"topic": "t"}]}}')
    with pytest.raises(ConsumerGroupError, match="corrupt offsets file"):
        ConsumerGroupStore(tmp_path).load()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=20))
def test_unforced_commits_keep_the_maximum(offsets: list[int]) -> None:
    """Whatever the order of unforced commits, the stored offset is their maximum."""
    gs = ConsumerGroupStore(Path("/nonexistent"))
    gs._write = lambda seq, snapshot: None  # type: ignore[method-assign]  # no disk here

    async def run() -> int:
        for o in offsets:
            await gs.commit("g", [("t", 0, o)], force=False)
        return int(gs.committed("g", [("t", 0)])[0]["offset"])

    assert asyncio.run(run()) == max(offsets)


# -- coordinator on real nodes -----------------------------------------------------------------------


def _o(partition: int, offset: int) -> dict[str, Any]:
    return {"topic": "events", "partition": partition, "offset": offset}


def _plain(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Snapshot entries without their epochs, to compare with commit answers."""
    return [{k: v for k, v in e.items() if k != "epoch"} for e in entries]


def _group_on(cluster: Cluster, group_index: int) -> str:
    """A consumer group name whose coordinator is the master of cluster group ``group_index``."""
    n = len(cluster.group_names)
    return next(f"cg{i}" for i in range(1000) if zlib.crc32(f"cg{i}".encode()) % n == group_index)


async def test_heartbeat_members_versions_and_expiry(cluster_factory: Any, client: BrokerClient) -> None:
    """Heartbeats return the sorted member list and a version that moves on every change; a silent
    member is dropped after its session timeout while a live one stays."""
    cluster = cluster_factory(topics={"events": 2})
    url = cluster.bootstrap
    r = await client.heartbeat(url, "g", "c2", ["events"], 10_000)
    assert r == {"members": ["c2"], "version": 1, "coordinator": cluster.master()}
    r = await client.heartbeat(url, "g", "c1", ["events"], 10_000)
    assert (r["members"], r["version"]) == (["c1", "c2"], 2)
    r = await client.heartbeat(url, "g", "short", ["events"], 300)
    assert (r["members"], r["version"]) == (["c1", "c2", "short"], 3)
    deadline = time.monotonic() + 10
    while True:
        r = await client.heartbeat(url, "g", "c1", ["events"], 10_000)  # c1 stays alive
        if "short" not in r["members"]:
            break
        assert time.monotonic() < deadline, "member never expired"
        await asyncio.sleep(0.05)
    assert (r["members"], r["version"]) == (["c1", "c2"], 4)
    r = await client.leave(url, "g", "c2")
    assert r == {"members": ["c1"], "version": 5}


async def test_wrong_node_answers_not_coordinator(cluster_factory: Any, client: BrokerClient) -> None:
    """Group requests to a node that is not the group's coordinator get 421 naming the coordinator."""
    cluster = cluster_factory(topics={"events": 2}, groups=2)
    group = _group_on(cluster, 1)
    with pytest.raises(BrokerError) as err:
        await client.heartbeat(cluster.url(cluster.master(0)), group, "c", ["events"], 5000)
    assert err.value.status == 421 and err.value.code == "not_coordinator"
    assert err.value.body["coordinator"] == cluster.master(1)
    assert err.value.body["coordinator_url"] == cluster.url(cluster.master(1))
    r = await client.heartbeat(cluster.url(cluster.master(1)), group, "c", ["events"], 5000)
    assert r["members"] == ["c"]


async def test_commits_are_durable_forward_only_and_replicated(
    cluster_factory: Any, client: BrokerClient
) -> None:
    """Commits only move forward (unless forced), survive a kill -9 and restart of the coordinator,
    reach the slave, and the slave serves them as coordinator while the master is down."""
    cluster = cluster_factory(topics={"events": 2}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    url = cluster.url(master)
    offs = [_o(0, 10), _o(1, 4)]
    assert (await client.commit(url, "g", "c", offs))["committed"] == offs
    r = await client.commit(url, "g", "c", [_o(0, 3)])
    assert r["committed"] == [_o(0, 10)]
    r = await client.commit(url, "g", "c", [_o(1, 2)], force=True)
    assert r["committed"] == [_o(1, 2)]
    expected = [_o(0, 10), _o(1, 2)]
    assert await client.committed(url, "g") == expected
    assert await client.committed(url, "g", [{"topic": "events", "partition": 1}]) == expected[1:]
    assert await client.committed(url, "nobody") == []

    async def slave_has_them() -> bool:
        got = await replica_offsets(cluster, master, slave)
        return _plain(got.get("g", [])) == expected

    deadline = time.monotonic() + 10
    while not await slave_has_them():
        assert time.monotonic() < deadline, "slave never pulled the committed offsets"
        await asyncio.sleep(0.1)

    await asyncio.to_thread(cluster.restart, master, sig=signal.SIGKILL)
    assert await client.committed(url, "g") == expected
    stored = json.loads((cluster.nodes[master].data_dir / "offsets.json").read_text())
    assert _plain(stored["groups"]["g"]) == expected

    # master down: after the liveness timeout the slave is the coordinator and has the offsets
    await asyncio.to_thread(cluster.kill, master)
    deadline = time.monotonic() + 10
    while True:
        try:
            got = await client.committed(cluster.url(slave), "g")
            break
        except BrokerError as exc:
            assert exc.code == "not_coordinator", exc
            assert time.monotonic() < deadline, "slave never took over as coordinator"
            await asyncio.sleep(0.05)
    assert got == expected


# -- epochs: forced commits and the master's merge of its slaves' offsets ----------------------------


def _store(path: Path | None = None) -> ConsumerGroupStore:
    gs = ConsumerGroupStore(path or Path("/nonexistent"))
    if path is None:
        gs._write = lambda seq, snapshot: None  # type: ignore[method-assign]  # no disk here
    return gs


async def test_forced_commit_wins_every_later_merge() -> None:
    """A forced (backward) commit bumps the epoch: a peer still holding the larger old offset takes
    the forced one, and merging the peer's stale snapshot back does not undo it."""
    master, slave = _store(), _store()
    await master.commit("g", [("t", 0, 30)], force=False)
    slave.merge_offsets(master.offsets_snapshot())
    stale = slave.offsets_snapshot()
    await master.commit("g", [("t", 0, 3)], force=True)
    assert await master.merge(stale) is False
    assert master.committed("g", []) == [{"topic": "t", "partition": 0, "offset": 3}]
    slave.merge_offsets(master.offsets_snapshot())
    assert slave.offsets_snapshot() == {"g": [{"topic": "t", "partition": 0, "offset": 3, "epoch": 1}]}
    # after the forced commit, unforced commits move forward again from the new position
    assert (await master.commit("g", [("t", 0, 5)], force=False))[0]["offset"] == 5
    assert (await master.commit("g", [("t", 0, 4)], force=False))[0]["offset"] == 5


_op = st.tuples(
    st.sampled_from(["a", "b"]),
    st.sampled_from(["commit", "force", "merge"]),
    st.integers(min_value=0, max_value=3),
    st.integers(min_value=0, max_value=100),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_op, max_size=30))
def test_merges_converge(ops: list[tuple[str, str, int, int]]) -> None:
    """Whatever commits, forced commits and one-way merges happen on two nodes, merging both ways
    leaves both with the same offsets (merges are a max over (epoch, offset): order does not matter)."""
    stores = {"a": _store(), "b": _store()}

    async def run() -> None:
        for node, op, partition, offset in ops:
            gs, other = stores[node], stores["b" if node == "a" else "a"]
            if op == "merge":
                await gs.merge(other.offsets_snapshot())
            else:
                await gs.commit("g", [("t", partition, offset)], force=op == "force")
        await stores["a"].merge(stores["b"].offsets_snapshot())
        await stores["b"].merge(stores["a"].offsets_snapshot())

    asyncio.run(run())
    assert stores["a"].offsets_snapshot() == stores["b"].offsets_snapshot()


def test_malformed_snapshot_merges_nothing_and_old_files_load(tmp_path: Path) -> None:
    """A peer snapshot with one bad entry is refused whole (ValueError naming it); an offsets file
    written before epochs existed loads with epoch 0."""
    (tmp_path / "offsets.json").write_text(
        '{"version": 1, "groups": {"g": [{"topic": "t", "partition": 0, "offset": 7}]}}'
    )
    gs = ConsumerGroupStore(tmp_path)
    gs.load()
    bad = {"g": [{"topic": "t", "partition": 1, "offset": 9}, {"topic": "t", "partition": 0, "offset": -1}]}
    with pytest.raises(ValueError, match="entry 1: offset"):
        gs.merge_offsets(bad)
    with pytest.raises(ValueError, match="must be an object"):
        gs.merge_offsets(["g"])
    assert gs.offsets_snapshot() == {"g": [{"topic": "t", "partition": 0, "offset": 7}]}


def test_an_older_snapshot_never_replaces_a_newer_file(tmp_path: Path) -> None:
    """Writes that finish out of order (a commit's and a merge's) leave the newest snapshot on
    disk and no temp file behind."""
    gs = ConsumerGroupStore(tmp_path)
    gs.load()
    gs._write(2, {"g": [{"topic": "t", "partition": 0, "offset": 2}]})
    gs._write(1, {"g": [{"topic": "t", "partition": 0, "offset": 1}]})
    again = ConsumerGroupStore(tmp_path)
    again.load()
    assert again.committed("g", []) == [{"topic": "t", "partition": 0, "offset": 2}]
    assert [p.name for p in tmp_path.iterdir()] == ["offsets.json"]


async def _commit_when_coordinator(client: BrokerClient, url: str, offsets: list[dict[str, Any]]) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            await client.commit(url, "g", "c", offsets)
            return
        except BrokerError as exc:
            assert exc.code == "not_coordinator", exc
            assert time.monotonic() < deadline, "node never became the coordinator"
            await asyncio.sleep(0.05)


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_returning_master_takes_the_slaves_commits(cluster_factory: Any, client: BrokerClient) -> None:
    """Commits a slave took as coordinator while the master was down are answered by the master as
    soon as it is back (merged before it serves); later commits through the master, forced ones
    included, reach the slave."""
    cluster = cluster_factory(topics={"events": 2}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    await client.commit(murl, "g", "c", [_o(0, 10)])

    async def slave_has(expected: list[dict[str, Any]]) -> bool:
        got = await replica_offsets(cluster, master, slave)
        return _plain(got.get("g", [])) == expected

    await _until(lambda: slave_has([_o(0, 10)]), "the slave to pull the first commit")
    await asyncio.to_thread(cluster.kill, master)
    await _commit_when_coordinator(client, surl, [_o(0, 20), _o(1, 5)])

    await asyncio.to_thread(cluster.start_node, master)
    assert await client.committed(murl, "g") == [_o(0, 20), _o(1, 5)]

    await client.commit(murl, "g", "c", [_o(0, 30)])
    await _until(lambda: slave_has([_o(0, 30), _o(1, 5)]), "the slave to follow the master")
    assert (await client.commit(murl, "g", "c", [_o(0, 3)], force=True))["committed"] == [_o(0, 3)]
    await _until(lambda: slave_has([_o(0, 3), _o(1, 5)]), "the forced commit to reach the slave")
    # both nodes now hold the same (epoch, offset); the master's pulls of the slave changed nothing
    assert await replica_offsets(cluster, slave, master) == await replica_offsets(cluster, master, slave)
    assert await client.committed(murl, "g") == [_o(0, 3), _o(1, 5)]


async def test_master_pulls_commits_from_a_slave_it_could_not_reach_at_start(
    cluster_factory: Any, client: BrokerClient
) -> None:
    """A master that starts while its slave is frozen (the start-up pull times out) still takes
    the commits the slave took as coordinator, from its periodic pull once the slave answers."""
    cluster = cluster_factory(topics={"events": 1}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    murl, surl = cluster.url(master), cluster.url(slave)
    await asyncio.to_thread(cluster.kill, master)
    await _commit_when_coordinator(client, surl, [_o(0, 42)])
    cluster.send_signal(slave, signal.SIGSTOP)
    try:
        await asyncio.to_thread(cluster.start_node, master)
        assert await client.committed(murl, "g") == []
    finally:
        cluster.send_signal(slave, signal.SIGCONT)

    async def master_has_it() -> bool:
        return await client.committed(murl, "g") == [_o(0, 42)]

    await _until(master_has_it, "the master's periodic pull of the slave's commits")
