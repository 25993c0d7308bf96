"""Bad input gets a 4xx with a reason, never a crash or a damaged log (real broker processes)."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from support.harness import Cluster, records_of

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient, BrokerError

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def node(module_cluster_factory: Callable[..., Cluster]) -> Cluster:
    """Two single-node groups shared by the module: every test leaves the node serving."""
    return module_cluster_factory(
        topics={"events": 2},
        groups=2,
        node_settings={"limits": {"max_request_bytes": 4096, "max_partitions_per_fetch": 16}},
    )


async def _raw(
    session: aiohttp.ClientSession, method: str, url: str, data: bytes | str, ctype: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    async with session.request(method, url, data=data, headers={"Content-Type": ctype}) as resp:
        body = await resp.read()
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {"raw": body[:200]}
        return resp.status, parsed


async def _still_serving(client: BrokerClient, url: str) -> None:
    """The node still takes a good produce and serves it back whole."""
    r = await client.produce(url, "events", 0, fmt.encode_batch([b"ok"]))
    answer = await client.fetch(
        url, [{"topic": "events", "partition": 0, "offset": r.base_offset}], max_wait_ms=0
    )
    assert records_of(answer.partitions[0].data, r.base_offset) == [(r.base_offset, b"ok")]


MALFORMED = [
    ("/v1/fetch", "{not json", "not valid JSON"),
    ("/v1/fetch", "[1, 2]", "JSON object"),
    ("/v1/fetch", "[" * 4000, "not valid JSON"),
    ("/v1/fetch", json.dumps({"partitions": "events"}), "must be a list"),
    ("/v1/fetch", json.dumps({"partitions": [{"topic": "events", "partition": 0, "offset": -1}]}), "offset"),
    (
        "/v1/fetch",
        json.dumps({"partitions": [{"topic": "events", "partition": 0, "offset": "7"}]}),
        "must be an integer",
    ),
    (
        "/v1/fetch",
        json.dumps({"partitions": [{"topic": "events", "partition": 0, "offset": True}]}),
        "must be an integer",
    ),
    ("/v1/fetch", json.dumps({"max_wait_ms": -5, "partitions": []}), "max_wait_ms"),
    (
        "/v1/fetch",
        json.dumps({"partitions": [{"topic": "events", "partition": 0, "offset": 0}] * 17}),
        "more than 16",
    ),
    ("/v1/fetch", json.dumps({"partitions": [{"topic": 3, "partition": 0, "offset": 0}]}), "topic"),
    (
        "/v1/fetch",
        json.dumps({"partitions": [{"topic": "events", "partition": 0, "offset": 2**64}]}),
        "offset",
    ),
    (
        "/v1/offsets",
        json.dumps({"partitions": [{"topic": "events", "partition": 0, "spec": "soon"}]}),
        "spec",
    ),
    (
        "/v1/offsets",
        json.dumps({"partitions": [{"topic": "events", "partition": 0, "spec": "timestamp"}]}),
        "timestamp",
    ),
]


async def test_malformed_json_requests_get_400_with_reason(
    node: Cluster, client: BrokerClient, http: aiohttp.ClientSession
) -> None:
    """Garbage JSON, wrong types, negative or huge offsets, too many partitions: 400 + reason."""
    url = node.url(node.master(0))
    for path, body, needle in MALFORMED:
        status, answer = await _raw(http, "POST", url + path, body)
        assert status == 400, (path, body[:80], answer)
        assert answer["error"] == "bad_request"
        assert needle in answer["reason"], (path, body[:80], answer)
    await _still_serving(client, url)


async def test_group_requests_validate_their_bodies(
    node: Cluster, client: BrokerClient, http: aiohttp.ClientSession
) -> None:
    """Heartbeat/commit with missing ids, wrong types, negative offsets or unknown partitions: 4xx."""
    url = node.url(node.master(0))
    # each group's coordinator: this node, or the one a 421 names
    coordinators: dict[str, str] = {}
    for group in ("g1", "g2", "g3"):
        try:
            await client.heartbeat(url, group, "c1", ["events"], 5000)
            coordinators[group] = url
        except BrokerError as exc:
            assert exc.status == 421 and exc.code == "not_coordinator"
            coordinators[group] = node.url(exc.body["coordinator"])
    curl = coordinators["g1"]
    cases = [
        ("heartbeat", {"topics": ["events"]}, "client_id"),
        ("heartbeat", {"client_id": 5}, "client_id"),
        ("heartbeat", {"client_id": "c", "topics": "events"}, "topics"),
        ("heartbeat", {"client_id": "c", "session_timeout_ms": 1}, "session_timeout_ms"),
        (
            "commit",
            {"client_id": "c", "offsets": [{"topic": "events", "partition": 0, "offset": -3}]},
            "offset",
        ),
        (
            "commit",
            {"client_id": "c", "offsets": [{"topic": "events", "partition": 0, "offset": 1}], "force": "yes"},
            "force",
        ),
        ("leave", {}, "client_id"),
    ]
    for endpoint, body, needle in cases:
        status, answer = await _raw(http, "POST", f"{curl}/v1/groups/g1/{endpoint}", json.dumps(body))
        assert status == 400, (endpoint, body, answer)
        assert needle in answer["reason"], (endpoint, answer)
    status, answer = await _raw(
        http,
        "POST",
        f"{curl}/v1/groups/g1/commit",
        json.dumps({"client_id": "c", "offsets": [{"topic": "nope", "partition": 0, "offset": 1}]}),
    )
    assert status == 404 and answer["error"] == "unknown_partition", answer
    # nothing above was stored
    assert await client.committed(curl, "g1") == []


async def test_unknown_topic_or_partition(
    node: Cluster, client: BrokerClient, http: aiohttp.ClientSession
) -> None:
    """Produce to an unknown partition is 404; fetch answers NOT_SERVED for it and serves the rest."""
    url = node.url(node.master(0))
    for topic, partition in (("nope", 0), ("events", 2), ("events", 99)):
        with pytest.raises(BrokerError) as err:
            await client.produce(url, topic, partition, fmt.encode_batch([b"x"]))
        assert err.value.status == 404 and err.value.code == "unknown_partition"
    status, answer = await _raw(
        http,
        "POST",
        f"{url}/v1/produce/events/zero",
        fmt.encode_batch([b"x"]),
        "application/x-mqd-batches",
    )
    assert status == 400 and "partition" in answer["reason"]
    r = await client.produce(url, "events", 0, fmt.encode_batch([b"a"]))
    answer2 = await client.fetch(
        url,
        [
            {"topic": "nope", "partition": 0, "offset": 0},
            {"topic": "events", "partition": 1, "offset": 0},  # lives on broker-b
            {"topic": "events", "partition": 0, "offset": r.base_offset},
        ],
        max_wait_ms=0,
    )
    nope, other, good = answer2.partitions
    assert nope.status == "NOT_SERVED" and nope.error == "unknown_partition"
    assert other.status == "NOT_SERVED" and "broker-b" in (other.error or "")
    assert good.status == "FOUND" and records_of(good.data, r.base_offset) == [(r.base_offset, b"a")]
    offsets = await client.list_offsets(url, [{"topic": "nope", "partition": 0, "spec": "latest"}])
    assert offsets[0]["error"] == "unknown_partition" and offsets[0]["offset"] is None


async def test_corrupt_batches_are_rejected_and_the_log_is_untouched(
    node: Cluster, client: BrokerClient
) -> None:
    """Bad magic, CRC, truncation, bad internal offsets, empty body: 400 and nothing is written."""
    url = node.url(node.master(0))
    good = fmt.encode_batch([b"one", b"two"])
    flipped = bytearray(good)
    flipped[-9] ^= 0xFF  # inside the data: CRC mismatch
    bad_magic = b"XXXX" + good[4:]
    truncated = good[:-8]
    # a batch whose value offsets go backwards but whose CRC is right
    forged = bytearray(good)
    info = fmt.read_header(good)
    n = info.count
    v_off = fmt.HEADER_SIZE + ((8 * n + 7) & ~7) + ((4 * (n + 1) + 7) & ~7)
    struct.pack_into("<i", forged, v_off + 4, 10_000)
    struct.pack_into("<I", forged, 16, zlib.crc32(forged[fmt.CRC_FROM :]))
    spec = [{"topic": "events", "partition": 0, "spec": "latest"}]
    before = (await client.list_offsets(url, spec))[0]["offset"]
    for body in (bytes(flipped), bad_magic, truncated, bytes(forged), b"", good + b"\0" * 8):
        with pytest.raises(BrokerError) as err:
            await client.produce(url, "events", 0, body)
        assert err.value.status == 400 and err.value.code == "malformed_batch", err.value
        assert err.value.body["reason"]
    assert (await client.list_offsets(url, spec))[0]["offset"] == before  # nothing written
    await _still_serving(client, url)


async def test_oversized_body_gets_413(
    node: Cluster, client: BrokerClient, http: aiohttp.ClientSession
) -> None:
    """A body above limits.max_request_bytes is refused with 413 too_large, for produce and fetch."""
    url = node.url(node.master(0))
    big = fmt.encode_batch([b"x" * 8000])
    with pytest.raises(BrokerError) as err:
        await client.produce(url, "events", 0, big)
    assert err.value.status == 413 and err.value.code == "too_large"
    body = json.dumps({"client_id": "x" * 5000, "partitions": []})
    status, answer = await _raw(http, "POST", url + "/v1/fetch", body)
    assert status == 413 and answer["error"] == "too_large"
    await _still_serving(client, url)


async def test_produce_routing_errors(
    node: Cluster, client: BrokerClient, http: aiohttp.ClientSession
) -> None:
    """Produce to a node that is not the partition's master: 421 naming the master; bad acks: 400."""
    other = node.url(node.master(1))
    with pytest.raises(BrokerError) as err:
        await client.produce(other, "events", 0, fmt.encode_batch([b"x"]))
    assert err.value.status == 421 and err.value.code == "not_master"
    assert err.value.body["master"] == node.master(0)
    assert err.value.body["master_url"] == node.url(node.master(0))
    with pytest.raises(BrokerError) as err:
        await client.produce(node.url(node.master(0)), "events", 0, fmt.encode_batch([b"x"]), acks="some")
    assert err.value.status == 400 and "acks" in err.value.body["reason"]
    status, answer = await _raw(http, "GET", node.bootstrap + "/v1/nothing", "")
    assert status == 404 and answer["error"] == "not_found"


async def test_bearer_token_is_required_when_configured(cluster_factory: Any) -> None:
    """With auth_token set every endpoint but /v1/health answers 401 without the right token."""
    cluster = cluster_factory(topics={"events": 1}, node_settings={"auth_token": TOKEN})
    url = cluster.bootstrap
    async with (
        BrokerClient() as anon,
        BrokerClient(auth_token="wrong") as wrong,
        BrokerClient(auth_token=TOKEN) as good,
    ):
        assert (await anon.health(url))["status"] == "ok"
        for c in (anon, wrong):
            with pytest.raises(BrokerError) as err:
                await c.metadata(url)
            assert err.value.status == 401 and err.value.code == "unauthorized"
            with pytest.raises(BrokerError) as err:
                await c.produce(url, "events", 0, fmt.encode_batch([b"x"]))
            assert err.value.status == 401
        r = await good.produce(url, "events", 0, fmt.encode_batch([b"x"]))
        assert r.count == 1
    assert TOKEN not in cluster.log(cluster.master(0))
