"""The admin endpoint over real HTTP (port 0): the admin token on every route but the probes, and the
status views the endpoint and the CLI share."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from mqd import metrics
from mqd.config import AdminConfig
from mqd.operator.admin import (
    OPEN_ROUTES,
    AdminError,
    AdminServer,
    PartitionSpec,
    parse_partition_spec,
)
from mqd.operator.admin_listener import AdminListenError
from mqd.operator.status_page import render_page
from mqd.operator.views import partition_rows, render_summary

TOKEN = "tok"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

STATUS: dict[str, Any] = {
    "state": "running",
    "health": {"status": "ok", "reasons": []},
    "consumer": {
        "member_id": "host-1",
        "group": "g",
        "generation": 3,
        "assignment": {
            "events/0": {
                "topic": "events",
                "partition": 0,
                "position": 100,
                "committed": 90,
                "log_end": 150,
                "lag": 50,
                "pull_node": "broker-a-0",
                "paused": False,
                "flow_control": None,
                "parked": False,
                "last_error": None,
            },
            "events/1": {
                "topic": "events",
                "partition": 1,
                "position": 10,
                "committed": 10,
                "log_end": 10,
                "lag": 0,
                "pull_node": "broker-b-1",
                "paused": True,
                "flow_control": "records",
                "parked": False,
                "last_error": "<b>boom</b>",
            },
        },
    },
    "stats": {"records_published": 1234, "files_published": 5},
}


class Target:
    """A fixed status source that records pause/resume calls (the runner plays this part in mqd)."""

    def __init__(self) -> None:
        self.live = True
        self.ready = True
        self.secret_reasons: list[str] = []
        self.calls: list[tuple[str, list[PartitionSpec]]] = []

    def status(self) -> dict[str, Any]:
        return STATUS

    def liveness(self) -> tuple[bool, str]:
        return self.live, "loop ok" if self.live else "working loop silent for 99s"

    def readiness(self) -> tuple[bool, list[str]]:
        return self.ready, [] if self.ready else ["no partitions assigned", *self.secret_reasons]

    def pause(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        self.calls.append(("pause", list(specs)))
        if any(p == 99 for _, p in specs):
            raise KeyError("partition events/99 is not assigned to this consumer")
        return [(t, 0 if p is None else p) for t, p in specs]

    def resume(self, specs: Sequence[PartitionSpec]) -> list[tuple[str, int]]:
        self.calls.append(("resume", list(specs)))
        return [(t, 0 if p is None else p) for t, p in specs]


@pytest.fixture
async def served() -> AsyncIterator[tuple[AdminServer, Target, aiohttp.ClientSession]]:
    target = Target()
    server = AdminServer(AdminConfig(port=0, auth_token=TOKEN), target)
    await server.start()
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
    try:
        yield server, target, session
    finally:
        await session.close()
        await server.stop()
        await server.stop()  # idempotent


async def test_health_and_readiness_follow_the_target(served: Any) -> None:
    """/healthz is liveness (503 when the loop is stuck), /readyz readiness with reasons."""
    server, target, s = served
    async with s.get(f"{server.url}/healthz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"
    async with s.get(f"{server.url}/readyz") as r:
        assert r.status == 200
    target.live, target.ready = False, False
    async with s.get(f"{server.url}/healthz") as r:
        assert r.status == 503 and "silent" in (await r.json())["reason"]
    async with s.get(f"{server.url}/readyz", headers=AUTH) as r:
        assert r.status == 503 and (await r.json())["reasons"] == ["no partitions assigned"]


async def test_metrics_parse_with_prometheus_parser(served: Any) -> None:
    """/metrics is valid Prometheus text with the daemon's metric families."""
    server, _, s = served
    metrics.records_fetched.labels("events", "0").inc(7)
    metrics.fetch_latency.labels("broker-a-0").observe(0.01)
    async with s.get(f"{server.url}/metrics", headers=AUTH) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "mqd_fetched_records",
        "mqd_fetched_bytes",
        "mqd_fetch_latency_seconds",
        "mqd_fetch_requests",
        "mqd_flow_control_events",
        "mqd_offset_resets",
        "mqd_consumer_lag",
        "mqd_published_files",
        "mqd_commit_latency_seconds",
        "mqd_rebalances",
    ):
        assert name in families, name
    fetched = [
        x
        for x in families["mqd_fetched_records"].samples
        if x.name == "mqd_fetched_records_total" and x.labels == {"topic": "events", "partition": "0"}
    ]
    assert fetched and fetched[0].value >= 7


async def test_metrics_of_a_given_registry() -> None:
    """The server serves the registry it was given (tests and embedders use their own)."""
    reg = CollectorRegistry()
    Counter("only_here", "x", registry=reg).inc()
    server = AdminServer(AdminConfig(port=0), Target(), registry=reg)
    await server.start()
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{server.url}/metrics") as r:
            names = {f.name for f in text_string_to_metric_families(await r.text())}
        assert "only_here" in names
        assert not any(n.startswith("mqd_") for n in names)
    finally:
        await server.stop()


async def test_status_json_and_html_page(served: Any) -> None:
    """/status is the target's JSON; / renders it as HTML with user text escaped."""
    server, _, s = served
    async with s.get(f"{server.url}/status", headers=AUTH) as r:
        assert await r.json() == STATUS
    async with s.get(f"{server.url}/", headers=AUTH) as r:
        page = await r.text()
    assert r.headers["Content-Type"].startswith("text/html")
    assert "broker-b-1" in page and "&lt;b&gt;boom&lt;/b&gt;" in page and "<b>boom" not in page


async def test_the_first_page_load_shows_a_records_per_second_figure() -> None:
    """The page's records/s used to be measured between page loads, so the first load had one
    sample and showed `-`; the endpoint samples the published total from its start, so the first
    load already has a figure, and records published since show in it."""
    server = AdminServer(AdminConfig(port=0, auth_token=TOKEN), Target())
    await server.start()
    try:
        metrics.records_published.labels("events").inc(500)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
            s.get(f"{server.url}/", headers=AUTH) as r,
        ):
            page = await r.text()
    finally:
        await server.stop()
    shown = re.search(r'<dd id="records-s">([^<]*)</dd>', page)
    assert shown is not None and shown.group(1) != "-", page
    assert float(shown.group(1).replace(",", "")) > 0


async def test_pause_resume_need_the_token_and_valid_partitions(served: Any) -> None:
    """POST /pause and /resume: 401 without the token, 400 on bad input, 404 for an unowned partition."""
    server, target, s = served
    auth = AUTH
    async with s.post(f"{server.url}/pause", json={"partitions": ["events:1"]}) as r:
        assert r.status == 401
    async with s.post(f"{server.url}/pause", json={"partitions": ["events:1", "clicks"]}, headers=auth) as r:
        assert r.status == 200
        assert (await r.json())["paused"] == [
            {"topic": "events", "partition": 1},
            {"topic": "clicks", "partition": 0},
        ]
    assert target.calls[-1] == ("pause", [("events", 1), ("clicks", None)])
    async with s.post(f"{server.url}/resume?partition=events:1", headers=auth) as r:
        assert r.status == 200 and (await r.json())["resumed"] == [{"topic": "events", "partition": 1}]
    bads: list[dict[str, Any]] = [
        {"partitions": ["events:x"]},
        {"partitions": []},
        {"partitions": "events"},
        {"nope": 1},
    ]
    for bad in bads:
        async with s.post(f"{server.url}/pause", json=bad, headers=auth) as r:
            assert r.status == 400, bad
            assert (await r.json())["error"] == "bad_request"
    json_type = {**auth, "Content-Type": "application/json"}
    async with s.post(f"{server.url}/pause", data=b"{not json", headers=json_type) as r:
        assert r.status == 400
    async with s.post(f"{server.url}/pause", json={"partitions": ["events:99"]}, headers=auth) as r:
        assert r.status == 404 and "not assigned" in (await r.json())["reason"]


async def test_port_in_use_is_a_clear_retriable_error(served: Any) -> None:
    """A second server on the same port fails with the address in the message."""
    server, _, _ = served
    port = int(server.url.rsplit(":", 1)[1])
    other = AdminServer(AdminConfig(port=port), Target())
    with pytest.raises(AdminListenError) as info:
        await other.start()
    assert f"127.0.0.1:{port}" in str(info.value) and info.value.retriable


# -- the admin token -------------------------------------------------------------------------------

# every route but the probes, with a request that succeeds once authorised
GUARDED: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/", None),
    ("HEAD", "/", None),
    ("GET", "/status", None),
    ("GET", "/metrics", None),
    ("POST", "/pause", {"partitions": ["events:1"]}),
    ("POST", "/resume", {"partitions": ["events:1"]}),
]
SECRETS = ["landing: [Errno 28] No space left on device: '/srv/landing/events'", "http://10.1.2.3:9090 down"]


def _basic(password: str, user: str = "anyone") -> dict[str, str]:
    """What a browser sends once the user typed a name and the password (RFC 7617)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


WRONG_CREDENTIALS: list[dict[str, str]] = [
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": "Bearer "},
    {"Authorization": TOKEN},
    {"Authorization": f"Token {TOKEN}"},
    _basic("wrong"),
    _basic(TOKEN + "x"),
    {"Authorization": "Basic !!not-base64!!"},
    {"X-Admin-Token": TOKEN},
]


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[f"{m} {p}" for m, p, _ in GUARDED])
async def test_a_guarded_route_needs_the_admin_token(
    served: Any, method: str, path: str, body: dict[str, Any] | None
) -> None:
    """With admin.auth_token set, each route but the probes answers 401 with a challenge (Basic for
    reads so a browser prompts, Bearer for pause/resume) to a missing or wrong token, in either
    scheme, and works with the right bearer token; Basic opens reads only."""
    server, target, s = served
    url = f"{server.url}{path}"
    read = method in ("GET", "HEAD")
    async with s.request(method, url, json=body) as r:
        assert r.status == 401
        assert r.headers["WWW-Authenticate"] == ('Basic realm="mqd"' if read else 'Bearer realm="mqd"')
        if method != "HEAD":
            assert (await r.json())["error"] == "unauthorized"
    for wrong in WRONG_CREDENTIALS:
        async with s.request(method, url, json=body, headers=wrong) as r:
            assert r.status == 401, wrong
    assert target.calls == []  # nothing reached the daemon
    async with s.request(method, url, json=body, headers=AUTH) as r:
        assert r.status == 200
    async with s.request(method, url, json=body, headers=_basic(TOKEN)) as r:
        # a browser resends Basic credentials on a form another site posts: no pause/resume by Basic
        assert r.status == (200 if read else 401)
    assert len(target.calls) == (0 if read else 1)


async def test_a_browser_opens_the_status_page_with_the_token_as_password(served: Any) -> None:
    """GET / without credentials asks the browser for a password (Basic realm "mqd"); any user name
    with the token as password shows the page, and the same credentials open the pages it links."""
    server, _, s = served
    async with s.get(f"{server.url}/") as r:
        assert r.status == 401 and r.headers["WWW-Authenticate"] == 'Basic realm="mqd"'
        assert "broker-b-1" not in await r.text()
    for user in ("admin", "", "ops team"):
        async with s.get(f"{server.url}/", headers=_basic(TOKEN, user)) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
            assert "broker-b-1" in await r.text()
    async with s.get(f"{server.url}/status", headers=_basic(TOKEN)) as r:
        assert r.status == 200 and await r.json() == STATUS
    async with s.get(f"{server.url}/metrics", headers=_basic(TOKEN)) as r:
        assert r.status == 200


async def test_the_probes_stay_open_and_show_details_only_with_the_token(served: Any) -> None:
    """/healthz and /readyz answer without a token (systemd and k8s probes send none) with their
    status code, but /readyz keeps its reasons (paths, broker URLs, error text) for token holders."""
    server, target, s = served
    assert OPEN_ROUTES == {"/healthz", "/readyz"}
    target.secret_reasons = SECRETS
    async with s.get(f"{server.url}/healthz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"
    async with s.get(f"{server.url}/readyz") as r:
        assert r.status == 200
    target.live, target.ready = False, False
    for headers in ({}, {"Authorization": "Bearer wrong"}, _basic("wrong")):
        async with s.get(f"{server.url}/healthz", headers=headers) as r:
            assert r.status == 503 and (await r.json())["status"] == "stuck"
        async with s.get(f"{server.url}/readyz", headers=headers) as r:
            text = await r.text()
            assert r.status == 503 and (await r.json()) == {"ready": False, "reasons": []}
        assert "/srv" not in text and "10.1.2.3" not in text and "Errno" not in text
    for headers in (AUTH, _basic(TOKEN)):
        async with s.get(f"{server.url}/readyz", headers=headers) as r:
            assert r.status == 503
            assert (await r.json())["reasons"] == ["no partitions assigned", *SECRETS]


async def test_unknown_paths_are_not_revealed_without_the_token(served: Any) -> None:
    """Without the token a path that does not exist answers 401 like one that does; with it, 404."""
    server, _, s = served
    for path in ("/nope", "/healthz/", "/status/../healthz/x", "/STATUS"):
        async with s.get(f"{server.url}{path}") as r:
            assert r.status == 401, path
        async with s.get(f"{server.url}{path}", headers=AUTH) as r:
            assert r.status == 404, path


async def test_without_a_token_every_route_is_open() -> None:
    """Control: with no admin.auth_token (the loopback-only default) nothing asks for one and the
    probes keep their reasons."""
    target = Target()
    target.ready, target.secret_reasons = False, SECRETS
    server = AdminServer(AdminConfig(port=0), target)
    await server.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            for method, path, body in GUARDED:
                async with s.request(method, f"{server.url}{path}", json=body) as r:
                    assert r.status == 200, (method, path)
            async with s.get(f"{server.url}/readyz") as r:
                assert r.status == 503 and (await r.json())["reasons"] == ["no partitions assigned", *SECRETS]
    finally:
        await server.stop()


# -- pure views ------------------------------------------------------------------------------------


def test_partition_spec_parsing() -> None:
    """TOPIC and TOPIC:PARTITION parse; anything else is refused with the reason."""
    assert parse_partition_spec("events") == ("events", None)
    assert parse_partition_spec(" events:12 ") == ("events", 12)
    for bad in ("", ":1", "events:", "events:-1", "events:a", "ev ents", "a/b:1"):
        with pytest.raises(AdminError):
            parse_partition_spec(bad)


@given(
    st.from_regex(r"[A-Za-z0-9._-]{1,30}", fullmatch=True).filter(lambda t: t not in (".", "..")),
    st.integers(0, 10**6),
)
def test_partition_spec_round_trip(topic: str, partition: int) -> None:
    """Every valid topic name and partition number survives TOPIC:PARTITION."""
    assert parse_partition_spec(f"{topic}:{partition}") == (topic, partition)


def test_partition_rows_read_the_consumer_assignment() -> None:
    """Rows come sorted with position, lag, node and what holds a partition back."""
    rows = partition_rows(STATUS)
    assert [(r.topic, r.partition, r.position, r.lag, r.node, r.state) for r in rows] == [
        ("events", 0, 100, 50, "broker-a-0", ""),
        ("events", 1, 10, 0, "broker-b-1", "paused"),
    ]
    assert partition_rows({}) == []
    assert partition_rows({"consumer": {"assignment": "junk"}}) == []


def test_summary_mentions_health_reasons_and_errors() -> None:
    """The `mqd status` text carries health, reasons, totals and partition errors."""
    text = render_summary({**STATUS, "health": {"status": "degraded", "reasons": ["broker-a-0 down"]}})
    assert text.startswith("mqd is running: degraded")
    assert "! broker-a-0 down" in text
    assert "2 partitions assigned, 1 paused, total lag 50" in text
    assert "events:1: <b>boom</b>" in text
    assert render_page({})  # an empty status still renders
