"""``mqd top`` (and ``mqd status --watch``): the live view of a running daemon, drawn with rich.

It reads only the status JSON the admin endpoint serves (:func:`mqd.operator.views.partition_rows` parses it),
so what it shows is exactly what ``/status``, ``mqd status`` and the HTML page show. The view keeps
the previous sample to turn offsets into rates and CPU seconds into a CPU share; nothing else is
remembered between samples, so a restarted daemon is just a new sample stream.

Layout decisions:

- Offsets are exact (``18352``, never ``18.4k``): they are compared with the broker's and Kafka
  tools' figures, and a rounded offset cannot be.
- Width-aware: every column is measured; when the table does not fit the terminal the least
  important columns are dropped, node names shortened before a more useful column goes
  (:data:`DROP_ORDER`). The error column takes the room left (none when under
  :data:`MIN_ERROR_WIDTH`); an error that does not fit whole is listed whole under the table, so an
  error is never cut.
- The header is laid out in segments that never wrap mid-segment: a segment that does not fit on the
  line starts the next one.
- LAG is what ``kafka-consumer-groups`` calls lag: the log end minus the committed offset, which in
  mqd is the landed one (records not landed yet); FETCH-LAG is the log end minus the fetch position
  (records not fetched yet; fetched records wait in buffers until their file is cut). TIME-LAG is
  the age of the oldest record not landed yet, 0 when caught up.
- The lag bar is drawn from the lag itself, in seconds of work at the current rate (full at
  :data:`LAG_BAR_FULL_S`), so steady load (a small lag drained continuously) shows an almost empty
  bar, never a stale ``100%``; records waiting for their file's cut count (at most
  ``landing.max_age`` of them).
- The loop never exits on a connection error or a stopped daemon: it says so and waits for the
  daemon to come back (systemd restarts, upgrades).
"""

from __future__ import annotations

import io
import os
import select
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from mqd.operator.views import PartitionRow, binary_size, duration, partition_rows

SortKey = Literal["partition", "lag", "rate", "time-lag"]
SORT_KEYS: tuple[SortKey, ...] = ("partition", "lag", "rate", "time-lag")

COLUMNS: tuple[str, ...] = (
    "TOPIC:PARTITION",
    "STATE",
    "NODE",
    "POSITION",
    "COMMITTED",
    "LANDED",
    "LOG-END",
    "LAG",
    "FETCH-LAG",
    "TIME-LAG",
    "RATE",
    "ERROR",
)
LEFT = frozenset({"TOPIC:PARTITION", "STATE", "NODE", "ERROR"})
# least important first: FETCH-LAG says only how much is left to fetch; POSITION and COMMITTED trail
# LANDED (the source of truth); LAG and TIME-LAG are what a lag alert is about, so they stay longest
SHORTEN_NODE = "~NODE"  # a step of DROP_ORDER: node names cut (with an ellipsis) to what fits
DROP_ORDER: tuple[str, ...] = (
    "FETCH-LAG",
    "COMMITTED",
    "POSITION",
    "RATE",
    SHORTEN_NODE,
    "LOG-END",
    "NODE",
    "LANDED",
    "STATE",
    "TIME-LAG",
)
MIN_ERROR_WIDTH = 16
MIN_NODE_WIDTH = 8
GAP = 2  # spaces between columns
LAG_BAR_FULL_S = 60.0
LAG_BAR_WIDTH = 20


@dataclass(frozen=True, slots=True)
class Reading:
    """One look at the daemon: its status JSON, or why there is none (not running, not answering)."""

    status: Mapping[str, Any] | None
    pid: int | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Row:
    """A partition as the table shows it: the status row plus its rate between two samples."""

    part: PartitionRow
    rate: float | None  # records/s of the fetch position; None on the first sample
    error_age_s: float | None


class TopView:
    """Renders status samples; keeps the previous one for rates and the CPU share."""

    def __init__(self, sort: SortKey = "partition") -> None:
        self.sort: SortKey = sort
        self._positions: dict[tuple[str, int], int] = {}
        self._cpu_s: float | None = None
        self._pid: int | None = None
        self._at: float | None = None
        self._rates: dict[tuple[str, int], float] = {}
        self._last: tuple[Mapping[str, Any], list[Row]] | None = None
        self._cpu_share: float | None = None

    def sample(self, status: Mapping[str, Any], now: float, pid: int | None = None) -> list[Row]:
        """Rows of ``status`` with their rates since the previous sample (reset when the pid changes)."""
        parts = partition_rows(status)
        process = _section(status, "process")
        if pid is not None and pid != self._pid:
            self._positions, self._cpu_s, self._at = {}, None, None
            self._pid = pid
        dt = now - self._at if self._at is not None else 0.0
        rates: dict[tuple[str, int], float] = {}
        for r in parts:
            before = self._positions.get((r.topic, r.partition))
            if dt > 0 and before is not None and r.position is not None:
                rates[(r.topic, r.partition)] = max(0, r.position - before) / dt
        cpu = _number(process.get("cpu_seconds"))
        if dt > 0 and cpu is not None and self._cpu_s is not None:
            self._cpu_share = max(0.0, cpu - self._cpu_s) / dt
        elif self._at is None:
            self._cpu_share = None
        self._cpu_s = cpu
        self._positions = {(r.topic, r.partition): r.position for r in parts if r.position is not None}
        self._rates = rates
        self._at = now
        return [Row(r, rates.get((r.topic, r.partition)), r.error_age_s) for r in parts]

    def render(
        self, status: Mapping[str, Any], width: int, now: float | None = None, pid: int | None = None
    ) -> RenderableType:
        """The screen for one sample: header, lag bar, the partition table, errors that did not fit."""
        self._last = (status, self.sample(status, time.monotonic() if now is None else now, pid))
        return self.redraw(width)

    def redraw(self, width: int, footer: str = "") -> RenderableType:
        """The last sample drawn again (a new sort order, a resized terminal): no new rates."""
        if self._last is None:
            return Text("")
        status, rows = self._last
        rows = sort_rows(rows, self.sort)
        known = [r.rate for r in rows if r.rate is not None]
        total_rate = sum(known) if known else None
        total_lag = sum(r.part.lag or 0 for r in rows)
        held_lag = sum(r.part.lag or 0 for r in rows if r.part.paused or r.part.parked)
        parts: list[RenderableType] = [
            _header(status, width, total_rate, self._cpu_share),
            _lag_line(total_lag, held_lag, total_rate, len(rows), width),
        ]
        table, overflow = _table(rows, width)
        if table is not None:
            parts.append(table)
        for line in overflow:
            parts.append(Text(line, no_wrap=True, overflow="ellipsis"))
        if footer:
            parts.append(Text(footer, style="dim", no_wrap=True, overflow="ellipsis"))
        return Group(*parts)

    def next_sort(self) -> None:
        """The next of SORT_KEYS (the ``s`` key)."""
        self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]


def sort_rows(rows: Sequence[Row], key: SortKey) -> list[Row]:
    """``partition``: by topic and partition; ``lag``, ``rate``, ``time-lag``: largest first, unknown
    last, ties by partition."""
    by_tp = sorted(rows, key=lambda r: (r.part.topic, r.part.partition))
    if key == "partition":
        return by_tp
    pick: Callable[[Row], float | None] = {
        "lag": lambda r: None if r.part.lag is None else float(r.part.lag),
        "rate": lambda r: r.rate,
        "time-lag": lambda r: r.part.time_lag_s,
    }[key]

    def order(r: Row) -> tuple[bool, float]:
        v = pick(r)
        return (v is None, -(v or 0.0))

    return sorted(by_tp, key=order)


def render_text(view: TopView, status: Mapping[str, Any], width: int, now: float | None = None) -> str:
    """The screen as plain text at ``width`` columns (tests, logs, ``make screenshots``)."""
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    console.print(view.render(status, width, now))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return str(out)


# -- the header -------------------------------------------------------------------------------------


def _header(status: Mapping[str, Any], width: int, rate: float | None, cpu_share: float | None) -> Text:
    consumer = _section(status, "consumer")
    runner = _section(status, "runner")
    process = _section(status, "process")
    health = _section(status, "health")
    totals = _section(consumer, "totals")
    stats = _section(status, "stats")
    version = process.get("version")
    health_text = str(health.get("status", "?"))
    segments = [
        f"mqd {version}" if version else "mqd",
        f"{status.get('state', '?')}, {health_text}",
        f"pid {runner.get('pid', '-')}",
        f"up {duration(_number(runner.get('uptime_s')))}",
        f"group {consumer.get('group', '-')}",
        f"member {consumer.get('member_id', '-')}",
        f"generation {_dash(consumer.get('generation'))}",
        "records/s " + ("-" if rate is None else f"{rate:,.0f}"),
        "CPU " + ("-" if cpu_share is None else f"{cpu_share * 100:.0f}%"),
        f"RSS {binary_size(_number(process.get('rss_bytes')))}",
        "budget " + _budget(totals),
        f"landed {_dash(stats.get('records_published'))} records"
        f" in {_dash(stats.get('files_published'))} files",
    ]
    text = Text(no_wrap=True, overflow="ellipsis")
    line = 0
    for seg in segments:
        if line and line + GAP + len(seg) > width:
            text.append("\n")
            line = 0
        elif line:
            text.append(" " * GAP)
            line += GAP
        text.append(seg, style="bold" if seg is segments[0] else "")
        line += len(seg)
    for reason in health.get("reasons") or []:
        text.append("\n")
        text.append(f"! {reason}", style="yellow")
    return text


def _budget(totals: Mapping[str, Any]) -> str:
    """What the byte budget counts (``budget_used_bytes``: answers, fetches in flight, the RSS above
    idle outside its charges; the buffered bytes from a daemon that does not say), the RSS outside
    said apart when there is some."""
    limit = _number(totals.get("budget_bytes"))
    used = _number(totals.get("budget_used_bytes"))
    if used is None:
        used = _number(totals.get("buffered_bytes"))
    if used is None:
        return "-"
    outside = _number(totals.get("memory_outside_bytes")) or 0
    text = (
        f"{binary_size(used)}/{binary_size(limit)} ({used / limit * 100:.0f}%)"
        if limit
        else binary_size(used)
    )
    return f"{text}, {binary_size(outside)} outside" if outside else text


def _lag_line(lag: int, held: int, rate: float | None, count: int, width: int) -> Text:
    """The backlog in records and in seconds of work at the current rate; the bar is full at
    LAG_BAR_FULL_S seconds, or when nothing drains a lag. The lag of paused and parked partitions is
    said apart and left out of the bar: no rate drains it. With no rate known yet (the first sample)
    the bar is not drawn: it would be a guess."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{count} partitions  lag {lag} records not landed")
    if held:
        text.append(f" ({held} paused or parked)")
    lag -= held
    if rate is None:
        text.append("  (rate known from the next sample)" if lag else "")
        return text
    seconds = lag / rate if lag and rate > 0 else 0.0
    frac = 1.0 if lag and rate <= 0 else min(1.0, seconds / LAG_BAR_FULL_S)
    bar_w = max(5, min(LAG_BAR_WIDTH, width - len(text) - 30))
    filled = round(frac * bar_w)
    text.append("  [")
    text.append("#" * filled, style="red" if frac >= 1 else "yellow" if frac > 0.25 else "green")
    text.append("." * (bar_w - filled))
    text.append("] not draining" if lag and rate <= 0 else f"] {duration(seconds)} to drain")
    return text


# -- the table --------------------------------------------------------------------------------------


def _cells(r: Row) -> dict[str, str]:
    p = r.part
    state = "stuck" if p.stuck else (p.state or "ok")
    error = p.error
    if error and r.error_age_s is not None:
        error = f"{error} ({duration(r.error_age_s)} ago)"
    return {
        "TOPIC:PARTITION": f"{p.topic}:{p.partition}",
        "STATE": state,
        "NODE": p.node_text or "-",
        "POSITION": _dash(p.position),
        "COMMITTED": _dash(p.committed),
        "LANDED": _dash(p.landed),
        "LOG-END": _dash(p.log_end),
        "LAG": _dash(p.lag),
        "FETCH-LAG": _dash(p.fetch_lag),
        "TIME-LAG": "-" if p.time_lag_s is None else duration(p.time_lag_s),
        "RATE": "-" if r.rate is None else f"{r.rate:.0f}",
        "ERROR": error or "-",
    }


def layout(rows: Sequence[Mapping[str, str]], width: int) -> tuple[list[str], dict[str, int], bool]:
    """Which columns fit in ``width`` and how wide each is; the last item says whether the errors go
    under the table (the ERROR column would be narrower than MIN_ERROR_WIDTH). Columns are dropped
    only while the others do not fit; an error never costs a column, it moves under the table."""
    need = {c: max([len(c), *(len(r[c]) for r in rows)]) for c in COLUMNS}
    fixed = [c for c in COLUMNS if c != "ERROR"]

    def used(cols: Sequence[str]) -> int:
        return sum(need[c] for c in cols) + GAP * max(0, len(cols) - 1)

    cols = list(fixed)
    for step in DROP_ORDER:
        if used(cols) <= width:
            break
        if step == SHORTEN_NODE:  # shorter node names before losing a column
            need["NODE"] = max(MIN_NODE_WIDTH, need["NODE"] - (used(cols) - width))
        else:
            cols.remove(step)
    widths = {c: need[c] for c in cols}
    room = width - used(cols) - GAP
    errors_below = room < MIN_ERROR_WIDTH
    if not errors_below:
        widths["ERROR"] = min(room, need["ERROR"])
        cols.append("ERROR")
    return cols, widths, errors_below


def _table(rows: Sequence[Row], width: int) -> tuple[Table | None, list[str]]:
    if not rows:
        return None, ["no partitions assigned"]
    cells = [_cells(r) for r in rows]
    cols, widths, errors_below = layout(cells, width)
    table = Table(box=None, padding=(0, GAP // 2), pad_edge=False, show_edge=False, header_style="bold")
    for c in cols:
        table.add_column(
            c,
            justify="left" if c in LEFT else "right",
            width=widths[c],
            no_wrap=True,
            overflow="ellipsis",
        )
    for r, cell in zip(rows, cells, strict=True):
        style = "red" if r.part.stuck or r.part.parked else "yellow" if r.part.error else ""
        table.add_row(*(cell[c] for c in cols), style=style)
    # an error cut by its column (or with no column) is listed whole under the table
    room = 0 if errors_below else widths["ERROR"]
    below = [
        f"{cell['TOPIC:PARTITION']}: {cell['ERROR']}"
        for cell in cells
        if cell["ERROR"] != "-" and len(cell["ERROR"]) > room
    ]
    return table, below


# -- the loop ---------------------------------------------------------------------------------------


def run(
    read: Callable[[], Reading],
    *,
    interval: float,
    iterations: int | None = None,
    sort: SortKey = "partition",
    console: Console | None = None,
) -> None:
    """Sample with ``read`` every ``interval`` seconds and draw; on a terminal the screen is redrawn
    in place (rich Live) and keys work (``s`` next sort order, ``q`` quit), otherwise each sample is
    printed. ``iterations`` bounds the loop (tests)."""
    console = console or Console()
    view = TopView(sort)
    if console.is_terminal:
        from rich.live import Live

        with (
            Keys(sys.stdin) as keys,
            Live(console=console, auto_refresh=False, screen=True, redirect_stderr=False) as live,
        ):
            _loop(read, view, interval, iterations, console, lambda r: live.update(r, refresh=True), keys)
    else:
        _loop(read, view, interval, iterations, console, console.print, Keys(None))


class Keys:
    """Single key presses from a terminal's stdin while the view runs: cbreak mode (no echo, no line
    buffering) from ``__enter__`` to ``__exit__``, which restores the terminal. Not a terminal: no keys."""

    def __init__(self, stream: TextIO | None) -> None:
        self._fd = stream.fileno() if stream is not None and stream.isatty() else None
        self._saved: list[Any] | None = None

    @property
    def active(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> Keys:
        if self._fd is not None:
            import termios
            import tty

            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def wait(self, timeout: float) -> str | None:
        """The next key pressed within ``timeout`` seconds, or None (then the whole timeout passed)."""
        if self._fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        if not ready:
            return None
        return os.read(self._fd, 1).decode(errors="replace")


FOOTER = "s: sort by {sort} (next: {next})  q: quit"


def _loop(
    read: Callable[[], Reading],
    view: TopView,
    interval: float,
    iterations: int | None,
    console: Console,
    show: Callable[[RenderableType], None],
    keys: Keys,
) -> None:
    n = 0

    def footer() -> str:
        if not keys.active:
            return ""
        after = SORT_KEYS[(SORT_KEYS.index(view.sort) + 1) % len(SORT_KEYS)]
        return FOOTER.format(sort=view.sort, next=after)

    try:
        while iterations is None or n < iterations:
            n += 1
            reading = read()
            if reading.status is None:
                show(Text(f"mqd: {reading.problem or 'daemon not running'}; waiting...", no_wrap=True))
            else:
                view.render(reading.status, console.width, pid=reading.pid)
                show(view.redraw(console.width, footer()))
            if iterations is not None and n >= iterations:
                break
            # the refresh period itself, cut short only to answer a key
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0:
                key = keys.wait(left)
                if key == "q":
                    return
                if key == "s":
                    view.next_sort()
                    if reading.status is not None:
                        show(view.redraw(console.width, footer()))
    except KeyboardInterrupt:
        pass


# -- formatting -------------------------------------------------------------------------------------


def _dash(v: object) -> str:
    return "-" if v is None or v == "" else str(v)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _section(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = d.get(key)
    return value if isinstance(value, Mapping) else {}
