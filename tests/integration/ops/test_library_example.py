"""mqd as a library: the README's example (docs/examples/library.py) reads from a real broker in a
group of its own, and mqd prints nothing unless the application configures logging."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
from support import REPO_ROOT
from support.cli import produce
from support.harness import Cluster

EXAMPLE = REPO_ROOT / "docs" / "examples" / "library.py"
# the README shows the example's code in the python block right after this line
README_MARKER = "<!-- example: docs/examples/library.py -->"


def _python(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT, env=env
    )


def test_library_example_reads_quietly(cluster_factory: Callable[..., Cluster]) -> None:
    """The example reads all 1,000 records of a 2-partition topic from a real broker and its only
    output is its own line: no log line on stdout or stderr (consumer start, rebalance and stop log
    at INFO, which structlog's default would print)."""
    cluster = cluster_factory(topics={"events": 2})
    produce(cluster, 1000)
    res = _python(str(EXAMPLE), cluster.bootstrap, "events", "1000")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "read 1000 records from events\n"
    assert res.stderr == ""


def test_logging_shows_up_once_the_application_configures_it() -> None:
    """With ``logging.basicConfig`` an mqd event is one stdlib line ``event key=value`` (and an
    exception keeps its traceback); without it, even a warning prints nothing."""
    script = textwrap.dedent(
        """
        import logging, sys
        import structlog
        import mqd.consumer
        log = structlog.get_logger("mqd.consumer")
        log.warning("unconfigured warning")
        fmt = "%(levelname)s %(name)s: %(message)s"
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format=fmt)
        log.debug("below the level")
        log.info("consumer started", group="my-reader", owned=2)
        try:
            raise KeyError("k")
        except KeyError:
            log.exception("it failed", partition=3)
        """
    )
    res = _python("-c", script)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    lines = res.stdout.splitlines()
    assert lines[0] == "INFO mqd.consumer: consumer started group='my-reader' owned=2"
    assert lines[1] == "ERROR mqd.consumer: it failed partition=3"
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "KeyError: 'k'"
    assert "unconfigured warning" not in res.stdout and "below the level" not in res.stdout


def test_the_mqd_command_shows_warnings_on_stderr() -> None:
    """The ``mqd`` command is an application: a command that does not set up logging itself still
    shows mqd's warnings (not its INFO lines) on stderr, and nothing on stdout but its output."""
    script = textwrap.dedent(
        """
        import structlog
        from mqd.operator.cli import main

        @main.command("log-twice")
        def log_twice() -> None:
            structlog.get_logger("mqd.landing").info("an info line")
            structlog.get_logger("mqd.landing").warning("a warning line", partition=3)
            print("output")

        main(["log-twice"])
        """
    )
    res = _python("-c", script)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "output\n"
    assert "a warning line" in res.stderr and "partition" in res.stderr
    assert "an info line" not in res.stderr


def test_readme_shows_the_example_as_it_is_tested() -> None:
    """The README's library block is the tested file's code (a contiguous part of it), so the
    README cannot drift from what runs."""
    readme = (REPO_ROOT / "README.md").read_text()
    if README_MARKER not in readme:
        pytest.skip(f"README.md has no {README_MARKER!r} line yet")
    block = re.search(r"```python\n(.*?)```", readme[readme.index(README_MARKER) :], re.S)
    assert block is not None, "no python block after the marker"
    assert block.group(1).strip() in EXAMPLE.read_text()
