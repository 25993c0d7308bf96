"""The HTML status page as a pure function of the status JSON: totals, identity, errors with their
age, user text escaped, `-` in every empty cell, no external asset; and the throughput the server
measures between page loads."""

from __future__ import annotations

import re

from mqd.operator.status_page import REFRESH_S, Throughput, render_page

STATUS = {
    "state": "running",
    "health": {"status": "degraded", "reasons": ["broker-b-1 <down>"]},
    "runner": {"pid": 42, "uptime_s": 75.0},
    "process": {"version": "9.9.9", "rss_bytes": 3 << 20},
    "stats": {"records_published": 1234567, "bytes_published": 5 << 20, "files_published": 12},
    "consumer": {
        "group": "g",
        "member_id": "m-1",
        "generation": 4,
        "totals": {"buffered_bytes": 1 << 20, "budget_bytes": 4 << 20},
        "assignment": {
            "events/0": {
                "topic": "events",
                "partition": 0,
                "position": 7,
                "log_end": 9,
                "lag": 2,
                "fetch_lag": 2,
            },
            "events/1": {
                "topic": "events",
                "partition": 1,
                "position": 3,
                "landed": 3,
                "log_end": 3,
                "lag": 0,
                "last_error": "<b>timeout</b>",
                "last_error_age_s": 12.4,
                "pull_node": "broker-a-0",
            },
        },
    },
}


def test_page_shows_totals_identity_and_errors_with_age() -> None:
    """Every summary figure is there; the error reads "timeout (12s ago)", escaped."""
    page = render_page(STATUS, 2500.0)
    for text in (
        '<dd id="version">9.9.9</dd>',
        '<dd id="uptime">1m15s</dd>',
        '<dd id="group">g</dd>',
        '<dd id="member">m-1</dd>',
        '<dd id="generation">4</dd>',
        '<dd id="records-s">2,500</dd>',
        '<dd id="records-landed">1,234,567</dd>',
        '<dd id="bytes-landed">5.0MiB</dd>',
        '<dd id="files-published">12</dd>',
        '<dd id="total-lag">2</dd>',
        '<dd id="buffered">1.0MiB of 4.0MiB (25%)</dd>',
        "&lt;b&gt;timeout&lt;/b&gt; (12s ago)",
        "broker-b-1 &lt;down&gt;",
        f'http-equiv="refresh" content="{REFRESH_S}"',
    ):
        assert text in page, text
    assert "<b>timeout" not in page


def test_empty_cells_are_dashes_and_nothing_is_loaded_from_elsewhere() -> None:
    """A partition without committed/landed/node/time lag/error shows `-` there, never an empty
    cell; the page references no other host (no CDN: it must work offline)."""
    page = render_page(STATUS)
    row = re.search(r'<tr class="s-ok" id="p-events-0">(.*?)</tr>', page)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells == ["events:0", "ok", "-", "7", "-", "-", "9", "2", "2", "-", "-"]
    assert "<td></td>" not in page
    assert '<dd id="records-s">-</dd>' in page  # no throughput known yet
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert render_page({})  # an empty status still renders


def test_throughput_over_the_window_and_after_a_restart() -> None:
    """Records/s over the samples of the last window; unknown with one sample; a total that went
    down (a restarted daemon) starts over."""
    t = Throughput(window_s=10)
    assert t.observe(100, now=0.0) is None
    assert t.observe(300, now=2.0) == 100.0
    assert t.observe(700, now=4.0) == 150.0
    total = 700
    for now in range(6, 22, 2):  # 1000/s for a while
        total += 2000
        t.observe(total, now=float(now))
    for now in range(22, 34, 2):  # then 5000/s for longer than the window
        total += 10000
        rate = t.observe(total, now=float(now))
    assert rate == 5000.0  # only the last 10 s count
    assert t.observe(5, now=41.0) is None
    assert t.observe(None, now=42.0) is None
