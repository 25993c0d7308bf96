"""A foreign web page cannot drive a broker through a visitor's browser: the JSON operations refuse
the bodies a page can send cross-site without a CORS preflight (form, text/plain, an untyped Blob),
while every mqd client, which declares application/json, is served as before (real broker process)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from support.harness import Cluster


@pytest.fixture(scope="module")
def node(module_cluster_factory: Callable[..., Cluster]) -> Cluster:
    return module_cluster_factory(topics={"events": 1})


async def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    # skip_auto_headers: aiohttp would otherwise add a Content-Type of its own to a bytes body
    async with (
        aiohttp.ClientSession(skip_auto_headers={"Content-Type"}) as session,
        session.post(url, data=body, headers=headers) as resp,
    ):
        return resp.status, json.loads(await resp.read())


COMMIT = json.dumps(
    {"member": "victim", "offsets": [{"topic": "events", "partition": 0, "offset": 123456}]}
).encode()


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {"Origin": "https://evil.example"},  # a no-cors fetch of an untyped Blob
        {"Sec-Fetch-Site": "cross-site"},
    ],
    ids=["text", "form", "multipart", "untyped-with-origin", "untyped-cross-site"],
)
async def test_a_commit_a_page_could_send_is_refused_and_changes_nothing(
    node: Cluster, headers: dict[str, str]
) -> None:
    """Each body a cross-site page can send gets 415 bad_content_type, and the group's committed
    offset is not moved by it."""
    url = node.bootstrap
    status, body = await _post(f"{url}/v1/groups/web/commit", COMMIT, headers)
    assert (status, body["error"]) == (415, "bad_content_type"), body

    status, body = await _post(
        f"{url}/v1/groups/web/offsets", b'{"partitions": []}', {"Content-Type": "application/json"}
    )
    assert status == 200, body
    assert body["offsets"] == []


async def test_json_and_untyped_requests_of_programs_are_still_served(node: Cluster) -> None:
    """application/json (every mqd client) and a body without a type from a program (no Origin, no
    Sec-Fetch-Site: curl --data-binary with the header removed, scripts) are served."""
    url = node.bootstrap
    for headers in ({"Content-Type": "application/json; charset=utf-8"}, {}):
        status, body = await _post(
            f"{url}/v1/offsets",
            b'{"partitions": [{"topic": "events", "partition": 0, "spec": "earliest"}]}',
            headers,
        )
        assert status == 200, (headers, body)
