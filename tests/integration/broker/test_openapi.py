"""The broker's OpenAPI description (mqd/broker/openapi.yaml, served at GET /v1/openapi.yaml) is true
of a real broker, and cannot drift from the code.

* schemathesis loads the packaged spec and runs stateless property-based checks (its examples,
  coverage and fuzzing phases, valid and invalid data) against a real master node for every
  operation: no 5xx, only documented status codes and content types, and every JSON answer
  (2xx and error bodies alike) matches its response schema. Binary fetch answers
  (``application/x-mqd-fetch``) are decoded and their JSON head is validated against the spec's
  ``FetchAnswerHead`` schema.
* The spec served by a node is byte-identical to the packaged file, and the aiohttp routes of a
  node and the spec's operations are the same set.
* Hand-built cases reach the 200 answers random data cannot: a produce of a valid record batch and
  a fetch that returns it, a replica fetch signed by the real slave, stats of a slave.
* After all that, the log on master and slave holds exactly what the accepted produces wrote.

The cluster: two groups (a master and a slave each), so a produce to the other group's partition
answers 421 ``not_master`` and half the consumer groups answer 421 ``not_coordinator``.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from support import REPO_ROOT
from support.harness import Cluster, fetch_all, records_of

import mqd.broker
from mqd.broker.server import BrokerNode
from mqd.config import load_broker_config
from mqd.waiting import wait_until_sync
from mqd.wire import format as fmt
from mqd.wire.protocol import FETCH_CONTENT_TYPE, decode_fetch_answer

SPEC_FILE = Path(mqd.broker.__file__).with_name("openapi.yaml")
TOPIC = "events"
PARTITIONS = 4  # even partitions live on broker-a, odd ones on broker-b
# what accepted produces wrote: partition -> offset -> value
_produced: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
# What aiohttp's request parser refuses before any route runs, with its own text/plain 400: framing
# that contradicts itself (a generated Transfer-Encoding beside Content-Length), header names that are
# not RFC 9110 tokens ("Rs;"), control characters in values. That is HTTP's layer, not the API's.
FRAMING_HEADERS = frozenset(
    {"transfer-encoding", "content-length", "connection", "upgrade", "expect", "te", "trailer"}
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _parsable(headers: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in headers.items()
        if k.lower() not in FRAMING_HEADERS
        and _TOKEN.fullmatch(k)
        and not (isinstance(v, str) and _CONTROL.search(v))
    }


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
_SETTINGS = settings(
    max_examples=30,
    deadline=None,
    # real HTTP round trips to a subprocess: slow data generation is latency, not a problem
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
    ],
)


@pytest.fixture(scope="module")
def node(module_cluster_factory: Any) -> Cluster:
    cluster: Cluster = module_cluster_factory(
        topics={TOPIC: PARTITIONS},
        groups=2,
        slaves=1,
        # long polls are capped so generated max_wait_ms values cannot stall the run
        node_settings={
            "limits": {"max_wait_ms": 20, "max_request_bytes": 64 * 1024, "max_partitions_per_fetch": 64}
        },
    )
    return cluster


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SPEC_FILE.read_bytes())
    return loaded


# loaded from the packaged file at import (test_served_spec_is_the_packaged_file proves a node serves
# exactly this file); requests go to the node through base_url. Not schemathesis.pytest.from_fixture:
# its lazy loader sets ``request.node._nodeid``, which pytest 9.2 no longer has.
api_schema = schemathesis.openapi.from_path(SPEC_FILE)
# produce bodies are record batches: sent as the raw bytes, like application/octet-stream
schemathesis.serializer.alias("application/x-mqd-batches", "application/octet-stream")


def _fetch_head_validator(spec: dict[str, Any]) -> Any:
    return jsonschema_rs.validator_for(
        {"$ref": "#/components/schemas/FetchAnswerHead", "components": spec["components"]}
    )


def _check_binary_answer(spec: dict[str, Any], status: int, content_type: str, body: bytes) -> None:
    if status == 200 and content_type.startswith(FETCH_CONTENT_TYPE):
        head = json.loads(body[8 : 8 + int.from_bytes(body[4:8], "little")])
        _fetch_head_validator(spec).validate(head)
        decode_fetch_answer(body)  # slices in range, statuses known


@api_schema.parametrize()
@_SETTINGS
def test_every_operation_conforms_to_the_spec(case: Any, node: Cluster, spec: dict[str, Any]) -> None:
    """Schema-driven requests (valid and invalid) to every operation of a real master: never a 5xx,
    only documented status codes and content types, JSON answers match their schemas, and fetch
    answers' JSON heads match ``FetchAnswerHead``. Random bytes are never a valid record batch, so
    produce bodies generated as ``application/x-mqd-batches`` are wrapped into one (their bytes
    become the record's value) to reach the 200 answer too, while ``application/octet-stream`` ones
    go as generated (400 ``malformed_batch``); what was accepted is checked at the end of the
    module."""
    value = None
    raw = getattr(case.body, "data", case.body)  # generated binary bodies come wrapped (Binary.data)
    if (
        case.operation.path == "/v1/produce/{topic}/{partition}"
        and isinstance(raw, bytes)
        and case.media_type == "application/x-mqd-batches"
    ):
        value = raw
        case.body = fmt.encode_batch([value])
    if case.headers:
        case.headers = _parsable(case.headers)
    response = case.call_and_validate(base_url=node.url(node.master()), checks=CHECKS, timeout=15)
    content_type = (response.headers.get("content-type") or [""])[0]
    _check_binary_answer(spec, response.status_code, content_type, response.content)
    if response.status_code == 200 and case.operation.path.startswith("/v1/produce/"):
        assert value is not None, "random bytes were accepted as a record batch"
        answer = response.json()
        _produced[answer["partition"]][answer["base_offset"]] = value


# -- the spec cannot drift from the code -----------------------------------------------------------


def test_served_spec_is_the_packaged_file(node: Cluster) -> None:
    """GET /v1/openapi.yaml answers the packaged file byte for byte, as application/yaml, and
    docs/openapi.yaml is that same file."""
    with urllib.request.urlopen(node.url(node.master()) + "/v1/openapi.yaml", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/yaml")
        served = resp.read()
    assert served == SPEC_FILE.read_bytes()
    docs = REPO_ROOT / "docs" / "openapi.yaml"
    assert docs.read_bytes() == served


def test_every_route_is_in_the_spec_and_back(node: Cluster, spec: dict[str, Any], tmp_path: Path) -> None:
    """The routes of a node's aiohttp app and the spec's operations are the same set (HEAD, which
    aiohttp adds to every GET, aside), and each operationId is the route's name (the key in
    /v1/stats ``requests``)."""
    node_id = node.master()
    config, cluster = load_broker_config(node.nodes[node_id].config_path)
    # built, never started (nothing listens or opens files), on a data dir of its own all the same
    broker = BrokerNode(config.model_copy(update={"data_dir": tmp_path}), cluster)
    routes = {
        (r.resource.canonical, r.method.lower()): r.name
        for r in broker._app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    documented = {
        (path, method): op.get("operationId")
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in ("get", "post", "put", "delete", "patch")
    }
    assert set(routes) == set(documented), (
        f"routes not in the spec: {sorted(set(routes) - set(documented))}; "
        f"spec operations with no route: {sorted(set(documented) - set(routes))}"
    )
    assert routes == documented


# -- hand-built cases for the 200 answers random data cannot reach ---------------------------------


def test_produce_and_fetch_answers_conform(spec: dict[str, Any], node: Cluster) -> None:
    """A valid batch produced to broker-a's partition answers a ProduceResult; fetching it back
    answers a binary fetch whose head matches FetchAnswerHead and holds the records."""
    produce = api_schema["/v1/produce/{topic}/{partition}"]["POST"]
    values = [b"one", b"two"]
    case = produce.Case(
        path_parameters={"topic": TOPIC, "partition": 0},
        query={"acks": "all"},
        body=fmt.encode_batch(values),
        media_type="application/x-mqd-batches",
    )
    response = case.call_and_validate(base_url=node.url(node.master()), checks=CHECKS, timeout=15)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["count"] == 2
    _produced[0].update({answer["base_offset"] + i: v for i, v in enumerate(values)})

    fetch = api_schema["/v1/fetch"]["POST"]
    case = fetch.Case(
        body={
            "max_wait_ms": 0,
            "partitions": [
                {"topic": TOPIC, "partition": 0, "offset": answer["base_offset"]},
                {"topic": TOPIC, "partition": 1, "offset": 0},  # broker-b's: NOT_SERVED with an error
                {"topic": "nope", "partition": 0, "offset": 0},
            ],
        },
        media_type="application/json",
    )
    response = case.call_and_validate(base_url=node.url(node.master()), checks=CHECKS, timeout=15)
    assert response.status_code == 200
    _check_binary_answer(spec, 200, FETCH_CONTENT_TYPE, response.content)
    parts = decode_fetch_answer(response.content).partitions
    assert records_of(parts[0].data, answer["base_offset"])[:2] == [
        (answer["base_offset"], b"one"),
        (answer["base_offset"] + 1, b"two"),
    ]
    assert [p.status.value for p in parts[1:]] == ["NOT_SERVED", "NOT_SERVED"]
    assert parts[1].error is not None and parts[1].error.startswith("not_served")
    assert parts[2].error == "unknown_partition"


def test_redirect_answers_conform(node: Cluster) -> None:
    """A produce to the other group's partition is a documented 421 not_master naming the master;
    a group request to a node that does not coordinate it is a documented 421 not_coordinator."""
    produce = api_schema["/v1/produce/{topic}/{partition}"]["POST"]
    case = produce.Case(
        path_parameters={"topic": TOPIC, "partition": 1},
        body=fmt.encode_batch([b"x"]),
        media_type="application/x-mqd-batches",
    )
    response = case.call_and_validate(base_url=node.url(node.master()), checks=CHECKS, timeout=15)
    assert response.status_code == 421
    assert response.json()["master"] == node.master(1)

    heartbeat = api_schema["/v1/groups/{group}/heartbeat"]["POST"]
    seen = set()
    for group in ("g0", "g1", "g2", "g3", "g4", "g5"):
        case = heartbeat.Case(
            path_parameters={"group": group}, body={"client_id": "c"}, media_type="application/json"
        )
        response = case.call_and_validate(base_url=node.url(node.master()), checks=CHECKS, timeout=15)
        seen.add(response.status_code)
        if response.status_code == 421:
            assert response.json()["coordinator"] == node.master(1)
    assert seen == {200, 421}, seen


def test_produce_partition_must_be_plain_digits(node: Cluster) -> None:
    """The ``partition`` path parameter is an integer: spellings Python's int() also takes
    ("1_0", " 0", "+0", an Arabic-Indic digit one) are a 400 and write nothing, where they used to
    land in partition 10, 0, 0 and 1."""
    url = node.url(node.master())
    before = [len(fetch_all(url, TOPIC, p)) for p in (0, 2)]
    for raw in ("1_0", "%200", "+0", "%D9%A1", "0x0", "%EF%BC%90"):
        req = urllib.request.Request(
            f"{url}/v1/produce/{TOPIC}/{raw}",
            data=fmt.encode_batch([b"x"]),
            headers={"Content-Type": "application/x-mqd-batches"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        body = json.loads(err.value.read())
        assert err.value.code == 400 and body["error"] == "bad_request", (raw, body)
    assert [len(fetch_all(url, TOPIC, p)) for p in (0, 2)] == before


def test_bearer_auth_answers_conform(cluster_factory: Any) -> None:
    """On a node with an ``auth_token`` (the optional bearerAuth scheme): health needs no token,
    every other operation without the token is a documented 401 ``unauthorized``, and with it the
    answers conform."""
    token = "openapi-token"
    cluster = cluster_factory(topics={TOPIC: 1}, node_settings={"auth_token": token})
    url = cluster.url(cluster.master())
    health = api_schema["/v1/health"]["GET"].Case()
    assert health.call_and_validate(base_url=url, checks=CHECKS, timeout=15).status_code == 200
    for path in ("/v1/metadata", "/v1/stats", "/v1/openapi.yaml"):
        case = api_schema[path]["GET"].Case()
        response = case.call_and_validate(base_url=url, checks=CHECKS, timeout=15)
        assert response.status_code == 401 and response.json()["error"] == "unauthorized", path
        response = case.call_and_validate(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS, timeout=15
        )
        assert response.status_code == 200, path
    offsets = api_schema["/v1/offsets"]["POST"].Case(
        body={"partitions": [{"topic": TOPIC, "partition": 0, "spec": "latest"}]},
        media_type="application/json",
    )
    response = offsets.call_and_validate(
        base_url=url, headers={"Authorization": "Bearer wrong"}, checks=CHECKS, timeout=15
    )
    assert response.status_code == 401
    # replica routes never take the client token: a lone master has no replica peers
    replica = api_schema["/v1/replica/offsets"]["GET"].Case()
    response = replica.call_and_validate(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS, timeout=15
    )
    assert response.status_code == 403 and response.json()["error"] == "replica_forbidden"


def test_slave_answers_conform(spec: dict[str, Any], node: Cluster) -> None:
    """A slave's stats (with ``replication``) match the Stats schema, and a replica fetch by the
    real slave answers a binary fetch whose head matches FetchAnswerHead."""
    slave = node.slaves(0)[0]
    stats = api_schema["/v1/stats"]["GET"].Case()
    response = stats.call_and_validate(base_url=node.url(slave), checks=CHECKS, timeout=15)
    assert "replication" in response.json()

    # a replica fetch signed by the real slave: a binary answer whose head matches FetchAnswerHead
    master = node.master()
    body = json.dumps(
        {"node": slave, "max_wait_ms": 0, "partitions": [{"topic": TOPIC, "partition": 0, "offset": 0}]}
    ).encode()
    status, ctype, answer = _signed_replica_fetch(node, slave, node.url(master), body)
    assert status == 200
    _check_binary_answer(spec, status, ctype, answer)
    # the same signer to the slave itself: not one of its replica peers, a documented 403
    status, ctype, answer = _signed_replica_fetch(node, slave, node.url(slave), body)
    assert status == 403 and json.loads(answer)["error"] == "replica_forbidden"


def _signed_replica_fetch(node: Cluster, signer: str, url: str, body: bytes) -> tuple[int, str, bytes]:
    auth = node.replica_auth(signer)
    headers = auth.sign_request("POST", "/v1/replica/fetch", body, auth.new_nonce())
    req = urllib.request.Request(
        url + "/v1/replica/fetch", data=body, headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read()


# -- the hard edges of issue 13, through the spec's operations ------------------------------------

HOSTILE_TOPICS = ["..", ".", "../../etc", "a" * 250, "\x00", " ", "é", "a/b", "%2e%2e"]
HOSTILE_PARTITIONS = ["-1", "99999999999999999999", "x", "1_0", "\u0663", "0.0", ""]
HOSTILE_GROUPS = ["..", "\x00", "é", "a" * 2000, "../../etc", " "]


def test_malformed_ids_answer_documented_errors(node: Cluster) -> None:
    """Path ids that are not ids (``..``, ``../../etc``, NUL, a 250-character topic, partitions
    that are not plain decimal integers, hostile group names) answer a documented status and body:
    never a 5xx, never a 200 that writes (the log check at the end proves nothing slipped in)."""
    url = node.url(node.master())
    produce = api_schema["/v1/produce/{topic}/{partition}"]["POST"]
    for topic in HOSTILE_TOPICS:
        case = produce.Case(
            path_parameters={"topic": topic, "partition": 0},
            body=fmt.encode_batch([b"x"]),
            media_type="application/x-mqd-batches",
        )
        response = case.call_and_validate(base_url=url, checks=CHECKS, timeout=15)
        assert 400 <= response.status_code < 500, (topic, response.status_code, response.text)
    for partition in HOSTILE_PARTITIONS:
        case = produce.Case(
            path_parameters={"topic": TOPIC, "partition": partition},
            body=fmt.encode_batch([b"x"]),
            media_type="application/x-mqd-batches",
        )
        response = case.call_and_validate(base_url=url, checks=CHECKS, timeout=15)
        assert 400 <= response.status_code < 500, (partition, response.status_code, response.text)
    heartbeat = api_schema["/v1/groups/{group}/heartbeat"]["POST"]
    for group in HOSTILE_GROUPS:
        case = heartbeat.Case(
            path_parameters={"group": group}, body={"client_id": "c"}, media_type="application/json"
        )
        case.call_and_validate(base_url=url, checks=CHECKS, timeout=15)


def test_wrong_content_types_answer_documented_errors(node: Cluster) -> None:
    """A produce whose body is declared JSON, a form, text or nothing known is a documented 415
    ``bad_content_type`` and writes nothing; a fetch declared as text is the documented 415 too
    (a page could send that cross-site without a preflight: test_broker_csrf.py)."""
    url = node.url(node.master())
    produce = api_schema["/v1/produce/{topic}/{partition}"]["POST"]
    for ctype in ("application/json", "text/plain", "application/x-www-form-urlencoded", "image/png"):
        case = produce.Case(
            path_parameters={"topic": TOPIC, "partition": 0},
            body=fmt.encode_batch([b"x"]),
            media_type="application/x-mqd-batches",
        )
        response = case.call_and_validate(
            base_url=url, headers={"Content-Type": ctype}, checks=CHECKS, timeout=15
        )
        assert response.status_code == 415 and response.json()["error"] == "bad_content_type", ctype
    fetch = api_schema["/v1/fetch"]["POST"]
    case = fetch.Case(
        body={"max_wait_ms": 0, "partitions": [{"topic": TOPIC, "partition": 0, "offset": 0}]},
        media_type="application/json",
    )
    response = case.call_and_validate(
        base_url=url, headers={"Content-Type": "text/plain"}, checks=CHECKS, timeout=15
    )
    assert response.status_code == 415 and response.json()["error"] == "bad_content_type"


def test_over_long_url_is_a_plain_400(node: Cluster) -> None:
    """A 9 KiB query string on any operation is a 400 before routing (plain text, as the spec's
    conventions say), not a 5xx; the node serves the next request."""
    url = node.url(node.master())
    for path in ("/v1/metadata", "/v1/stats"):
        case = api_schema[path]["GET"].Case(query={"x": "a" * 9216})
        response = case.call_and_validate(base_url=url, checks=[not_a_server_error], timeout=15)
        assert response.status_code == 400 and "8190" in response.text, response.text[:300]
    assert api_schema["/v1/health"]["GET"].Case().call(base_url=url, timeout=15).status_code == 200


def test_a_huge_declared_content_length_is_413_at_once(node: Cluster) -> None:
    """A request declaring a 1 TB body (and sending two bytes of it) to each JSON operation and to
    produce is answered 413 ``too_large`` at once and the connection closed, instead of the node
    waiting its body timeout for bytes it would refuse anyway (before: 408 after 10 s on the JSON
    operations)."""
    host, port = node.url(node.master()).removeprefix("http://").split(":")
    paths = [
        ("/v1/fetch", "application/json"),
        ("/v1/offsets", "application/json"),
        ("/v1/groups/g/heartbeat", "application/json"),
        ("/v1/groups/g/commit", "application/json"),
        ("/v1/replica/fetch", "application/json"),
        (f"/v1/produce/{TOPIC}/0", "application/x-mqd-batches"),
    ]
    for path, ctype in paths:
        started = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=15) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {10**12}\r\n\r\n{{}}".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):  # until the node closes the connection
                answer += chunk
        took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:300])
        assert b'"too_large"' in answer, (path, answer[:300])
        assert took < 5, (path, took)  # the node's body timeout is 10 s


def test_logs_are_intact_after_the_run(node: Cluster) -> None:
    """Runs last (file order): broker-a's master and slave hold exactly the records the accepted
    produces wrote, at the offsets they were given, CRC-valid and dense from 0 (nothing generated
    slipped in, nothing accepted was lost); broker-b's partitions stay empty (every produce there
    was a 421)."""
    for p in range(PARTITIONS):
        want = sorted(_produced[p].items())
        holders = (node.master(0), node.slaves(0)[0]) if p % 2 == 0 else (node.master(1), node.slaves(1)[0])
        for node_id in holders:

            def caught_up(
                node_id: str = node_id, p: int = p, n: int = len(want)
            ) -> tuple[list[tuple[int, bytes]]] | None:
                got = fetch_all(node.url(node_id), TOPIC, p)
                return (got,) if len(got) >= n else None

            (got,) = wait_until_sync(caught_up, timeout=10, what=f"{node_id} to hold partition {p}")
            assert [o for o, _ in got] == list(range(len(got))), f"{node_id} partition {p}"
            assert got == want, f"{node_id} partition {p}"
    assert _produced[0], "no produce was accepted: the 200 path was never checked"
