"""Broker health reports a full or read-only data dir, and produce fails with a clear 5xx (issue 12.9).

A real node runs on a small tmpfs data dir (tests run as root, where chmod stops nothing): the
chaos harness's disk (mqd_dev/chaos/disk.py) fills it (ENOSPC) or stacks a read-only bind mount
over it (EROFS: files already open stay writable, new ones cannot be created). Health answered
``ok`` through both while every produce failed or the next segment roll would have.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from mqd_dev.chaos.disk import LandingDisk
from support.harness import Cluster

from mqd.waiting import wait_until_sync
from mqd.wire import format as fmt
from mqd.wire.protocol import BATCH_CONTENT_TYPE


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/health", timeout=5) as resp:
        assert resp.status == 200  # degraded or not, the node serves reads: peers keep it alive
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _produce(url: str, size: int = 100) -> tuple[int, dict[str, Any]]:
    batch = fmt.encode_batch([b"x" * size] * 10)
    req = urllib.request.Request(
        url + "/v1/produce/events/0", data=batch, headers={"Content-Type": BATCH_CONTENT_TYPE}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _degraded_with(url: str, needle: str) -> bool:
    h = _get(url)
    return h["status"] == "degraded" and any(needle in r for r in h.get("reasons", []))


def test_full_and_read_only_data_dir_show_in_health_and_fail_produce(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Full disk: produce answers 5xx naming ENOSPC and health turns degraded with the reason; a
    read-only data dir: health says EROFS and produce is refused with it; both clear once the disk
    is writable again, and produce works again."""
    cluster = cluster_factory(topics={"events": 1}, start=False)
    node = cluster.master(0)
    disk = LandingDisk(cluster.nodes[node].data_dir, size_mb=16)
    disk.setup()
    if not disk.available:
        pytest.skip(f"no tmpfs data dir here: {disk.reason}")
    try:
        cluster.start()
        url = cluster.url(node)
        assert _produce(url)[0] == 200
        assert _get(url)["status"] == "ok"
        assert "reasons" not in _get(url)

        asyncio.run(disk.fill())
        status, body = _produce(url, size=10_000)
        assert status >= 500, body
        assert "No space left on device" in body["reason"], body
        wait_until_sync(lambda: _degraded_with(url, "ENOSPC"), timeout=10, what="health: disk full")
        asyncio.run(disk.drain())
        wait_until_sync(lambda: _get(url)["status"] == "ok", timeout=10, what="health ok after drain")
        wait_until_sync(lambda: _produce(url)[0] == 200, timeout=10, what="produce ok after drain")

        asyncio.run(disk.make_readonly())
        wait_until_sync(lambda: _degraded_with(url, "EROFS"), timeout=10, what="health: read-only")
        status, body = _produce(url)
        assert status >= 500, body
        assert "EROFS" in body["reason"], body
        asyncio.run(disk.make_writable())
        wait_until_sync(lambda: _get(url)["status"] == "ok", timeout=10, what="health ok, writable again")
        assert _produce(url)[0] == 200
    finally:
        cluster.stop()
        disk.teardown()
