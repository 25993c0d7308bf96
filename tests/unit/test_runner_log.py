"""Logging: one processor chain for structlog and stdlib loggers, JSON or console, live level changes."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from mqd import log as mqdlog


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    # back to what importing mqd set up (events as stdlib records), not structlog's own default,
    # which prints to stdout: later tests in the process read mqd's lines through caplog
    structlog.reset_defaults()
    mqdlog.library_default()


def _lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_json_lines_carry_context_for_structlog_and_stdlib_loggers() -> None:
    """Bound topic/partition/node context lands on structlog lines and on stdlib (aiohttp) lines alike."""
    buf = io.StringIO()
    assert mqdlog.configure("info", "auto", buf) == "json"  # not a TTY
    with structlog.contextvars.bound_contextvars(topic="events", partition=3, node="broker-a-0"):
        structlog.get_logger("mqd.consumer").info("fetched", records=10)
        logging.getLogger("aiohttp.client").warning("connection reset %s", "x")
    structlog.get_logger("mqd.consumer").debug("not shown at info")
    ours, theirs = _lines(buf)
    for line in (ours, theirs):
        assert {line["topic"], line["partition"], line["node"]} == {"events", 3, "broker-a-0"}
        assert "timestamp" in line and "level" in line and "logger" in line
    assert ours["event"] == "fetched" and ours["records"] == 10 and ours["logger"] == "mqd.consumer"
    assert theirs["event"] == "connection reset x" and theirs["logger"] == "aiohttp.client"


def test_set_level_applies_to_existing_loggers() -> None:
    """A reload's new level reaches module-level loggers created before it."""
    buf = io.StringIO()
    mqdlog.configure("info", "json", buf)
    early = structlog.get_logger("mqd.early")
    early.debug("hidden")
    mqdlog.set_level("debug")
    early.debug("shown")
    logging.getLogger("mqd.stdlib").debug("also shown")
    mqdlog.set_level("error")
    early.warning("hidden again")
    assert [x["event"] for x in _lines(buf)] == ["shown", "also shown"]


def test_exceptions_are_rendered_into_the_json_line() -> None:
    """An exception becomes one JSON line with its traceback, not a multi-line mess."""
    buf = io.StringIO()
    mqdlog.configure("info", "json", buf)
    try:
        raise ValueError("bad batch")
    except ValueError:
        structlog.get_logger("mqd.x").exception("publish failed")
    (line,) = _lines(buf)
    assert "ValueError: bad batch" in str(line["exception"])


def test_console_format_is_readable_text() -> None:
    """Console output is not JSON and still shows the event and its context."""
    buf = io.StringIO()
    mqdlog.configure("info", "console", buf)
    structlog.get_logger("mqd.x").info("landed", topic="events")
    out = buf.getvalue()
    assert "landed" in out and "topic" in out and not out.startswith("{")


def test_bad_level_or_format_is_refused() -> None:
    """Unknown levels and formats raise with what is allowed."""
    with pytest.raises(ValueError, match="allowed: debug, info"):
        mqdlog.configure("loud", "json", io.StringIO())
    with pytest.raises(ValueError, match="allowed: auto, json, console"):
        mqdlog.configure("info", "xml", io.StringIO())
