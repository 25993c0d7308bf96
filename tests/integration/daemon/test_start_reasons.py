"""A daemon that is not up yet says why in its log (issue 17, "the first five minutes"): which
bootstrap it waits for before the first metadata answer, and why no assignment is made while the
group has not taken it in. Real processes on 127.0.0.1, no broker where there is none."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
import structlog
from support.consumer import new_consumer
from support.daemon import daemon_config
from support.harness import Cluster

from mqd.consumer.errors import ConsumerError
from mqd.process.daemon import Daemon
from mqd.testing import free_port


async def test_no_broker_names_the_bootstrap_and_the_reason(tmp_path: Path) -> None:
    """Nothing answers at the bootstrap: the log says what start waits for (source, bootstrap,
    timeout) before the wait, and start fails with the address it tried."""

    class NoCluster:
        bootstrap = f"http://127.0.0.1:{free_port()}"

    # daemon_config reads only the bootstrap of its cluster: a port nothing listens on
    cfg = daemon_config(cast(Cluster, NoCluster()), tmp_path, consumer={"request_timeout": 1.0})
    with structlog.testing.capture_logs() as logs, pytest.raises(ConsumerError) as err:
        await asyncio.wait_for(Daemon(cfg).start(), 30)
    waiting = [e for e in logs if e["event"] == "waiting for cluster metadata"]
    assert waiting and waiting[0]["bootstrap"] == [NoCluster.bootstrap] and waiting[0]["source"] == "mqd"
    assert NoCluster.bootstrap in str(err.value)


async def test_a_rebalance_without_metadata_or_membership_says_why(tmp_path: Path, cluster: Cluster) -> None:
    """The rebalance round that cannot assign logs its reason once (not once per round), and that
    it can assign again."""

    cfg = daemon_config(cluster, tmp_path).consumer
    consumer = new_consumer(cfg)
    with structlog.testing.capture_logs() as logs:
        assert not await consumer.rebalance()  # not started: no metadata yet
        assert not await consumer.rebalance()
        await consumer.start()
        await consumer.stop()
    reasons = [e for e in logs if e["event"] == "no assignment yet"]
    assert len(reasons) == 1 and reasons[0]["reason"] == "no cluster metadata yet"
    assert any(e["event"] == "assignment possible again" for e in logs)


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": 2})


async def test_status_text_names_why_nothing_is_assigned_and_unmatched_patterns(
    tmp_path: Path, cluster: Cluster
) -> None:
    """`mqd status` text, not only the log, says why a daemon has no assignment yet, and which
    topic patterns match no topic (issue 17: every "not up yet" state names its reason)."""
    from mqd.operator.views import render_summary

    def text_of(daemon: Daemon) -> str:
        status = daemon.status()  # in the runner's shape: health and its reasons in one section
        status["health"] = {"status": status["health"], "reasons": status.pop("reasons")}
        return render_summary(status)

    cfg = daemon_config(cluster, tmp_path, consumer={"topics": ["events", "re:^later-.*"]})
    daemon = Daemon(cfg)
    assert not await daemon.consumer.rebalance()  # before start: no metadata yet
    text = text_of(daemon)
    assert "no assignment yet: no cluster metadata yet" in text
    await asyncio.wait_for(daemon.start(), 60)
    try:
        text = text_of(daemon)
        assert "topic patterns match no topic yet: re:^later-.*" in text
        assert "no assignment yet" not in text
    finally:
        await daemon.stop()


async def test_a_start_at_the_log_end_says_how_many_records_it_skips(
    tmp_path: Path, cluster: Cluster
) -> None:
    """consume_from = "last" leaves what the log already holds unlanded: the start says so, with
    the count per partition (issue 17: "a start-up line says where each partition starts and how
    many existing records that skips"); consume_from = "first" skips nothing and says nothing."""
    from support.daemon import produce_numbered

    from mqd.wire.client import BrokerClient

    async with BrokerClient(request_timeout=10) as client:
        await produce_numbered(client, cluster, 2, 300, per_batch=100)
    for consume_from, skipped in (("last", 600), ("first", None)):
        cfg = daemon_config(cluster, tmp_path / consume_from, consumer={"consume_from": consume_from})
        daemon = Daemon(cfg)
        with structlog.testing.capture_logs() as logs:
            await asyncio.wait_for(daemon.start(), 60)
            try:
                await asyncio.wait_for(daemon.consumer.rebalance(), 30)
            finally:
                await daemon.stop()
        lines = [e for e in logs if e["event"] == "start skips existing records"]
        if skipped is None:
            assert lines == []
        else:
            # one line per group of partitions resolved together (each is assigned when it resolves)
            assert sum(e["records"] for e in lines) == skipped
            assert {k: v for e in lines for k, v in e["partitions"].items()} == {
                "events/0": 300,
                "events/1": 300,
            }
