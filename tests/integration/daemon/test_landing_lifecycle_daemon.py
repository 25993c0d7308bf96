"""The daemon's lifecycle timer (landing.lifecycle.interval, mqd/landing/lifecycle.py): a running
daemon deletes the landed files its registered queries all committed, and only those, and counts
them; a registered query without progress holds everything back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from support.daemon import daemon_config, produce_numbered

from mqd.config import LandingLifecycleConfig
from mqd.landing import LocalStore, lifecycle
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient


async def test_daemon_timer_deletes_what_every_query_committed(cluster_factory: Any, tmp_path: Path) -> None:
    """Two queries registered: nothing goes while one is behind; once both committed every file
    of each chain, the daemon's timer deletes all but each chain's newest, counted in its stats."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    cfg = daemon_config(cluster, tmp_path, max_records=100)
    lc = LandingLifecycleConfig(interval=0.2)
    cfg = cfg.model_copy(update={"landing": cfg.landing.model_copy(update={"lifecycle": lc})})
    store = LocalStore(tmp_path / "landing")
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 2, 500, per_batch=100)
        d = Daemon(cfg)
        stop = asyncio.Event()
        run = asyncio.create_task(d.run(stop.wait()))
        try:
            await wait_until(lambda: d.stats["records_published"] == 1000, 30, "landing")
            chains = lifecycle.manifest_chains(store)
            counts = {k: len(v) for k, v in chains.items()}
            assert counts == {"events/0": 5, "events/1": 5}
            lifecycle.register(store, "main")
            lifecycle.register(store, "quarantine")
            lifecycle.record_committed(store, "main", counts, 0)
            recorded = time.time()

            def cleaned_since() -> bool:
                info = store.objects.head(lifecycle.CLEANED_KEY)
                return info is not None and info.modified > recorded + 0.05

            await wait_until(cleaned_since, 10, "a clean after the records")  # quarantine is behind
            assert d.stats["lifecycle_files_deleted"] == 0
            assert all(store.objects.head(f.path) for fs in chains.values() for f in fs)
            lifecycle.record_committed(store, "quarantine", counts, 0)
            await wait_until(lambda: d.stats["lifecycle_files_deleted"] == 8, 10, "cleaned")
            left = [f.path for fs in chains.values() for f in fs if store.objects.head(f.path) is not None]
            assert left == [chains["events/0"][-1].path, chains["events/1"][-1].path]
            assert d.stats["lifecycle_files_expired"] == 0
        finally:
            stop.set()
            await asyncio.wait_for(run, 30)
