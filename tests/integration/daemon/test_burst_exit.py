"""How `mqd run` ends (issue 34): once the runner returns it leaves with ``os._exit`` after the
atexit handlers, skipping the interpreter's teardown, and a burst's end does no work for a process
about to exit. What a run guarantees must hold all the same: every record published and committed,
the idle watermarks and markers written, last_exit.json, the pid file released, the log flushed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from support.cli import write_config
from support.daemon import assert_exactly_once, committed, produce_numbered
from support.harness import Cluster

from mqd.landing.backends import open_store
from mqd.wire.client import BrokerClient

PARTITIONS = 4
PER_PARTITION = 2500


def _run_burst(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg), "--burst"],
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_a_burst_run_exits_with_everything_landed_committed_and_recorded(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """`mqd run --burst` as a user runs it (admin endpoint on, the landing table on): exit 0, every
    record landed once and committed, every partition's idle watermark written at the burst's end,
    last_exit.json clean with the run's counts, the pid file gone, and the log's last line, "mqd
    stopped", on stderr whole."""
    cluster = cluster_factory(topics={"events": PARTITIONS}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, PARTITIONS, PER_PARTITION, per_batch=500)
        cfg = write_config(
            tmp_path, cluster, consumer={"group": "burst-exit"}, landing={"max_records": 1000, "max_age": 5.0}
        )
        res = await asyncio.to_thread(_run_burst, cfg)
        assert res.returncode == 0, res.stderr[-3000:]
        assert_exactly_once(tmp_path / "landing", PARTITIONS, PER_PARTITION)
        offsets = await committed(client, cluster, "burst-exit")
        assert offsets == dict.fromkeys(range(PARTITIONS), PER_PARTITION)

    store = open_store(tmp_path / "landing")
    assert all(store.head("events", p).watermark_ms is not None for p in range(PARTITIONS))
    last = json.loads((tmp_path / "state" / "last_exit.json").read_text())
    assert (last["exit_code"], last["clean"], last["reason"]) == (0, True, "burst finished")
    assert last["stats"]["records_published"] == PARTITIONS * PER_PARTITION
    assert not (tmp_path / "state" / "mqd.pid").exists()
    final = json.loads(res.stderr.rstrip("\n").splitlines()[-1])
    assert (final["event"], final["exit_code"]) == ("mqd stopped", 0)


_EXIT = """
import atexit, sys, threading
from mqd.operator.cli import _exit_after_run

class Torn:
    def __del__(self):
        sys.stderr.write("torn down\\n")

torn = Torn()  # a module global: a normal exit's teardown deletes it
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
sys.stdout.write("unflushed")  # no newline: still in the buffer of a pipe
if sys.argv[1] == "thread":
    done = threading.Event()
    def work():
        done.wait(0.3)  # work still running when the runner returned
        sys.stderr.write("thread done\\n")
    threading.Thread(target=work).start()
_exit_after_run(3)
"""


def _exit(mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EXIT), mode], capture_output=True, text=True, timeout=60
    )


def test_the_exit_runs_atexit_handlers_and_flushes_but_skips_the_teardown() -> None:
    """The exit code is the runner's, atexit handlers run (logging.shutdown is one), buffered output
    is flushed, and no object is torn down one by one (its __del__ never runs)."""
    res = _exit("alone")
    assert res.returncode == 3
    assert res.stdout == "unflushed"
    assert res.stderr == "atexit ran\n"


def test_a_thread_still_running_gets_the_normal_exit() -> None:
    """A Python thread that is not a daemon thread is joined, as a normal exit joins it: its work
    ends before the process does."""
    res = _exit("thread")
    assert res.returncode == 3
    assert res.stdout == "unflushed"
    assert res.stderr.splitlines()[:2] == ["thread done", "atexit ran"]
