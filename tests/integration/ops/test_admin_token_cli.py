"""The CLI against a real daemon whose admin endpoint has a token: `mqd start`, `status` (text and
JSON), `top`, `pause` and `resume` send the config's admin token, while a caller without it is
refused and the probes stay open."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.cli import mqd, write_config
from support.harness import Cluster

from mqd.operator.cli import main
from mqd.waiting import wait_until_sync

ADMIN_TOKEN = "adm-7c41e9-token"


def _config(tmp_path: Path, cluster: Cluster) -> Path:
    return write_config(tmp_path, cluster, admin={"auth_token": ADMIN_TOKEN})


_mqd = mqd


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The CLI in this process; the daemon it talks to is still real."""
    res = CliRunner().invoke(main, list(args), env=env)
    return res.exit_code, res.stdout, res.stderr


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The daemon's state folder; a daemon still named by its pid file at teardown (a failed test,
    even a `start` that gave up waiting) is SIGKILLed."""
    state = tmp_path / "state"
    yield state
    try:
        os.kill(int((state / "mqd.pid").read_text()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def test_cli_sends_the_admin_token_and_others_are_refused(
    tmp_path: Path, state_dir: Path, cluster_factory: Callable[..., Cluster]
) -> None:
    """start waits for a daemon whose /status needs the token; status, status --json, top, pause and
    resume work through it; a plain GET /status without the token gets 401, /healthz stays open; the
    CLI with a wrong token in its config is refused."""
    cluster = cluster_factory(topics={"events": 2})
    cfg = _config(tmp_path, cluster)
    res = _mqd("start", "-c", str(cfg), "--wait", "30")
    assert res.returncode == 0, res.stdout + res.stderr
    pid = int((state_dir / "mqd.pid").read_text())
    url = json.loads((state_dir / "admin.json").read_text())["url"]
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    code, body = _get(f"{url}/status")
    assert code == 401 and body["error"] == "unauthorized"
    assert _get(f"{url}/status", {"Authorization": "Bearer wrong"})[0] == 401
    assert _get(f"{url}/healthz")[0] == 200

    def assigned() -> bool:
        code, body = _get(f"{url}/status", auth)
        return code == 200 and len((body.get("consumer") or {}).get("assignment") or {}) == 2

    wait_until_sync(assigned, timeout=30, what="both partitions assigned")

    code, out, err = _cli("status", "-c", str(cfg))
    assert code == 0, out + err
    assert "mqd is running: ok" in out and "2 partitions assigned" in out
    code, out, err = _cli("status", "-c", str(cfg), "--json")
    assert code == 0, out + err
    assert json.loads(out)["runner"]["pid"] == pid

    # the token sent is the config's: a wrong one (from MQD_ADMIN__AUTH_TOKEN) is refused
    code, out, err = _cli("status", "-c", str(cfg), env={"MQD_ADMIN__AUTH_TOKEN": "wrong"})
    assert code == 1 and "401: this endpoint needs the admin token" in out, out + err
    code, out, err = _cli("pause", "-c", str(cfg), "events:0", env={"MQD_ADMIN__AUTH_TOKEN": "wrong"})
    assert code != 0 and "401" in out + err, out + err

    code, out, err = _cli("pause", "-c", str(cfg), "events:1")
    assert code == 0 and "paused: events:1" in out, out + err
    assert _get(f"{url}/status", auth)[1]["consumer"]["assignment"]["events/1"]["paused"] is True
    code, out, err = _cli("top", "-c", str(cfg), "--iterations", "1")
    assert code == 0 and "2 partitions  lag" in out and "paused" in out, out + err
    assert "does not answer" not in out
    code, out, err = _cli("resume", "-c", str(cfg), "events:1")
    assert code == 0, out + err
    assert _get(f"{url}/status", auth)[1]["consumer"]["assignment"]["events/1"]["paused"] is False

    res = _mqd("stop", "-c", str(cfg))
    assert res.returncode == 0 and "mqd stopped cleanly" in res.stdout, res.stdout + res.stderr
