"""The `mqd` command imports structlog without rich (issue 34: rich and pygments cost ~0.1 s of CPU
before the first fetch), and loses nothing by it: its console output still prints rich tracebacks,
`mqd top` still imports rich, and an application that imports mqd keeps structlog as it would be
without mqd. Each case is a fresh interpreter, since the choice is made at structlog's import."""

from __future__ import annotations

import subprocess
import sys

COMMAND = """
import io, re, sys
sys.argv[0] = "/venv/bin/mqd"  # what the console script's process has
import mqd.log
import structlog.dev
assert "rich" not in sys.modules, "rich imported with structlog"
assert structlog.dev.rich is None
out = io.StringIO()
mqd.log.configure(fmt="console", stream=out)
try:
    raise ValueError("the poison record")
except ValueError:
    structlog.get_logger("mqd.test").exception("it failed")
text = re.sub("\x1b\\[[0-9;]*m", "", out.getvalue())
assert "it failed" in text and "ValueError" in text and "the poison record" in text, text
assert "Traceback (most recent call last)" in text and "\\u256d" in text, text  # rich's box
import rich.console  # mqd top
print("ok")
"""

APPLICATION = """
import sys
import mqd.log
import structlog.dev
assert structlog.dev.rich is not None and "rich" in sys.modules
print("ok")
"""


def _run(code: str, *argv: str) -> str:
    res = subprocess.run([sys.executable, *argv, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_the_command_imports_structlog_without_rich_and_its_console_tracebacks_are_rich() -> None:
    """Fails without the hiding (rich in sys.modules) or without the console's own formatter
    (structlog's default, plain, has no box)."""
    assert _run(COMMAND) == "ok"


def test_an_application_importing_mqd_keeps_structlog_as_it_is() -> None:
    assert _run(APPLICATION) == "ok"


def test_python_dash_m_is_the_command_too() -> None:
    """``python -m mqd.operator.cli``, as the benchmarks and tests spawn it: the packages are
    imported while sys.argv[0] is "-m"."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mqd.operator.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    loaded = [line for line in res.stderr.splitlines() if line.split("|")[-1].strip() == "rich.console"]
    assert loaded == [], loaded
