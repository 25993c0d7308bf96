"""A daemon told to stop exits within daemon.shutdown_timeout even when its object store hangs.

The chaos finding of seed 199203: with the landing table on, a daemon SIGTERMed while its S3
gateway hung gave the table's final commit a second full shutdown_timeout after the drain's, logged
"mqd stopped", and then did not exit at all: the interpreter joined the worker thread whose Delta
log read was stuck in the frozen store, until the supervisor SIGKILLed it. A real ``mqd run`` on a
SeaweedFS gateway of its own, frozen with SIGSTOP before the SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import write_config
from support.daemon import produce_numbered
from support.seaweedfs import fresh_uri

from mqd.testing.seaweedfs import REGION, SeaweedFS
from mqd.waiting import wait_until
from mqd.wire.client import BrokerClient

SHUTDOWN_S = 3.0
EXIT_MARGIN_S = 7.0  # interpreter exit and the log's flush, on a loaded machine


def _spawn(cfg: Path, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )


def _committed_versions(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count('"landing table commit"')
    except FileNotFoundError:
        return 0


@pytest.mark.slow
async def test_a_daemon_exits_in_time_while_its_store_hangs(
    cluster_factory: Any, tmp_path: Path, seaweedfs: SeaweedFS
) -> None:
    """Records landed and committed to the landing table on S3, then the daemon's gateway frozen
    and the daemon SIGTERMed: it exits within shutdown_timeout plus a margin, and says that the
    table was not committed (the next owner commits what is missing)."""
    gateway = seaweedfs.add_gateway()
    frozen = seaweedfs.gateway(seaweedfs.endpoints.index(gateway))
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    cfg = write_config(
        tmp_path,
        cluster,
        landing={
            "dir": fresh_uri(seaweedfs),
            "max_age": 0.3,
            "table": "delta",
        },
        daemon={"shutdown_timeout": SHUTDOWN_S},
        log={"level": "debug"},  # the table's commits are debug lines
    )
    log = tmp_path / "run.log"
    async with BrokerClient(request_timeout=20) as client:
        await produce_numbered(client, cluster, 2, 200, per_batch=100)
    proc = _spawn(
        cfg,
        log,
        {
            **seaweedfs.env(),
            "MQD_LANDING__S3__ENDPOINT_URL": gateway,
            "MQD_LANDING__S3__REGION": REGION,
            "MQD_LANDING__DELTA__COMMIT_INTERVAL": "0.3s",
        },
    )
    try:
        await wait_until(
            lambda: _committed_versions(log) >= 1 or proc.poll() is not None, 60, "a table commit"
        )
        assert proc.poll() is None, log.read_text()
        async with BrokerClient(request_timeout=20) as client:  # more to publish and commit at stop
            await produce_numbered(client, cluster, 2, 100, start=200, per_batch=100)
        frozen.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        deadline = SHUTDOWN_S + EXIT_MARGIN_S
        await wait_until(lambda: proc.poll() is not None, deadline + 30, "the daemon to exit")
        took = time.monotonic() - t0
    finally:
        frozen.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log.read_text(errors="replace")
    assert took <= deadline, (
        f"exited {took:.1f} s after SIGTERM (shutdown_timeout {SHUTDOWN_S} s)\n{text[-3000:]}"
    )
    assert "mqd stopped" in text, text[-3000:]
