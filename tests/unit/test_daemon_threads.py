"""DaemonThreadExecutor: an executor like ThreadPoolExecutor whose stuck work never holds the
process's exit (mqd/daemon_threads.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest

from mqd.daemon_threads import DaemonThreadExecutor


def test_results_and_exceptions_reach_the_caller() -> None:
    """Results and exceptions come back through the future, as from ThreadPoolExecutor."""
    ex = DaemonThreadExecutor(2)
    assert ex.submit(lambda a, b: a + b, 2, b=3).result(5) == 5
    with pytest.raises(ZeroDivisionError):
        ex.submit(lambda: 1 / 0).result(5)
    ex.shutdown()


def test_it_runs_up_to_max_workers_at_once_and_no_more() -> None:
    """Two workers run two blocked pieces of work at once; a third waits for one of them."""
    ex = DaemonThreadExecutor(2, thread_name_prefix="t")
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocked() -> str:
        started.release()
        release.wait(10)
        return threading.current_thread().name

    futures = [ex.submit(blocked) for _ in range(3)]
    assert started.acquire(timeout=5) and started.acquire(timeout=5)
    assert not started.acquire(timeout=0.2)  # the third is queued behind the two
    release.set()
    names = {f.result(5) for f in futures}
    assert names <= {"t_0", "t_1"} and all(t.daemon for t in ex._threads)
    ex.shutdown()


def test_shutdown_cancels_queued_work_and_refuses_new() -> None:
    ex = DaemonThreadExecutor(1)
    release = threading.Event()
    running = ex.submit(release.wait, 10)
    queued = ex.submit(lambda: "never")
    ex.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        ex.submit(lambda: None)
    release.set()
    assert running.result(5) is True


async def test_asyncio_runs_blocking_work_on_it() -> None:
    ex = DaemonThreadExecutor(1)
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(ex, sum, [1, 2, 3]) == 6
    ex.shutdown()


def test_a_stuck_worker_does_not_hold_the_exit() -> None:
    """A process whose worker is stuck (a call into a frozen store) exits when its main code
    ends; with ThreadPoolExecutor the interpreter joins the worker and never exits."""
    code = textwrap.dedent(
        """
        import threading
        from mqd.daemon_threads import DaemonThreadExecutor
        ex = DaemonThreadExecutor(1)
        started = threading.Event()
        ex.submit(lambda: (started.set(), threading.Event().wait()))
        started.wait(10)
        ex.shutdown(wait=False, cancel_futures=True)
        print("main done")
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "main done", res.stderr
