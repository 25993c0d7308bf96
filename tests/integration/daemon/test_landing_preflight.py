"""The landing's first encode at start (mqd/landing/preflight.py) and the memory baseline taken
after it (mqd/consumer/memory_gauge.py), on in-process daemons against real brokers."""

from __future__ import annotations

import asyncio
import typing
from pathlib import Path
from typing import Any

import pytest
from support.daemon import assert_exactly_once, daemon_config, produce_numbered

from mqd import metrics
from mqd.config import LandingConfig
from mqd.landing import preflight
from mqd.landing.errors import PreflightError
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient


@pytest.mark.parametrize("compression", typing.get_args(LandingConfig.model_fields["compression"].annotation))
def test_every_configurable_codec_encodes(compression: str) -> None:
    """Each value ``landing.compression`` accepts encodes a landing file that reads back."""
    assert preflight.encode_check(compression) > 0


async def test_a_codec_that_cannot_encode_fails_the_daemon_at_start(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """A pyarrow that cannot encode the configured codec (here a name no build knows, past the
    config's check) fails the daemon within seconds of start, naming the setting, with nothing
    published; not at the first publication, max_age later."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 2, 100, per_batch=50)
    cfg = daemon_config(cluster, tmp_path, max_age=300)
    cfg = cfg.model_copy(update={"landing": cfg.landing.model_copy(update={"compression": "nocodec"})})
    d = Daemon(cfg)
    with pytest.raises(PreflightError, match=r"landing.compression = 'nocodec'"):
        await asyncio.wait_for(d.run(), 30)
    assert d.stats["records_published"] == 0
    # a publication may have begun a scratch file in _staging (removed at the next start): none landed
    assert not [p for p in (tmp_path / "landing").rglob("*.parquet") if "_staging" not in p.parts]


async def test_memory_outside_the_charges_never_stops_the_daemon(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """Once the landing has encoded, the daemon takes its memory baseline. Memory it cannot charge
    (here 48 MiB the test holds in the same process) counts against the budget at most half of it:
    a 4 MiB budget still fetches what is produced after, every record lands once, and the counter
    says the cap applied."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    cfg = daemon_config(cluster, tmp_path, max_age=0.5, consumer={"max_buffered_bytes": 4 << 20})
    d = Daemon(cfg)
    capped = metrics.memory_outside_capped._value.get()
    stop = asyncio.Event()
    running = asyncio.create_task(d.run(shutdown=stop.wait()))
    try:
        await wait_until(lambda: d.memory.baseline is not None, 20, "the memory baseline")
        ballast = bytearray(b"x" * (48 << 20))  # touched: resident
        async with BrokerClient(request_timeout=10) as client:
            await produce_numbered(client, cluster, 4, 2000, per_batch=100)
        try:
            await wait_until(lambda: d.stats["records_published"] >= 8000, 20, "every record landed")
        except TimeoutError:
            print("DEBUG", d.stats, d.consumer.snapshot().totals)
            raise
        assert len(ballast) == 48 << 20
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
    assert_exactly_once(tmp_path / "landing", 4, 2000)
    assert metrics.memory_outside_capped._value.get() > capped
    assert d.memory.outside_peak >= 40 << 20
