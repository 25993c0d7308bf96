"""TLS: nodes serve HTTPS from tls_cert/tls_key, and a master/slave pair replicates over it."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import records_of

from mqd import format as fmt
from mqd.protocol import decode_fetch_answer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl tool")


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "node.crt", tmp_path / "node.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


async def test_https_cluster_serves_and_replicates(cluster_factory: Any, tmp_path: Path) -> None:
    """Over HTTPS (certificate trusted through SSL_CERT_FILE) a produce is acked with acks=all by a
    replicating slave and served back by the slave; plain HTTP to the TLS port gets no answer."""
    cert, key = await asyncio.to_thread(_self_signed, tmp_path)
    cluster = cluster_factory(topics={"events": 1}, slaves=1, tls=(cert, key),
                              env={"SSL_CERT_FILE": str(cert)})
    master, slave = cluster.url(cluster.master()), cluster.url(cluster.slaves()[0])
    assert master.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        body = fmt.encode_batch([b"secret"])
        async with session.post(f"{master}/v1/produce/events/0?acks=all", data=body) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["base_offset"] == 0
        req = {"partitions": [{"topic": "events", "partition": 0, "offset": 0}], "max_wait_ms": 0}
        async with session.post(f"{slave}/v1/fetch", json=req) as resp:
            answer = decode_fetch_answer(await resp.read())
        assert records_of(answer.partitions[0].data) == [(0, b"secret")]
        with pytest.raises(aiohttp.ClientError):
            async with session.get(master.replace("https://", "http://") + "/v1/health",
                                   timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
