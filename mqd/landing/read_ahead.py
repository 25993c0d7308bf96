"""Fetching the items of a sequence ahead, in order, on worker threads.

Every reader of an object store walks something in order: a chain's claims (one GET each), a
chain after chain (a floor, a listing, claims), an input partition's files. One request at a time
costs a round trip per item, which on S3 (20-50 ms) turns a landing of thousands of claims into
minutes. ``read_ahead`` keeps a bounded window of fetches in flight and hands the results back in
the sequence's order, so what checks them (a chain's links, a file's decode) runs as it did, one
item after the other, and an exception comes out at the item that raised it.

The pools are process-wide and their workers daemon threads (mqd.daemon_threads: a GET stuck on a
frozen store never holds the process's exit); a forked child makes its own on first use.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Executor, Future, wait
from typing import TypeVar

from mqd.daemon_threads import DaemonThreadExecutor

_T = TypeVar("_T")
_R = TypeVar("_R")


def read_ahead(
    items: Iterable[_T],
    fetch: Callable[[_T], _R],
    pool: Executor | None,
    *,
    window: int,
    cost: Callable[[_T], int] | None = None,
    budget: int = 0,
    settle: bool = False,
) -> Generator[tuple[_T, _R], None, None]:
    """Each item with ``fetch(item)``, in order, with up to ``window`` items fetched ahead on
    ``pool`` (None: each fetched when it is reached, on the caller's thread); with ``cost``, also at
    most ``budget`` of it ahead, but always at least one item. Stopping early (an exception, the
    caller closing the generator) cancels the fetches not started; ``settle`` waits for those
    running, for a ``fetch`` with side effects the caller must not see after it stopped."""
    if pool is None:
        for item in items:
            yield item, fetch(item)
        return
    weigh = cost if cost is not None else _free
    pending: deque[tuple[_T, Future[_R], int]] = deque()
    ahead = 0
    todo = iter(items)
    try:
        nxt = next(todo, None)
        while nxt is not None or pending:
            while nxt is not None and (
                not pending or (len(pending) < window and ahead + weigh(nxt) <= budget)
            ):
                weight = weigh(nxt)
                pending.append((nxt, pool.submit(fetch, nxt), weight))
                ahead += weight
                nxt = next(todo, None)
            item, fut, weight = pending.popleft()
            ahead -= weight
            yield item, fut.result()
    finally:
        for _item, fut, _weight in pending:
            fut.cancel()
        if settle:
            wait([fut for _item, fut, _weight in pending])


def _free(_item: object) -> int:
    return 0  # no cost given: only the window bounds what is ahead


class SharedPool:
    """A process-wide ``DaemonThreadExecutor`` made on first use (and again in a forked child,
    whose copy of the parent's has no threads behind it)."""

    def __init__(self, workers: int, name: str) -> None:
        self.workers = workers
        self.name = name
        self._pool: DaemonThreadExecutor | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> DaemonThreadExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = DaemonThreadExecutor(self.workers, thread_name_prefix=self.name)
            return self._pool

    def _forget(self) -> None:
        self._pool = None
        self._lock = threading.Lock()
