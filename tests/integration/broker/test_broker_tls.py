"""TLS: nodes serve HTTPS from tls_cert/tls_key, and a master/slave pair replicates over it."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.harness import records_of, self_signed_cert

from mqd.wire import format as fmt
from mqd.wire.protocol import decode_fetch_answer

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl tool")


async def test_https_cluster_serves_and_replicates(cluster_factory: Any, tmp_path: Path) -> None:
    """Over HTTPS (certificate trusted through SSL_CERT_FILE) a produce is acked with acks=all by a
    replicating slave and served back by the slave; plain HTTP to the TLS port gets no answer."""
    cert, key = await asyncio.to_thread(self_signed_cert, tmp_path)
    cluster = cluster_factory(
        topics={"events": 1}, slaves=1, tls=(cert, key), env={"SSL_CERT_FILE": str(cert)}
    )
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
            async with session.get(
                master.replace("https://", "http://") + "/v1/health", timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                await resp.read()


async def test_tls_ca_file_without_ssl_cert_file(cluster_factory: Any, tmp_path: Path) -> None:
    """With ``tls_ca_file`` on the nodes and ``ca_file`` on the client (no SSL_CERT_FILE), a slave
    replicates over HTTPS (acks=all succeeds) and the client reads the record back from it; a
    client without the CA is refused; a CA file that does not exist is a clear, final error."""
    from mqd.wire.client import BrokerClient, BrokerError

    cert, key = await asyncio.to_thread(self_signed_cert, tmp_path)
    env = {"SSL_CERT_FILE": "/nonexistent/ca.pem"}  # the system store must not be what works here
    cluster = cluster_factory(
        topics={"events": 1}, slaves=1, tls=(cert, key), env=env, node_settings={"tls_ca_file": str(cert)}
    )
    master, slave = cluster.url(cluster.master()), cluster.url(cluster.slaves()[0])
    async with BrokerClient(request_timeout=10, ca_file=cert) as client:
        r = await client.produce(master, "events", 0, fmt.encode_batch([b"pinned"]), acks="all")
        assert r.base_offset == 0
        answer = await client.fetch(slave, [{"topic": "events", "partition": 0, "offset": 0}], max_wait_ms=0)
        assert records_of(answer.partitions[0].data) == [(0, b"pinned")]
    async with BrokerClient(request_timeout=10) as untrusting:
        with pytest.raises(BrokerError, match=r"[Cc]ertificate"):
            await untrusting.health(master)
    with pytest.raises(BrokerError, match="cannot load CA file") as err:
        BrokerClient(ca_file=tmp_path / "missing.pem")
    assert err.value.retriable is False
