"""The pid file: held with flock while the daemon runs, so liveness never depends on pid reuse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqd.process.runner import PidFile, RunnerError, read_pid, running_pid


def test_acquire_writes_pid_and_blocks_a_second_holder(tmp_path: Path) -> None:
    """The first holder writes its pid; a second one is refused naming that pid."""
    path = tmp_path / "run" / "mqd.pid"
    first = PidFile(path)
    first.acquire()
    first.acquire()  # idempotent
    assert read_pid(path) == os.getpid()
    assert running_pid(path) == os.getpid()
    with pytest.raises(RunnerError, match=f"already running \\(pid {os.getpid()}"):
        PidFile(path).acquire()
    first.release()
    first.release()  # idempotent
    assert not path.exists()
    assert running_pid(path) is None


def test_stale_file_is_taken_over(tmp_path: Path) -> None:
    """A pid file left by a crash (no lock held) is not a running daemon and is reused."""
    path = tmp_path / "mqd.pid"
    path.write_text("1\n")
    assert running_pid(path) is None
    pf = PidFile(path)
    pf.acquire()
    assert read_pid(path) == os.getpid()
    pf.release()


def test_lock_held_by_another_process_is_seen(tmp_path: Path) -> None:
    """Another process holding the file is reported by running_pid and blocks acquire."""
    path = tmp_path / "mqd.pid"
    code = (
        "import sys, time; from pathlib import Path; from mqd.process.runner import PidFile\n"
        f"p = PidFile(Path({str(path)!r})); p.acquire(); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        assert running_pid(path) == proc.pid
        with pytest.raises(RunnerError) as info:
            PidFile(path).acquire()
        assert info.value.retriable
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)
    # the holder exited without releasing: the kernel dropped the lock, the file is stale
    assert running_pid(path) is None


def test_unwritable_location_is_a_clear_error(tmp_path: Path) -> None:
    """A pid file that cannot be created names the path."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RunnerError, match="cannot open pid file"):
        PidFile(blocker / "mqd.pid").acquire()
