"""Fault tolerance: the fault proxy, the end-of-run checks, the disk faults, and a short chaos run.

The short run is the in-``make test`` version of ``make chaos``: real brokers (master + slave) and two
real daemons, three seeded rounds of faults under a produce load, then every acknowledged record must
be in the landing files exactly once with the value the broker acknowledged at that offset.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mqd_dev.chaos import check
from mqd_dev.chaos.load import Ack, record_value
from mqd_dev.chaos.proxy import FaultProxy, Faults
from mqd_dev.chaos.runner import CLASSIC_KINDS, INTEGRITY_KINDS, ChaosOptions, ChaosRun
from support import REPO_ROOT

REPO = REPO_ROOT

# -- the proxy --------------------------------------------------------------------------------------


class _Answerer:
    """A TCP server that answers every line it reads with ``size`` bytes of a known pattern."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.payload = bytes(i % 251 for i in range(size))
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> _Answerer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline():
                writer.write(self.payload)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


async def _ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int) -> bytes:
    """Send one request line and read up to ``size`` answer bytes (fewer if the proxy cuts)."""
    writer.write(b"q\n")
    await writer.drain()
    out = b""
    while len(out) < size:
        chunk = await asyncio.wait_for(reader.read(size - len(out)), 5)
        if not chunk:
            break
        out += chunk
    return out


async def test_proxy_is_transparent_without_faults() -> None:
    """With no faults the client gets the node's bytes unchanged, over one kept-alive connection."""
    async with _Answerer(100_000) as node:
        proxy = FaultProxy(node.port, seed=1)
        await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
            for _ in range(3):
                assert await _ask(reader, writer, node.size) == node.payload
            writer.close()
            assert proxy.stats.connections == 1 and proxy.stats.injected == {}
        finally:
            await proxy.stop()


async def test_faults_set_later_hit_an_open_pooled_connection() -> None:
    """Faults apply to connections opened before them (clients pool connections for minutes):
    corrupt changes exactly one byte, truncate cuts the answer short and closes."""
    async with _Answerer(1000) as node:
        proxy = FaultProxy(node.port, seed=2)
        await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
            assert await _ask(reader, writer, node.size) == node.payload
            proxy.faults = Faults(corrupt=1.0)
            got = await _ask(reader, writer, node.size)
            assert len(got) == node.size
            assert sum(a != b for a, b in zip(got, node.payload, strict=True)) == 1
            proxy.faults = Faults(truncate=1.0)
            got = await _ask(reader, writer, node.size)
            assert len(got) < node.size and got == node.payload[: len(got)]
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed
            writer.close()
            assert proxy.stats.injected == {"corrupt": 1, "truncate": 1}
        finally:
            await proxy.stop()


async def test_blackhole_holds_answers_until_cleared_and_reset_aborts() -> None:
    """A hung node answers nothing until the fault ends; a reset aborts the connection."""
    async with _Answerer(500) as node:
        proxy = FaultProxy(node.port, seed=3)
        await proxy.start()
        try:
            proxy.faults = Faults(blackhole=True)
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
            writer.write(b"q\n")
            await writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(1), 0.3)
            proxy.clear()
            got = b""
            while len(got) < node.size:
                got += await asyncio.wait_for(reader.read(node.size - len(got)), 5)
            assert got == node.payload
            proxy.faults = Faults(reset=1.0)
            try:
                got = await _ask(reader, writer, node.size)
            except ConnectionError:
                got = b""
            assert len(got) < node.size
            assert proxy.stats.injected["reset"] == 1
            writer.close()
        finally:
            await proxy.stop()


async def test_proxy_to_a_dead_node_closes_the_client_connection() -> None:
    """A node that does not accept looks like a refused connection: the client sees EOF at once."""
    async with _Answerer(10) as node:
        dead_port = node.port
    proxy = FaultProxy(dead_port, seed=4)
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.listen_port)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert proxy.stats.refused == 1
    finally:
        await proxy.stop()


def test_fault_probabilities_are_validated() -> None:
    """Out-of-range probabilities are refused with a clear error, not silently clamped."""
    proxy = FaultProxy(1)
    with pytest.raises(ValueError, match="not in"):
        proxy.faults = Faults(corrupt=1.5)
    with pytest.raises(ValueError, match="must not exceed"):
        proxy.faults = Faults(reset=0.6, truncate=0.6)


# -- the checks -------------------------------------------------------------------------------------


def _log(partition: int, n: int) -> pa.Table:
    return pa.table(
        {
            "offset": pa.array(np.arange(n), pa.int64()),
            "value": pa.array([record_value(partition, i) for i in range(n)], pa.binary()),
        }
    )


def _copy(rows: list[tuple[int, int, bytes]]) -> pa.Table:
    return pa.table(
        {
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
        }
    )


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(0, 40),
    drop=st.sets(st.integers(0, 39)),
    dup=st.sets(st.integers(0, 39)),
    bad=st.sets(st.integers(0, 39)),
    extra=st.integers(0, 3),
)
def test_compare_counts_every_kind_of_difference(
    n: int, drop: set[int], dup: set[int], bad: set[int], extra: int
) -> None:
    """compare() reports exactly the lost, duplicated, mismatched and foreign offsets of a copy."""
    log = {0: _log(0, n)}
    rows = []
    for o in range(n):
        if o in drop:
            continue
        value = b"wrong" if o in bad else record_value(0, o)
        rows.append((0, o, value))
        if o in dup:
            rows.append((0, o, value))
    rows.extend((0, n + 10 + i, b"x") for i in range(extra))
    res = check.compare(log, _copy(rows[::-1]))  # order must not matter
    kept = [o for o in range(n) if o not in drop]
    assert res.lost == len([o for o in range(n) if o in drop])
    assert res.duplicates == len([o for o in kept if o in dup])
    assert res.mismatched == len([o for o in kept if o in bad])
    assert res.not_in_log == extra
    assert res.distinct == len(kept) + extra
    assert res.ok == (res.lost == res.duplicates == res.mismatched == extra == 0)


def test_check_log_finds_lost_acknowledgements_and_unacknowledged_writes() -> None:
    """An ack whose records are not in the log at its offsets is a broker loss; log records nobody
    acknowledged (answer lost in transit) are counted, not blamed."""
    log = {0: _log(0, 10), 1: _log(1, 0)}
    acks = [Ack(0, 0, 4, 0), Ack(0, 4, 2, 4), Ack(1, 0, 3, 0), Ack(0, 8, 2, 99)]
    res = check.check_log(log, acks)
    assert res.acknowledged == 11
    assert res.acked_missing == 3 + 2  # partition 1 is empty; offsets 8-9 hold other values
    assert res.unacknowledged_written == 2  # offsets 6 and 7
    assert res.examples


def test_spark_output_is_read_through_its_commit_log(tmp_path: Path) -> None:
    """Only files listed (and not deleted) in ``_spark_metadata`` count: a failed batch's leftover
    file in the output directory is not part of the table."""
    import pyarrow.parquet as pq

    out = tmp_path / "out"
    part = out / "topic=chaos" / "dt=2026-01-01"
    part.mkdir(parents=True)
    table = pa.table(
        {
            "partition": pa.array([0], pa.int32()),
            "offset": pa.array([0], pa.int64()),
            "value": pa.array([b"v"], pa.binary()),
        }
    )
    for name in ("committed.parquet", "leftover.parquet", "deleted.parquet"):
        pq.write_table(table, part / name)
    meta = out / "_spark_metadata"
    meta.mkdir()
    lines = ["v1"] + [
        json.dumps({"path": (part / n).as_uri(), "action": "add"})
        for n in ("committed.parquet", "deleted.parquet")
    ]
    (meta / "0").write_text("\n".join(lines) + "\n")
    (meta / "1").write_text(
        "v1\n" + json.dumps({"path": (part / "deleted.parquet").as_uri(), "action": "delete"}) + "\n"
    )
    assert check.spark_committed_files(out) == [part / "committed.parquet"]
    assert check.read_table_output(out, "chaos").num_rows == 1


# -- schedule ---------------------------------------------------------------------------------------


def test_schedule_is_reproducible_from_the_seed(tmp_path: Path) -> None:
    """The same seed plans the same rounds; a different seed plans others; a frozen daemon is held
    longer than the session timeout (or the fault would not make it lose its partitions)."""

    def plan(seed: int) -> list[tuple[list[str], float]]:
        run = ChaosRun(ChaosOptions(root=tmp_path, seed=seed, rounds=30, faults_per_round=3))
        run.disk.available = True
        return [run._plan_round() for _ in range(30)]

    a, b = plan(11), plan(11)
    assert a == b and a != plan(12)
    for kinds, hold in a:
        assert 1 <= len(kinds) <= 3
        if "daemon_freeze" in kinds:
            assert hold > 3.0 * 1.5


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        ChaosRun(ChaosOptions(root=tmp_path, kinds=("daemon_kill", "meteor")))
    with pytest.raises(ValueError, match="hold_min"):
        ChaosRun(ChaosOptions(root=tmp_path, hold_min=3, hold_max=1))


# -- disk faults ------------------------------------------------------------------------------------

_DISK_SCRIPT = """
import asyncio, errno, sys
from pathlib import Path
from mqd_dev.chaos.disk import LandingDisk

async def main():
    d = LandingDisk(Path(sys.argv[1]), 2)
    d.setup()
    assert d.available, d.reason
    try:
        (d.path / "a").write_bytes(b"x")
        await d.fill()
        try:
            (d.path / "b").write_bytes(b"y" * 8192)
            raise SystemExit("write succeeded on a full disk")
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        await d.drain()
        (d.path / "b").write_bytes(b"y" * 8192)
        held = open(d.path / "held", "ab")  # an open file must not stop the fault
        await d.make_readonly()
        try:
            (d.path / "c").write_bytes(b"z")
            raise SystemExit("write succeeded on a read-only disk")
        except OSError as exc:
            assert exc.errno == errno.EROFS, exc
        await d.make_writable()
        (d.path / "c").write_bytes(b"z")
        held.close()
        print("ok", sorted(p.name for p in d.path.iterdir()))
    finally:
        d.teardown()

asyncio.run(main())
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_disk_full_and_read_only_stop_root_and_are_undone(tmp_path: Path) -> None:
    """As root (where chmod stops nothing) the landing tmpfs really fails writes with ENOSPC when
    full and EROFS when read-only, and both faults are fully undone. Runs in a private mount
    namespace so nothing stays mounted."""
    target = tmp_path / "landing"
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", _DISK_SCRIPT, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    if "mount -t tmpfs failed" in r.stderr:
        pytest.skip("mount is not permitted here")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok ['a', 'b', 'c', 'held']" in r.stdout


# -- the short chaos run ----------------------------------------------------------------------------


# the seed-81 plan below was drawn from these (the integrity kinds came later)
_SHORT_KINDS = ",".join(k for k in CLASSIC_KINDS if k not in INTEGRITY_KINDS)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_short_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Three seeded rounds against real processes (seed 81: a daemon SIGSTOPped past its session +
    read-only landing + truncated answers; slave SIGKILL + daemon SIGKILL + full landing; master
    SIGKILL + a third daemon joining while one leaves + connection resets): every acknowledged record is
    landed exactly once with its value, no daemon or node crashed, every round recovered, every
    daemon stopped cleanly, and the summary says so."""
    out = tmp_path / "summary.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqd_dev.chaos",
            "--rounds",
            "3",
            "--seed",
            "81",
            "--groups",
            "1",
            "--partitions",
            "2",
            "--daemons",
            "2",
            "--faults-per-round",
            "3",
            "--hold-min",
            "1.5",
            "--hold-max",
            "3",
            "--round-timeout",
            "40",
            "--run-timeout",
            "110",
            "--batch-records",
            "10",
            "--kinds",
            _SHORT_KINDS,
            "--no-spark",
            "--root",
            str(tmp_path / "run"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=140,
        cwd=REPO,
    )
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["failures"] == [], "\n".join(s["failures"])
    assert r.returncode == 0 and s["ok"]
    rec = s["records"]
    assert s["rounds"] == 3
    if not s["disk_faults"].startswith("unavailable"):  # without mount rights the plan has no disk faults
        assert [r["kinds"] for r in s["round_log"]] == [
            ["daemon_freeze", "landing_readonly", "net_truncate"],
            ["slave_kill", "daemon_kill", "landing_full"],
            ["master_kill", "daemon_churn", "net_reset"],
        ]
    assert rec["acknowledged"] > 0
    assert rec["losses"] == 0 and rec["duplicates"] == 0 and rec["mismatched"] == 0
    assert rec["acked_missing_from_log"] == 0
    assert rec["landed_distinct"] == rec["in_log"] == rec["acknowledged"] + rec["unacknowledged_written"]
    assert s["crashes"] == {}
    assert all(r["recovery_s"] is not None for r in s["round_log"])
    assert "chaos PASSED" in r.stdout
