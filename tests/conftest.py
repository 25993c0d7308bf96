"""Shared fixtures: real broker clusters (tests/support/harness.py), a started BrokerClient, a Spark
session. Helpers that are not fixtures live in tests/support/."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.harness import Cluster
from support.kafka import broker as broker  # Tansu and Apache Kafka, one of each per module
from support.kafka import module_kafka_broker as module_kafka_broker
from support.kafka import tansu as tansu  # a real Kafka-protocol broker (the Kafka source's tests)
from support.kafka import topic as topic  # a topic name of the test's own on a shared broker
from support.seaweedfs import seaweedfs as seaweedfs  # the session's S3 endpoint (object-store tests)
from support.storage_node import storage_node as storage_node  # a broker Storage without a process

from mqd.wire.client import BrokerClient


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # remember each phase's outcome so fixtures can print node logs when a test failed
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@contextlib.contextmanager
def _clusters(
    root_for: Callable[[int], Path], failed: Callable[[], bool]
) -> Iterator[Callable[..., Cluster]]:
    """A cluster factory (``root_for(n)`` is the n-th cluster's folder) that stops every cluster it
    made on exit and prints their node logs when ``failed()``."""
    clusters: list[Cluster] = []

    def make(*, start: bool = True, **kwargs: Any) -> Cluster:
        cluster = Cluster(root_for(len(clusters)), **kwargs)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    try:
        yield make
    finally:
        show_logs = failed()
        for cluster in clusters:
            cluster.stop()
            if show_logs:
                print(cluster.dump_logs(), file=sys.stderr)


@pytest.fixture
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """``cluster_factory(topics={"events": 8}, groups=1, slaves=0, node_settings=..., overrides=...,
    start=True)`` -> a started :class:`Cluster`; every cluster is stopped at teardown, and node logs
    are printed when the test failed."""

    def failed() -> bool:
        return any(
            getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call")
        )

    with _clusters(lambda n: tmp_path / f"cluster{n}", failed) as make:
        yield make


@pytest.fixture(scope="module")
def module_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Cluster]]:
    """Like ``cluster_factory`` but shared by a whole test module (for read-mostly tests); node logs
    are printed at module teardown when any test failed meanwhile."""
    failed_before = request.session.testsfailed
    with _clusters(
        lambda n: tmp_path_factory.mktemp("cluster"), lambda: request.session.testsfailed > failed_before
    ) as make:
        yield make


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] Spark session shared by a test module (imported and started only where a test
    asks for it: the JVM takes seconds). pyspark keeps one JVM for the whole test process (a stopped
    session leaves it running), so its heap is sized for every module's tables, not one job's: at
    1 GiB the Kafka-to-Spark test ran out of heap after ~150 Spark tests (CI, 2026-12-01)."""
    from mqd.config import MqdConfig, SparkConfig
    from mqd.spark import job

    conf = SparkConfig(master="local[2]", shuffle_partitions=2, driver_memory="3g")
    session = job.build_session(MqdConfig(spark=conf))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp session, for requests BrokerClient would never send (malformed bodies, raw
    answers): the brokers judged by a client that is not mqd's."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session:
        yield session


@pytest.fixture
async def client() -> AsyncIterator[BrokerClient]:
    """A started BrokerClient with a short request timeout."""
    c = BrokerClient(request_timeout=10.0)
    await c.start()
    try:
        yield c
    finally:
        await c.close()
