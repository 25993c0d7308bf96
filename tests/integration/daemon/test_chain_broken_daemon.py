"""A broken claim chain under the daemon (issue 31 item 2): the head claim deleted, overwritten by
an older valid claim, or overwritten by junk while the daemon runs stops that partition alone, with
the object named in ``health()`` and the status JSON, a counter, nothing published past the break
and the other partition landing on; a restart on such a landing (the resume path) refuses it too
(a burst run fails naming it); ``mqd status`` exits 1 naming it. The old daemon published past the
break from its cached head and stayed healthy."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.chain_tamper import HOW, tamper
from support.cli import mqd, produce, write_config
from support.daemon import daemon_config, produce_numbered

from mqd.landing.errors import ChainBroken
from mqd.landing.local_store import LocalStore
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

PER_FILE = 160


def head_seq(store: LocalStore, partition: int) -> int:
    return store.chain("events", partition).head()[0]


def landed(store: LocalStore, partition: int) -> int:
    last = store.head("events", partition).last_offset
    return 0 if last is None else last + 1


@pytest.mark.parametrize("how", HOW)
async def test_a_running_daemon_stops_the_partition_of_a_broken_chain(
    cluster_factory: Any, tmp_path: Path, how: str
) -> None:
    """Partition 0's head claim broken under a running daemon: the next records of partition 0 are
    not published (no claim after the broken one), health is degraded naming the claim, the
    counter and the status JSON say so; partition 1 lands on."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    cfg = daemon_config(cluster, tmp_path, max_records=PER_FILE, max_age=0.3)
    store = LocalStore(tmp_path / "landing")
    d = Daemon(cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop.wait()))
    try:
        async with BrokerClient(request_timeout=20) as client:
            await produce_numbered(client, cluster, 2, 3 * PER_FILE, per_batch=PER_FILE)
            await wait_until(
                lambda: landed(store, 0) == landed(store, 1) == 3 * PER_FILE, 60, "the first files"
            )
            seq = head_seq(store, 0)
            key = tamper(store.objects, "events", 0, seq, how)
            await produce_numbered(client, cluster, 2, PER_FILE, start=3 * PER_FILE, per_batch=PER_FILE)

            def stopped() -> bool:
                health, reasons = d.health()
                return health == "degraded" and any(key in r for r in reasons)

            await wait_until(stopped, 30, "the daemon to report the broken chain")
            await wait_until(lambda: landed(store, 1) == 4 * PER_FILE, 30, "partition 1 to land on")
        assert store.objects.get(store.chain("events", 0).claim_key(seq + 1)) is None
        assert d.stats["chain_breaks"] == 1
        assert d.status()["landing"]["chain_broken"] == {"events/0": key}
        assert "events/0" not in d.status()["landing"]["paused_for_disk"]
        assert d.state == "running"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.mark.parametrize("how", HOW)
async def test_a_restart_on_a_broken_chain_refuses_it(cluster_factory: Any, tmp_path: Path, how: str) -> None:
    """The head claim broken while no daemon runs, more records produced: a burst run (resume from
    the landing) fails with ChainBroken naming the claim (a deleted head: the file its range would
    take again), and nothing is published after the break. The old daemon either landed past it
    or retried a 'landing unwritable' error forever."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    cfg = daemon_config(cluster, tmp_path, max_records=PER_FILE, max_age=0.3)
    store = LocalStore(tmp_path / "landing")
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, 1, 3 * PER_FILE, per_batch=PER_FILE)
        await asyncio.wait_for(Daemon(cfg, burst=True).run(), 60)
        seq = head_seq(store, 0)
        key = tamper(store.objects, "events", 0, seq, how)
        await produce_numbered(client, cluster, 1, PER_FILE, start=3 * PER_FILE, per_batch=PER_FILE)
        d = Daemon(cfg, burst=True)
        with pytest.raises(ChainBroken) as err:
            await asyncio.wait_for(d.run(), 60)
    if how == "deleted":
        assert err.value.key.endswith(".parquet") and "a claim deleted?" in str(err.value)
    else:
        assert err.value.key == key
    assert d.stats["chain_breaks"] == 1
    assert store.objects.get(store.chain("events", 0).claim_key(seq + 1)) is None


def test_mqd_status_exits_1_naming_the_broken_claim(tmp_path: Path, cluster_factory: Any) -> None:
    """`mqd run` as its own process, its head claim deleted, more records: `mqd status` exits 1
    and names the claim's partition and the object; SIGTERM still stops the daemon with 0."""
    cluster = cluster_factory(topics={"events": 1}, groups=1)
    cfg = write_config(tmp_path, cluster, landing={"max_records": PER_FILE})
    store = LocalStore(tmp_path / "landing")
    log = (tmp_path / "run.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        produce(cluster, 2 * PER_FILE, batch=PER_FILE)
        asyncio.run(wait_until(lambda: landed(store, 0) == 2 * PER_FILE, 60, "the first files"))
        assert mqd("status", "-c", str(cfg)).returncode == 0
        key = tamper(store.objects, "events", 0, head_seq(store, 0), "deleted")
        produce(cluster, PER_FILE, batch=PER_FILE)

        def degraded() -> bool:
            return mqd("status", "-c", str(cfg)).returncode == 1

        asyncio.run(wait_until(degraded, 30, "mqd status to exit 1", interval=0.5))
        res = mqd("status", "-c", str(cfg), "--json")
        assert res.returncode == 1
        reasons = json.loads(res.stdout)["health"]["reasons"]
        assert any("claim chain broken" in r and "events/0" in r for r in reasons), reasons
        assert key.rsplit("/", 1)[0] in res.stdout or "part-00000-" in res.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        log.close()
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
