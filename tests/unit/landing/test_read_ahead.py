"""read_ahead (mqd/landing/read_ahead.py), what the readers of a landing fetch claims, chains and
files with: the results come back in the sequence's order whatever order the fetches finish in, the
window and the byte budget bound what is in flight, an exception comes out at the item that raised
it, stopping early starts nothing more, and ``settle`` returns only once the running fetches ended."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqd.daemon_threads import DaemonThreadExecutor
from mqd.landing.read_ahead import SharedPool, read_ahead

POOL = SharedPool(6, "test-read-ahead")


class Tracked:
    """A fetch that records how many calls run at once and which items were started."""

    def __init__(self, fetch: Callable[[int], int] = lambda i: i * 10) -> None:
        self.fetch = fetch
        self.lock = threading.Lock()
        self.running = self.peak = 0
        self.started: list[int] = []

    def __call__(self, item: int) -> int:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.started.append(item)
        try:
            return self.fetch(item)
        finally:
            with self.lock:
                self.running -= 1


@settings(max_examples=40, deadline=None)
@given(
    costs=st.lists(st.integers(0, 50), max_size=40),
    window=st.integers(1, 8),
    budget=st.integers(0, 120),
    seed=st.integers(0, 2**16),
)
def test_results_come_in_order_within_the_window_and_the_budget(
    costs: list[int], window: int, budget: int, seed: int
) -> None:
    """Each item with its own result, in order; never more than ``window`` fetches started and not
    yet handed back, nor more than ``budget`` of their cost unless a single item is out."""
    rng = random.Random(seed)
    gate = threading.Lock()
    out_items: list[int] = []  # started and not yet handed back: what the window bounds
    worst: list[tuple[int, int]] = []

    def fetch(i: int) -> int:
        if rng.random() < 0.5:
            threading.Event().wait(rng.random() / 2000)  # finish out of order now and then
        return i * 10

    def cost(i: int) -> int:
        return costs[i]

    def submitted(i: int) -> int:
        with gate:
            out_items.append(i)
            worst.append((len(out_items), sum(costs[j] for j in out_items)))
        return fetch(i)

    got = []
    for i, r in read_ahead(range(len(costs)), submitted, POOL.get(), window=window, cost=cost, budget=budget):
        with gate:
            out_items.remove(i)
        got.append((i, r))
    assert got == [(i, i * 10) for i in range(len(costs))]
    for n, spent in worst:
        assert n <= window
        assert n == 1 or spent <= budget


def test_an_exception_comes_out_at_its_item_and_stops_the_rest() -> None:
    """The items before the failing one are handed back first; nothing past the window after it is
    started once the caller has the exception."""
    tracked = Tracked(lambda i: 1 // (i - 5))  # item 5 raises
    seen = []
    with pytest.raises(ZeroDivisionError):
        for i, _r in read_ahead(range(100), tracked, POOL.get(), window=4):
            seen.append(i)
    assert seen == [0, 1, 2, 3, 4]
    assert max(tracked.started) <= 5 + 4
    assert tracked.peak <= 4


def test_without_a_pool_each_item_is_fetched_when_reached_on_the_callers_thread() -> None:
    threads = set()

    def fetch(i: int) -> int:
        threads.add(threading.get_ident())
        return i

    it = read_ahead(range(10), fetch, None, window=8)
    assert next(it) == (0, 0)
    it.close()
    assert threads == {threading.get_ident()}


def test_settle_returns_once_the_running_fetches_ended() -> None:
    """The caller stops after the first item while the others' fetches are running: with
    ``settle`` none is still running when the generator is closed."""
    release = threading.Event()
    tracked = Tracked(lambda i: i if i == 0 or release.wait(10) else -1)
    pool = DaemonThreadExecutor(4)
    it = read_ahead(range(4), tracked, pool, window=4, settle=True)
    assert next(it) == (0, 0)
    assert tracked.running <= 3
    threading.Timer(0.05, release.set).start()  # the store answers a moment later
    it.close()
    assert tracked.running == 0
    pool.shutdown(wait=True)


def test_a_shared_pool_is_made_again_in_a_forked_child() -> None:
    """A child forked from a process whose pool has threads gets a pool of its own (a copy of the
    parent's would have no threads to run its work)."""
    import os

    pool = SharedPool(2, "test-fork")
    assert pool.get().submit(lambda: 1).result(timeout=10) == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, never return into pytest
        ok = pool.get().submit(lambda: 7).result(timeout=10) == 7
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            assert f.read() == b"1"
    finally:
        os.waitpid(pid, 0)
