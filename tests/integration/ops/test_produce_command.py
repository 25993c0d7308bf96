"""`mqd produce` as a user runs it: one master down does not stop the other group's partitions, the
summary names what failed, and a terminal gets a live progress line while a pipe gets none."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable

from support.harness import Cluster, fetch_all

from mqd.waiting import wait_until_sync


def _produce(bootstrap: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mqd.operator.cli",
        "produce",
        "--bootstrap",
        bootstrap,
        "--topic",
        "events",
        *args,
    ]


def test_one_master_down_fails_only_its_partitions(cluster_factory: Callable[..., Cluster]) -> None:
    """2 groups, 4 partitions (0 and 2 on broker-a, 1 and 3 on broker-b), broker-b's master stopped:
    every record for partitions 0 and 2 is acknowledged and in the log, the 2,000 records for 1 and 3
    are counted as failed, the run exits 1 and its summary names events/1 and events/3 (and not 0 or
    2). Off a terminal nothing but the summary is written."""
    cluster = cluster_factory(topics={"events": 4}, groups=2)
    assert [cluster.broker_group_of(p) for p in range(4)] == ["broker-a", "broker-b"] * 2
    cluster.stop_node(cluster.master("broker-b"))
    started = time.monotonic()
    res = subprocess.run(
        _produce(
            cluster.url(cluster.master("broker-a")), "--count", "4000", "--batch", "250", "--retries", "1"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert res.returncode == 1, res.stdout + res.stderr
    assert "produced 2000 of 4000 records" in res.stdout and "acked 2000, failed 2000" in res.stdout
    failed_lines = [line.strip() for line in res.stderr.splitlines() if line.startswith("  events/")]
    assert [line.split(":")[0] for line in failed_lines] == ["events/1", "events/3"], res.stderr
    assert all("acked 0, failed 1000" in line and "master unavailable" in line for line in failed_lines)
    assert "2000 records not acknowledged on 2 of 4 partitions" in res.stderr
    assert "\r" not in res.stderr and "records/s" not in res.stderr  # no progress line off a terminal
    for p in (0, 2):
        assert len(fetch_all(cluster.url(cluster.master("broker-a")), "events", p)) == 1000
    # one retry window for the down group (2 attempts of ~2 s), not one per batch
    assert took < 30, f"took {took:.1f}s"


def test_success_prints_one_summary_line(cluster_factory: Callable[..., Cluster]) -> None:
    """Everything acknowledged: exit 0, one summary line with acked and failed counts, stderr empty."""
    cluster = cluster_factory(topics={"events": 2})
    res = subprocess.run(
        _produce(cluster.bootstrap, "--count", "3000"), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    lines = res.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("produced 3000 records ")
    assert lines[0].endswith("acked 3000, failed 0")


def test_progress_line_on_a_terminal(cluster_factory: Callable[..., Cluster]) -> None:
    """With stderr on a pseudo-terminal and a 2-second run (--rate), the progress line is rewritten in
    place (carriage return + erase line) with sent, acked, failed and records/s, then erased before
    the summary."""
    cluster = cluster_factory(topics={"events": 2})
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            _produce(cluster.bootstrap, "--count", "3000", "--batch", "100", "--rate", "1500"),
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
        )
        os.close(slave)
        slave = -1
        chunks: list[bytes] = []

        def drained() -> bool:
            if not select.select([master], [], [], 0.2)[0]:
                return False
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed its end
                return True
            if not data:
                return True
            chunks.append(data)
            return False

        assert wait_until_sync(drained, timeout=60, what="mqd produce to close the terminal", interval=0.0)
        out, _ = proc.communicate(timeout=60)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert proc.returncode == 0, out
    tty = b"".join(chunks).decode()
    updates = re.findall(r"\r\x1b\[Kevents: sent [\d,]+/3,000, acked [\d,]+, failed 0, [\d,]+ records/s", tty)
    assert len(updates) >= 1, repr(tty)
    assert tty.endswith("\r\x1b[K"), repr(tty[-80:])  # erased before the summary
    assert out.startswith("produced 3000 records ")
