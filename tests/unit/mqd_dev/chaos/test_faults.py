"""The chaos tool's data-safety fault helpers: segment damage, /proc/locks reading, the freeze inside
a held lock (against a real child process holding a real flock), and the assignment watch."""

from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path

import pytest
from mqd_dev.chaos.lock_freeze import freeze_in_lock, held_flocks
from mqd_dev.chaos.node_data import closed_segments, flip_byte, truncate_file
from mqd_dev.chaos.procs import DaemonProc, started_in_log
from mqd_dev.chaos.publish_kill import assigned_partitions
from mqd_dev.chaos.runner import ChaosOptions, ChaosRun

from mqd.landing import layout
from mqd.waiting import wait_until_sync


def _segments(root: Path, partition: int, n: int) -> list[Path]:
    d = root / "logs" / f"chaos-{partition}"
    d.mkdir(parents=True)
    out = []
    for i in range(n):
        f = d / f"{i * 100:020d}.log"
        f.write_bytes(bytes(range(256)) * 4)
        out.append(f)
    return out


def test_only_closed_segments_are_damaged(tmp_path: Path) -> None:
    """The last .log of a partition is the active segment: never offered; empty files neither."""
    a = _segments(tmp_path, 0, 3)
    b = _segments(tmp_path, 1, 1)
    a[1].write_bytes(b"")
    assert closed_segments(tmp_path, "chaos", [0, 1, 2]) == [a[0]]
    assert b and closed_segments(tmp_path, "chaos", [1]) == []


def test_flip_and_truncate_change_exactly_what_they_say(tmp_path: Path) -> None:
    """One byte inverted at the returned position and nothing else; a truncation to a length in
    [1, size)."""
    seg = _segments(tmp_path, 0, 1)[0]
    before = seg.read_bytes()
    pos = flip_byte(seg, random.Random(3))
    after = seg.read_bytes()
    assert [i for i in range(len(before)) if before[i] != after[i]] == [pos]
    assert after[pos] == before[pos] ^ 0xFF
    old, new = truncate_file(seg, random.Random(4))
    assert old == len(before) and 1 <= new < old and seg.stat().st_size == new


def test_proc_locks_lines_are_read_for_holders_only() -> None:
    """A FLOCK held by the pid counts; a waiter (``->``), a POSIX lock or another pid does not."""
    text = "\n".join(
        [
            "1: FLOCK  ADVISORY  WRITE 4242 00:2f:1001 0 EOF",
            "1: -> FLOCK  ADVISORY  WRITE 4242 00:2f:1002 0 EOF",
            "2: POSIX  ADVISORY  WRITE 4242 00:2f:1003 0 EOF",
            "3: FLOCK  ADVISORY  WRITE 999 00:2f:1004 0 EOF",
            "4: OFDLCK ADVISORY  READ  -1 08:01:1005 0 EOF",
            "garbage",
        ]
    )
    assert held_flocks(text, 4242) == {1001}


_HOLDER = """
import fcntl, os, sys, time
path = sys.argv[1]
while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    time.sleep(0.003)  # the commit window
    os.close(fd)
    time.sleep(0.05)
"""


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs /proc/locks")
def test_freeze_lands_inside_the_lock_window(tmp_path: Path) -> None:
    """A real process taking and releasing a landing lock for 3 ms every 50 ms is SIGSTOPped while
    it holds the lock: once frozen, the kernel still lists its flock."""
    landing = tmp_path / "landing"
    lock = landing / layout.STATE_DIR / "chaos" / "00000.lock"
    lock.parent.mkdir(parents=True)
    proc = DaemonProc("holder", tmp_path / "unused.toml", tmp_path, {})
    proc.argv = [sys.executable, "-c", _HOLDER, str(lock)]
    proc.start()
    try:
        wait_until_sync(lock.exists, 10, "the holder's lock file")
        got = freeze_in_lock(proc, landing, timeout=20.0)
        assert got == lock and proc.frozen
        with open("/proc/locks") as fh:
            assert lock.stat().st_ino in held_flocks(fh.read(), proc.pid or -1)
        proc.send_signal(signal.SIGCONT)
    finally:
        proc.stop(signal.SIGKILL)


def test_assignment_is_read_from_the_log_after_the_restart(tmp_path: Path) -> None:
    """Only a ``start positions`` line with partitions, written after the restart's offset, counts."""
    log = tmp_path / "d0.log"
    old = json.dumps({"event": "start positions", "positions": {"chaos/0": [5, "landing"]}})
    log.write_text(old + "\n")
    start = log.stat().st_size
    assert assigned_partitions(log, start) is None
    with open(log, "a") as fh:
        fh.write(json.dumps({"event": "start positions", "positions": {}}) + "\nnot json\n")
        assert assigned_partitions(log, start) is None
        line = {"event": "start positions", "positions": {"chaos/3": [1, "x"], "chaos/1": [2, "y"]}}
        fh.write(json.dumps(line) + "\n")
    assert assigned_partitions(log, start) == [1, 3]


def test_freezes_outlive_the_session(tmp_path: Path) -> None:
    """Rounds with a lock_freeze are held past the session timeout and the hand-over, so the
    partitions whose locks are free can be expected to move while the holder is frozen; choosing
    kill_before_publish also makes the first start resolve ``consume_from = "last"``."""
    run = ChaosRun(ChaosOptions(root=tmp_path, seed=3, rounds=40, kinds=("lock_freeze",)))
    plans = [run._plan_round() for _ in range(10)]
    assert all(kinds == ["lock_freeze"] and hold >= 10.0 for kinds, hold in plans)
    assert not run.first_start_kill and run.load.generation[0] == 0
    run = ChaosRun(ChaosOptions(root=tmp_path, seed=3, kinds=("kill_before_publish",)))
    assert run.first_start_kill and set(run.load.generation.values()) == {-1}


def test_started_means_since_the_last_start_banner() -> None:
    """A ``daemon started`` line counts only after the last start banner: a restarted daemon that
    has not logged it yet is still importing."""
    first = b'===== start d0 at 1.0 =====\n{"event": "daemon started"}\n'
    assert started_in_log(first)
    assert not started_in_log(first + b"===== start d0 at 2.0 =====\n")
    assert not started_in_log(b"")


_SLOW_STARTER = """
import json, signal, sys, time
time.sleep(1.5)  # the imports: a SIGTERM now kills the process (-15)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(json.dumps({"event": "daemon started"}), flush=True)
while True:
    time.sleep(0.05)
"""


async def test_a_daemon_is_stopped_only_once_it_has_started(tmp_path: Path) -> None:
    """The chaos run's SIGTERM (churn, settle) waits until a just-started daemon has installed its
    handlers, so a graceful stop exits 0 and no failure is recorded; sent at once (as before), the
    same process dies with -15."""
    run = ChaosRun(ChaosOptions(root=tmp_path, seed=1))
    d = DaemonProc("slow", tmp_path / "unused.toml", tmp_path, {})
    d.argv = [sys.executable, "-c", _SLOW_STARTER]
    d.start()
    try:
        assert await run._stop_clean(d) == 0
        assert run.failures == []
        d.start()
        assert await d.stop_async(signal.SIGTERM, timeout=10) == -signal.SIGTERM
    finally:
        d.kill_now()


async def test_a_daemon_that_refused_its_start_is_a_refusal_not_a_failed_stop(tmp_path: Path) -> None:
    """A daemon whose source did not answer at start exits 75 on its own; when that happens while
    the run waits to stop it (churn, settle), the exit is counted as a start refusal, not as a
    daemon that failed a graceful stop (chaos seed 552859 failed on exactly that)."""
    run = ChaosRun(ChaosOptions(root=tmp_path, seed=1))
    d = DaemonProc("refuser", tmp_path / "unused.toml", tmp_path, {})
    d.argv = [sys.executable, "-c", "import sys; sys.exit(75)"]
    d.start()
    try:
        assert await run._stop_clean(d) == 75
        assert run.failures == [] and run.start_refusals["refuser"] == 1
    finally:
        d.kill_now()
