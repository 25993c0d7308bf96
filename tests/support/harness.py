"""Real broker clusters for tests: :class:`mqd.testing.LocalCluster` under its test name, and
helpers that read records back.

Every real-process test in the project uses :class:`Cluster` (through the ``cluster_factory``
fixture in conftest.py); node logs are printed by the fixture when a test fails. The cluster is
synchronous (subprocesses, urllib): calling it from an async test blocks the loop for the time a
node needs to start, which is fine in tests.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from mqd.testing import (
    DEFAULT_NODE_SETTINGS,
    START_TIMEOUT,
    STOP_TIMEOUT,
    LocalCluster,
    NodeProcess,
    free_port,
    to_toml,
)

Cluster = LocalCluster

__all__ = [
    "DEFAULT_NODE_SETTINGS",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "Cluster",
    "NodeProcess",
    "fetch_all",
    "free_port",
    "records_of",
    "self_signed_cert",
    "to_toml",
]


# -- record helpers for tests ----------------------------------------------------------------------


def records_of(data: bytes | memoryview, start_offset: int | None = None) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of every record in whole batches ``data`` (CRC-checked), from ``start_offset``."""
    from mqd.wire import format as fmt

    buf = bytes(data)
    out: list[tuple[int, bytes]] = []
    for info in fmt.scan(buf, crc=True):
        rb = fmt.to_arrow(buf, info, start_offset)
        out.extend(zip(rb.column("offset").to_pylist(), rb.column("value").to_pylist(), strict=True))
    return out


def fetch_all(url: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of every record a node holds for ``topic``/``partition`` from offset 0, by
    one synchronous fetch (no long poll); every batch is validated (magic, length, CRC, offsets)."""
    from mqd.wire import format as fmt
    from mqd.wire.protocol import decode_fetch_answer

    body = json.dumps(
        {
            "partitions": [{"topic": topic, "partition": partition, "offset": 0}],
            "max_wait_ms": 0,
            "max_bytes": 64 * 1024 * 1024,
        }
    ).encode()
    req = urllib.request.Request(url + "/v1/fetch", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # a non-2xx answer raises HTTPError
        data = bytes(decode_fetch_answer(resp.read()).partitions[0].data)
    if data:
        fmt.validate(data)
    return records_of(data)


def self_signed_cert(d: Path) -> tuple[Path, Path]:
    """``(cert, key)``: a one-day self-signed certificate for 127.0.0.1 in ``d`` (needs ``openssl``)."""
    cert, key = d / "node.crt", d / "node.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key
