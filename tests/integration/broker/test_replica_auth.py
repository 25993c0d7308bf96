"""Replica identity (issue 13.1, 13.2) with real broker processes.

A replica call is accepted only from the node that signs it: a client token, no credentials or
another node's name cannot report progress, so acks=all still waits for the real (frozen) slave. A
process answering at the master's address without the master's secret is refused by the slave: it
never receives a token or a secret and the slave's log stays whole.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import tomllib
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from support.harness import Cluster, records_of
from support.replica import FakeMaster, fetched_replica, replica_client

from mqd.broker.replica_auth import HEADER_NODE, HEADER_NONCE
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError
from mqd.wire.protocol import decode_fetch_answer

TOKEN = "client-token-everyone-has"
TOPIC = "events"


def _forged_body(node: str) -> bytes:
    return json.dumps(
        {
            "node": node,
            "max_wait_ms": 0,
            "partitions": [{"topic": TOPIC, "partition": 0, "offset": 10**12}],
        }
    ).encode()


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, data=body, headers={"Content-Type": "application/json", **headers}) as resp:
        raw = await resp.read()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, {}


async def test_forged_replica_progress_is_refused_and_acks_all_waits(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """With one of two slaves frozen (still live for the master), replica fetches naming it with
    offset 10^12 are refused: with the client token (401), with no credentials (401), signed by the
    other slave but naming the frozen one in the body (403) or in the signature headers (401). The
    acks=all produce still waits for the frozen slave and fails with 504 (on main the forged
    request made it answer 200 at once)."""
    cluster = cluster_factory(
        topics={TOPIC: 1},
        slaves=2,
        node_settings={"auth_token": TOKEN, "liveness_timeout_ms": 60_000, "acks_all_timeout_ms": 2_000},
    )
    master, (frozen, other) = cluster.master(), cluster.slaves()
    murl = cluster.url(master)
    fetch_url = murl + "/v1/replica/fetch"
    async with BrokerClient(request_timeout=10.0, auth_token=TOKEN) as client:
        await client.produce(murl, TOPIC, 0, fmt.encode_batch([b"warm-up"]), acks="all")
        cluster.send_signal(frozen, signal.SIGSTOP)
        try:
            started = time.monotonic()
            produce = asyncio.create_task(
                client.produce(murl, TOPIC, 0, fmt.encode_batch([b"needs-both-slaves"]), acks="all")
            )
            # the client token every producer holds
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
                status, answer = await _post(session, fetch_url, _forged_body(frozen), {})
            assert status == 401, answer
            # no token at all, no signature
            async with aiohttp.ClientSession() as bare:
                status, answer = await _post(bare, fetch_url, _forged_body(frozen), {})
            assert status == 401, answer
            # the other slave, properly signed, speaking for the frozen one in the body
            async with replica_client(cluster, other) as rc:
                body = _forged_body(frozen)
                nonce = rc.auth.new_nonce()
                headers = rc.auth.sign_request("POST", "/v1/replica/fetch", body, nonce)
                async with aiohttp.ClientSession() as bare:
                    status, answer = await _post(bare, fetch_url, body, headers)
                assert status == 403, answer
                # ... or claiming the frozen slave's name with its own signature
                nonce = rc.auth.new_nonce()
                headers = rc.auth.sign_request("POST", "/v1/replica/fetch", body, nonce)
                headers[HEADER_NODE] = frozen
                async with aiohttp.ClientSession() as bare:
                    status, answer = await _post(bare, fetch_url, body, headers)
                assert status == 401, answer
            with pytest.raises(BrokerError) as err:
                await produce
            assert err.value.status == 504, err.value
            assert time.monotonic() - started >= 1.5  # it waited for the frozen slave
        finally:
            cluster.send_signal(frozen, signal.SIGCONT)


async def test_a_replayed_replica_request_is_refused(cluster_factory: Callable[..., Cluster]) -> None:
    """The same signed replica request sent twice: the first is answered, the replay gets 401."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1)
    master, slave = cluster.master(), cluster.slaves()[0]
    url = cluster.url(master) + "/v1/replica/offsets"
    async with replica_client(cluster, slave) as rc:
        headers = rc.auth.sign_request("GET", "/v1/replica/offsets", b"", rc.auth.new_nonce())
    async with aiohttp.ClientSession() as session:
        async with session.get(url, headers=headers) as resp:
            assert resp.status == 200
        async with session.get(url, headers=headers) as resp:
            assert resp.status == 401
            assert "replayed" in (await resp.json())["reason"]


async def test_a_fake_master_is_refused_and_learns_no_secret(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """The master is down and another process answers on its port (the issue's attack): the slave
    sends it no bearer token and no secret, applies none of its answers (its 100 records stay), and
    reports the unverified master in /v1/stats and a degraded health until the real master is back."""
    cluster = cluster_factory(topics={TOPIC: 1}, slaves=1, node_settings={"auth_token": TOKEN})
    master, slave = cluster.master(), cluster.slaves()[0]
    async with BrokerClient(request_timeout=10.0, auth_token=TOKEN) as client:
        for i in range(10):
            batch = fmt.encode_batch([b"r-%d-%d" % (i, j) for j in range(10)])
            await client.produce(cluster.url(master), TOPIC, 0, batch, acks="all")
    before = fetch_all_with_token(cluster, slave)
    assert len(before) == 100
    await asyncio.to_thread(cluster.kill, master)
    fake = FakeMaster(master)
    await fake.start(cluster.nodes[master].port)
    try:
        deadline = time.monotonic() + 15
        while fetched_replica(fake) < 3:
            assert time.monotonic() < deadline, "the slave never called the fake master"
            await asyncio.sleep(0.05)
        stats = cluster.get_json(slave, "/v1/stats")
        assert stats is not None
        assert stats["replication"]["unverified_answers"] >= 1
        health = cluster.health(slave)
        assert health is not None and health["status"] == "degraded", health
        assert any(r.startswith("unverified master") for r in health["reasons"]), health
    finally:
        await fake.stop()
    secrets = _secret_values(cluster, slave)
    for _, headers, body in fake.requests:
        assert "Authorization" not in headers and "authorization" not in headers
        assert TOKEN not in json.dumps(headers) and TOKEN.encode() not in body
        for secret in secrets:
            assert secret not in json.dumps(headers) and secret.encode() not in body
        assert headers[HEADER_NONCE]  # signed, not carrying a secret
    assert fetch_all_with_token(cluster, slave) == before
    # the real master back: the slave replicates from it again and its health clears
    await asyncio.to_thread(cluster.start_node, master)
    deadline = time.monotonic() + 15
    while (cluster.health(slave) or {}).get("status") != "ok":
        assert time.monotonic() < deadline, cluster.health(slave)
        await asyncio.sleep(0.05)


def fetch_all_with_token(cluster: Cluster, node: str) -> list[tuple[int, bytes]]:
    """Every record ``node`` serves for events/0 (fetch_all with the cluster's bearer token)."""
    body = json.dumps(
        {"partitions": [{"topic": TOPIC, "partition": 0, "offset": 0}], "max_wait_ms": 0}
    ).encode()
    req = urllib.request.Request(
        cluster.url(node) + "/v1/fetch",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        got: list[tuple[int, bytes]] = records_of(decode_fetch_answer(resp.read()).partitions[0].data)
        return got


def _secret_values(cluster: Cluster, node: str) -> list[str]:
    data = tomllib.loads(cluster.credentials[node].read_text())
    return list(data["secrets"].values())
