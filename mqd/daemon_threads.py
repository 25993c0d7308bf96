"""An executor whose worker threads never hold the process's exit.

The landing's blocking work (a publication to S3, a Delta log round) runs on worker threads. With
``ThreadPoolExecutor`` the interpreter joins every worker at exit, so one call stuck on a frozen
object store (boto3 retries for up to 90 s, delta-rs for minutes) kept a daemon alive long after it
had logged "mqd stopped", until its supervisor killed it (chaos seed 199203: exit -9 on SIGTERM).
Abandoning such a call is safe: publications and table commits are atomic and conditional, which is
what a SIGKILL relies on too. So the workers here are daemon threads.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreadExecutor(Executor):
    """Up to ``max_workers`` daemon threads, started as work arrives, taking work in order."""

    def __init__(self, max_workers: int = 1, *, thread_name_prefix: str = "mqd-worker") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # a release per finished piece of work: a worker free
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        future: Future[_T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            self._work.put((future, fn, args, kwargs))
            if not self._idle.acquire(timeout=0) and len(self._threads) < self._max_workers:
                name = f"{self._prefix}_{len(self._threads)}"
                thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                self._work.put(None)  # the next worker ends too
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # handed to the caller, as ThreadPoolExecutor does
                    future.set_exception(exc)
            del item, future, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            self._work.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()
