"""The README's quick tour, run as a user runs it: every command of its shell block, in order, in a
copy of the repository's ``config/`` folder, and each step shows what the README says it shows.

The block is the first ``sh`` block after the line ``<!-- tested: tests/e2e/test_readme_tour.py -->``
(or, without that line, after the ``## Quick tour`` heading). The tour's broker listens on 9400; here
it gets a free port: ``9400`` is rewritten in the copied config files and in the commands, ``mqd
produce`` gets ``--bootstrap`` and the daemon ``MQD_CONSUMER__BOOTSTRAP`` where the tour relies on
the default URL, and the admin endpoint takes any free port (``MQD_ADMIN__PORT=0``). Between the
daemon's start and its stop the test waits (bounded) until every produced record has landed, as a
user watching ``mqd status`` would.
"""

from __future__ import annotations

import functools
import os
import pty
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
from support import REPO_ROOT
from support.daemon import landed

from mqd.config import load_daemon_config
from mqd.testing import ManagedProcess, free_port, get_json
from mqd.waiting import wait_until_sync

pytestmark = pytest.mark.spark

MARKER = "<!-- tested: tests/e2e/test_readme_tour.py -->"
HEADING = "## Quick tour"
TOUR_PORT = "9400"
MQD = str(Path(sys.executable).parent / "mqd")
STEP_TIMEOUT = 120.0
SPARK_TIMEOUT = 400.0
LAND_TIMEOUT = 180.0


@dataclass(frozen=True)
class Step:
    """One command of the tour: its words after ``mqd``, and whether the README runs it with ``&``."""

    line: str
    args: list[str]
    background: bool


def tour_steps(readme: str) -> list[Step]:
    """The ``mqd`` commands of the tour block (comments, blank lines and the venv activation left out)."""
    start = readme.find(MARKER)
    if start < 0:
        start = readme.find(f"\n{HEADING}\n")
    assert start >= 0, f"README.md has neither {MARKER!r} nor a {HEADING!r} heading"
    block = re.search(r"```sh\n(.*?)```", readme[start:], re.S)
    assert block is not None, "no sh block in the tour"
    steps = []
    for raw in block.group(1).splitlines():
        line = raw.split("  #", 1)[0].strip()  # a comment starts after two spaces, as in the README
        if not line or line.startswith("#") or line in (". .venv/bin/activate", "source .venv/bin/activate"):
            continue
        background = line.endswith("&")
        words = shlex.split(line.rstrip("&").strip())
        assert words[0] == "mqd", f"the tour test only knows how to run mqd commands, not: {line}"
        steps.append(Step(line, words[1:], background))
    return steps


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def _landed_at_least(landing: Path, count: int) -> bool:
    return len(landed(landing)) >= count


def _top_on_a_terminal(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run `mqd top` with stdout on a pseudo-terminal until its screen names the topic, then Ctrl-C."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([MQD, *args], stdout=slave, stderr=slave, stdin=slave, cwd=cwd, env=env)
    os.close(slave)
    seen: list[bytes] = []

    def shows_topic() -> bool:
        if select.select([master], [], [], 0.2)[0]:
            try:
                seen.append(os.read(master, 65536))
            except OSError:
                return True  # it exited; the assertions below say why
        return b"events" in b"".join(seen) or proc.poll() is not None

    try:
        wait_until_sync(shows_topic, timeout=STEP_TIMEOUT, what="mqd top to show the topic", interval=0.0)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=STEP_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return b"".join(seen).decode(errors="replace")


def test_readme_tour(tmp_path: Path) -> None:
    """Broker, `mqd produce`, `config check`, `start`, `status`, `top`, `stop` and `spark --once`
    exactly as the README lists them: the produced records all land, exactly once, and the Spark
    table holds as many rows as were produced."""
    steps = tour_steps((REPO_ROOT / "README.md").read_text())
    commands = [s.args[0] for s in steps]
    assert commands[0] == "broker" and steps[0].background, commands
    assert {"produce", "start", "stop", "spark"} <= set(commands), commands

    port = str(free_port())
    shutil.copytree(REPO_ROOT / "config", tmp_path / "config")
    for toml in (tmp_path / "config").glob("*.toml"):
        toml.write_text(re.sub(rf"\b{TOUR_PORT}\b", port, toml.read_text()))
    bootstrap = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "MQD_CONSUMER__BOOTSTRAP": f'["{bootstrap}"]',
        "MQD_ADMIN__PORT": "0",
        "PATH": f"{Path(MQD).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("NOTIFY_SOCKET", None)

    broker: ManagedProcess | None = None
    daemon_config: Path | None = None
    produced = 0
    try:
        for step in steps:
            args = [re.sub(rf"\b{TOUR_PORT}\b", port, a) for a in step.args]
            what = step.line
            if step.background:
                assert args[0] == "broker", f"only the broker runs in the background: {what}"
                broker = ManagedProcess(
                    "broker", [MQD, *args], tmp_path / "broker.log", cwd=tmp_path, env=env
                )
                broker.start()
                broker.wait_ready(
                    lambda: get_json(f"{bootstrap}/v1/health", timeout=1.0), timeout=STEP_TIMEOUT
                )
                continue
            if args[0] == "produce" and _option(args, "--bootstrap") is None:
                args += ["--bootstrap", bootstrap]
            if _option(args, "--config") is not None and args[0] not in ("broker",):
                daemon_config = tmp_path / str(_option(args, "--config"))
            if args[0] == "top":
                screen = _top_on_a_terminal(args, tmp_path, env)
                assert "events" in screen and "Traceback" not in screen, f"{what}:\n{screen[-3000:]}"
                continue
            if args[0] == "status":
                # what a user watching the tour sees once the daemon caught up
                assert daemon_config is not None
                landing = Path(load_daemon_config(daemon_config, env).landing.dir)
                wait_until_sync(
                    functools.partial(_landed_at_least, landing, produced),
                    timeout=LAND_TIMEOUT,
                    what=f"{produced} records to land in {landing}",
                    interval=0.5,
                )
            timeout = SPARK_TIMEOUT if args[0] == "spark" else STEP_TIMEOUT
            started = time.monotonic()
            res = subprocess.run(
                [MQD, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
            )
            took = time.monotonic() - started
            out = f"$ {what}\nexit {res.returncode} after {took:.1f}s\n{res.stdout}\n{res.stderr}"
            assert res.returncode == 0, out[-6000:]
            if args[0] == "produce":
                produced = int(_option(args, "--count") or 0)
                assert produced > 0 and f"produced {produced} records" in res.stdout, out
            elif args[0] == "status":
                assert "events" in res.stdout, out
            elif args[0] == "stop":
                assert daemon_config is not None
                rows = landed(Path(load_daemon_config(daemon_config, env).landing.dir))
                assert len(rows) == produced, f"landed {len(rows)} of {produced} records"
                assert len(np.unique(rows, axis=0)) == produced, "duplicate records in the landing"
            elif args[0] == "spark":
                assert daemon_config is not None
                table = load_daemon_config(daemon_config, env).spark.output_dir
                rows = ds.dataset(table, format="parquet", partitioning="hive").count_rows()
                assert rows == produced, f"the Spark table has {rows} rows, {produced} were produced"
    finally:
        if daemon_config is not None:
            subprocess.run(
                [MQD, "stop", "--config", str(daemon_config), "--force"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                timeout=STEP_TIMEOUT,
            )
        if broker is not None:
            broker.stop()
