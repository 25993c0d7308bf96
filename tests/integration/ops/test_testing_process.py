"""mqd.testing.ManagedProcess, the one child-process manager of the tests, the chaos harness and
the benchmarks, against real child processes: stop with a SIGKILL deadline, restart, exits asked
for or not, readiness, the kernel's CPU figures, and the async twins."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from mqd.testing import ManagedProcess, ProcessError


def _python(tmp_path: Path, code: str, name: str = "child") -> ManagedProcess:
    return ManagedProcess(name, [sys.executable, "-c", code], tmp_path / f"{name}.log")


SLEEPER = "import time; print('up', flush=True); time.sleep(60)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


def test_stop_sends_sigterm_and_can_start_again(tmp_path: Path) -> None:
    """SIGTERM ends a sleeping child (exit -15); the same object starts it again; the log keeps both
    runs after their banner lines; stop() twice is harmless."""
    p = _python(tmp_path, SLEEPER)
    assert p.stop() is None  # never started
    p.start()
    p.wait_ready(lambda: "up" in p.tail(), timeout=10)
    assert p.running and p.pid is not None
    with pytest.raises(ProcessError):
        p.start()
    assert p.stop() == -signal.SIGTERM
    assert not p.running and p.stop() == -signal.SIGTERM
    p.start()
    p.wait_ready(lambda: p.tail().count("up") == 2, timeout=10)
    assert p.stop() == -signal.SIGTERM
    assert p.log_path.read_text().count("===== start child at") == 2


def test_a_child_ignoring_sigterm_is_killed_after_the_deadline(tmp_path: Path) -> None:
    """stop(timeout) falls back to SIGKILL; a frozen (SIGSTOPped) child is stopped too."""
    p = _python(tmp_path, STUBBORN)
    p.start()
    p.wait_ready(lambda: "up" in p.tail(), timeout=10)
    p.send_signal(signal.SIGSTOP)
    assert p.frozen
    assert p.stop(timeout=0.5) == -signal.SIGKILL


def test_exit_reports_and_cpu_figures(tmp_path: Path) -> None:
    """An exit nobody asked for is reported once (a supervisor's crash count), an asked-for one never;
    the reaped child's CPU seconds come from the kernel."""
    p = _python(tmp_path, "sum(range(3_000_000)); raise SystemExit(3)")
    p.start()
    assert p.wait(30) == 3
    assert p.unasked_exit() == 3 and p.unasked_exit() is None
    assert p.rusage is not None and p.rusage.ru_utime + p.rusage.ru_stime > 0
    q = _python(tmp_path, SLEEPER, "q")
    q.start()
    q.stop()
    assert q.unasked_exit() is None


def test_wait_ready_fails_fast_when_the_child_exits(tmp_path: Path) -> None:
    """A child that dies while starting raises ProcessError (a RuntimeError) with its log's end, at
    once rather than at the timeout; a child never ready raises TimeoutError."""
    p = _python(tmp_path, "print('boom: bad config', flush=True); raise SystemExit(2)")
    p.start()
    with pytest.raises(ProcessError, match="boom: bad config") as err:
        p.wait_ready(lambda: False, timeout=30)
    assert isinstance(err.value, RuntimeError) and "exited with 2" in str(err.value)
    q = _python(tmp_path, SLEEPER, "q")
    q.start()
    try:
        with pytest.raises(TimeoutError, match="q to be ready"):
            q.wait_ready(lambda: False, timeout=0.3)
    finally:
        q.stop()


async def test_async_twins_do_not_block_the_loop(tmp_path: Path) -> None:
    """wait_ready_async and stop_async give the same results as their sync twins."""
    p = _python(tmp_path, STUBBORN)
    p.start()

    async def up() -> bool:
        return "up" in p.tail()

    await p.wait_ready_async(up, timeout=10)
    assert await p.stop_async(timeout=0.5) == -signal.SIGKILL
    p.kill_now()  # already gone: nothing to do
