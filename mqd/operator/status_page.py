"""The admin endpoint's HTML status page (``GET /``): one self-contained page rendered on the server.

The page is a pure function of the status JSON (:func:`render_page`), like ``mqd status`` and
``mqd top``, plus the throughput the server measures (:class:`Throughput`, sampled every second from
the endpoint's start, so the first page load has a figure). It
reloads itself every :data:`REFRESH_S` seconds with a ``<meta http-equiv="refresh">``: no script, no
external asset (no CDN, no web font), so it works offline, behind the admin token (the browser resends
its Basic credentials on the reload) and with JavaScript disabled. Every value is escaped; an empty
cell shows ``-``.
"""

from __future__ import annotations

import html
from collections import deque
from collections.abc import Mapping
from typing import Any

from mqd.operator.views import PartitionRow, binary_size, duration, partition_rows

REFRESH_S = 2
THROUGHPUT_WINDOW_S = 10.0


class Throughput:
    """Records per second of a growing total, over the samples of the last THROUGHPUT_WINDOW_S."""

    def __init__(self, window_s: float = THROUGHPUT_WINDOW_S) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def observe(self, total: int | None, now: float) -> float | None:
        """Adds a sample; the rate over the window, None until two samples span some time. A total
        that went down (the daemon restarted) starts over."""
        if total is None:
            return None
        if self._samples and total < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now, total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window_s:
            self._samples.popleft()
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None


def render_page(status: Mapping[str, Any], records_per_s: float | None = None) -> str:
    """The whole page for one status sample."""
    consumer = _section(status, "consumer")
    runner = _section(status, "runner")
    process = _section(status, "process")
    health = _section(status, "health")
    stats = _section(status, "stats")
    totals = _section(consumer, "totals")
    rows = partition_rows(status)
    state, verdict = str(status.get("state", "?")), str(health.get("status", "?"))
    summary = [
        ("version", process.get("version")),
        ("pid", runner.get("pid")),
        ("uptime", _duration(_number(runner.get("uptime_s")))),
        ("group", consumer.get("group")),
        ("member", consumer.get("member_id")),
        ("generation", consumer.get("generation")),
        ("records/s", None if records_per_s is None else f"{records_per_s:,.0f}"),
        ("records landed", _count(stats.get("records_published"))),
        ("bytes landed", _size(_number(stats.get("bytes_published")))),
        ("files published", _count(stats.get("files_published"))),
        ("total lag", _count(sum(r.lag or 0 for r in rows)) if rows else None),
        ("buffered", _budget(totals)),
        ("RSS", _size(_number(process.get("rss_bytes")))),
    ]
    reasons = [str(r) for r in health.get("reasons") or []]
    parts = [
        f'<h1>mqd <span id="state" class="{_esc(verdict)}">{_esc(state)}, {_esc(verdict)}</span></h1>',
        '<dl id="summary">'
        + "".join(f'<div><dt>{_esc(k)}</dt><dd id="{_slug(k)}">{_cell(v)}</dd></div>' for k, v in summary)
        + "</dl>",
    ]
    if reasons:
        parts.append('<ul id="reasons">' + "".join(f"<li>{_esc(r)}</li>" for r in reasons) + "</ul>")
    parts.append(_table(rows))
    parts.append(
        f'<p class="links">refreshed every {REFRESH_S} s · <a href="/status">/status</a> · '
        '<a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> · '
        '<a href="/readyz">/readyz</a></p>'
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>mqd: {_esc(state)}, {_esc(verdict)}</title><style>{_STYLE}</style></head>"
        "<body>" + "".join(parts) + "</body></html>"
    )


_HEADERS = (
    "partition",
    "state",
    "node",
    "position",
    "committed",
    "landed",
    "log end",
    "lag",
    "fetch lag",
    "time lag",
    "error",
)

_STYLE = (
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
    "h1{font-size:1.4em;margin:0 0 .6em}h1 .ok{color:#1a7f37}h1 .degraded{color:#b35900}"
    "#summary{display:flex;flex-wrap:wrap;gap:.4em 1.6em;margin:0 0 1em}"
    "#summary dt{font-size:.8em;color:#666}#summary dd{margin:0;font-weight:600}"
    "#reasons{color:#b35900}"
    "table{border-collapse:collapse}th,td{padding:3px 10px;text-align:right;white-space:nowrap}"
    "th{border-bottom:1px solid #999}td.l,th.l{text-align:left}td.err{white-space:normal;color:#b00}"
    "tr:nth-child(even) td{background:#f4f4f4}tr.s-stuck td,tr.s-parked td{background:#fde7e7}"
    ".links{color:#666;font-size:.85em}"
)


def _table(rows: list[PartitionRow]) -> str:
    if not rows:
        return '<p id="partitions">no partitions assigned</p>'
    left = {"partition", "state", "node", "error"}
    head = "".join(f"<th{_class('l' if h in left else '')}>{h}</th>" for h in _HEADERS)
    body = []
    for r in rows:
        state = "stuck" if r.stuck else (r.state or "ok")
        error = r.error or None
        if error and r.error_age_s is not None:
            error = f"{error} ({_duration(r.error_age_s)} ago)"
        cells = [
            ("l", f"{r.topic}:{r.partition}"),
            ("l", state),
            ("l", r.node_text or None),
            ("", r.position),
            ("", r.committed),
            ("", r.landed),
            ("", r.log_end),
            ("", r.lag),
            ("", r.fetch_lag),
            ("", _duration(r.time_lag_s)),
            ("l err" if error else "l", error),
        ]
        tds = "".join(f"<td{_class(cls)}>{_cell(v)}</td>" for cls, v in cells)
        body.append(f'<tr class="s-{_esc(state)}" id="p-{_esc(r.topic)}-{r.partition}">{tds}</tr>')
    return f'<table id="partitions"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _budget(totals: Mapping[str, Any]) -> str | None:
    used, limit = _number(totals.get("buffered_bytes")), _number(totals.get("budget_bytes"))
    if used is None:
        return None
    if not limit:
        return _size(used)
    return f"{_size(used)} of {_size(limit)} ({used / limit * 100:.0f}%)"


def _class(names: str) -> str:
    return f' class="{names}"' if names else ""


def _slug(label: str) -> str:
    """``records/s`` -> ``records-s``: the summary items' element ids."""
    return label.replace("/", "-").replace(" ", "-")


def _cell(v: object) -> str:
    return "-" if v is None or v == "" else _esc(str(v))


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _count(v: Any) -> str | None:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else None


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _section(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    return value if isinstance(value, Mapping) else {}


def _size(n: float | None) -> str | None:
    return None if n is None else binary_size(n)


def _duration(seconds: float | None) -> str | None:
    return None if seconds is None else duration(seconds)
