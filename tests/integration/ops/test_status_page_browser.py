"""The HTML status page in a real headless browser (Debian's chromium): a real broker and a real
daemon (`mqd start`, admin token set) land records, and the page the browser renders, opened with
the token as its Basic password, shows the partitions, the totals, throughput, group, generation,
uptime and version, with `-` in empty cells. Skips with the reason when chromium is not installed
(`.ci/run` installs it in CI)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from support.cli import mqd, produce, write_config
from support.harness import Cluster

from mqd import __version__
from mqd.waiting import wait_until_sync

browser = pytest.importorskip("mqd_dev.browser")
if browser.find_chromium() is None:
    pytest.skip(
        "chromium is not installed: apt-get install -y chromium (.ci/run installs it when CI=true)",
        allow_module_level=True,
    )

TOKEN = "s3cret-token"


class Cells(HTMLParser):
    """The text of each element with an id, and each table row's cells, from the rendered DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.rows: dict[str, list[str]] = {}
        self._open: list[tuple[str, str | None]] = []
        self._row: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        ident = dict(attrs).get("id")
        self._open.append((tag, ident))
        if ident is not None:
            self.by_id[ident] = ""
        if tag == "tr" and ident:
            self._row = ident
            self.rows[ident] = []
        if tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self.rows[self._row].append("".join(self._cell).strip())
            self._cell = None
        if tag == "tr":
            self._row = None
        while self._open:
            open_tag, _ = self._open.pop()
            if open_tag == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, ident in self._open:
            if ident is not None:
                self.by_id[ident] += data
        if self._cell is not None:
            self._cell.append(data)


def rendered(url: str) -> Cells:
    cells = Cells()
    cells.feed(browser.dump_dom(url))
    return cells


@pytest.fixture
def daemon(tmp_path: Path, cluster_factory: Callable[..., Cluster]) -> Iterator[tuple[Path, str]]:
    cluster = cluster_factory(topics={"events": 2})
    produce(cluster, 3000)
    cfg = write_config(tmp_path, cluster, admin={"port": 0, "auth_token": TOKEN})
    res = mqd("start", "-c", str(cfg))
    assert res.returncode == 0, res.stderr
    try:
        url = json.loads((tmp_path / "state" / "admin.json").read_text())["url"]
        yield cfg, url
    finally:
        mqd("stop", "-c", str(cfg), "--force")


def status(url: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{url}/status", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def test_the_browser_renders_partitions_totals_and_version(daemon: tuple[Path, str]) -> None:
    """Records landed; the page as chromium renders it (token as the Basic password in the URL)
    names both partitions with exact offsets and lag 0, the totals (3,000 records, files, bytes), a
    throughput, group, member, generation, uptime and version, and shows `-` where a cell is empty."""
    _, url = daemon
    wait_until_sync(
        lambda: status(url)["stats"]["records_published"] == 3000, timeout=60, what="3000 records landed"
    )
    page_url = url.replace("http://", f"http://mqd:{TOKEN}@", 1) + "/"
    page: Cells = Cells()

    def loaded() -> bool:
        nonlocal page
        page = rendered(page_url)  # again while the second partition or its landing is not shown yet
        return "p-events-1" in page.rows and page.by_id.get("records-s", "-") != "-"

    wait_until_sync(loaded, timeout=90, what="the rendered page with both partitions and a throughput")
    assert page.by_id["version"] == __version__
    assert page.by_id["records-landed"] == "3,000"
    assert int(page.by_id["files-published"]) >= 1
    assert re.fullmatch(r"[\d.]+(B|KiB|MiB)", page.by_id["bytes-landed"])
    st = status(url)
    assert page.by_id["group"] == st["consumer"]["group"]
    assert page.by_id["member"] == st["consumer"]["member_id"]
    assert page.by_id["generation"] == str(st["consumer"]["generation"])
    assert re.fullmatch(r"[\d.]+s|\d+m\d\ds", page.by_id["uptime"])
    assert page.by_id["total-lag"] == "0"
    assert "ok" in page.by_id["state"]
    for p in (0, 1):
        cells = page.rows[f"p-events-{p}"]
        # partition, state, node, position, committed, landed, log end, lag, fetch lag, time lag,
        # error
        assert cells[0] == f"events:{p}" and cells[1] == "ok" and cells[2] != "-"
        landed = st["consumer"]["assignment"][f"events/{p}"]["landed"]
        assert cells[5] == str(landed) and cells[6] == str(landed) and cells[7] == "0"
        assert cells[8] == "0" and cells[9] == "0.0s"  # all landed: no lag in records or in time
        assert cells[10] == "-"  # no error: a dash, not an empty cell
    assert sum(int(page.rows[f"p-events-{p}"][5]) for p in (0, 1)) == 3000


def test_without_the_token_the_browser_gets_no_status(daemon: tuple[Path, str]) -> None:
    """Opened without credentials the page shows none of the daemon's data (401, Basic realm)."""
    _, url = daemon
    dom = browser.dump_dom(url + "/")
    assert "p-events-0" not in dom and "events:0" not in dom
