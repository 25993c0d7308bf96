"""The runner reads the daemon through one typed ``DaemonSnapshot`` (issue 32, point 4), and the
status JSON it serves is the one it served when it merged the daemon's status dict into its own:
the same keys, in the same order, with the same values."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

import pytest

from mqd.config import MqdConfig
from mqd.consumer import Consumer
from mqd.process.runner import Runner
from mqd.process.state import DaemonSnapshot, DaemonState, RunnerState

SNAP = DaemonSnapshot(
    state=DaemonState.RUNNING,
    health="degraded",
    reasons=("landing: disk full",),
    burst=False,
    uptime_s=12.34567,
    last_loop_age_s=0.0123456,
    consumer=None,
    landing_sink={"dir": "/landing", "pending_records": 3, "files": 2},
    landing_error="disk full",
    paused_for_disk=("events/0", "events/1"),
    chain_broken={"events/2": "events/2/claims/7"},
    table=None,
    user_paused=("events/3",),
    subscribed_topics=("events",),
    unmatched_patterns=("re:nothing.*",),
    stats={"records_published": 10, "files_published": 2},
    errors=({"where": "publish", "error": "OSError: disk full", "retriable": True, "at": "t"},),
)


class FakeDaemon:
    """The DaemonLike part the runner's status reads; snapshot() raises when told to."""

    def __init__(self, snap: DaemonSnapshot, *, broken: bool = False) -> None:
        self.snap = snap
        self.broken = broken
        self.last_loop_time = 0.0  # never turned: no loop age
        self.stats: dict[str, Any] = dict(snap.stats)

    @property
    def consumer(self) -> Consumer:
        raise AssertionError("not read by status()")

    def snapshot(self) -> DaemonSnapshot:
        if self.broken:
            raise RuntimeError("boom")
        return self.snap

    def health(self) -> tuple[str, list[str]]:
        return self.snap.health, list(self.snap.reasons)

    async def start(self) -> None: ...

    async def run(self, shutdown: Awaitable[None] | None = None) -> None: ...

    async def stop(self, timeout: float | None = None) -> None: ...

    async def reload(self, config: MqdConfig) -> None: ...

    def pause(self, tps: Iterable[Any]) -> None: ...

    def resume(self, tps: Iterable[Any]) -> None: ...


def merged_before(runner: Runner, daemon: FakeDaemon) -> dict[str, Any]:
    """The runner's status as it was built before the snapshot: the daemon's status dict merged by
    key, its ``reasons`` dropped, ``state`` and ``health`` overwritten in place."""
    out: dict[str, Any] = {}
    try:
        out.update(daemon.snapshot().status_json())
    except Exception as exc:
        out["status_error"] = f"{type(exc).__name__}: {exc}"
    out.setdefault("stats", dict(daemon.stats))
    out.pop("reasons", None)
    if runner._state != RunnerState.RUNNING or "state" not in out:
        out["state"] = runner._state
    health, reasons = runner.health()
    out["health"] = {"status": health, "reasons": reasons}
    return out


@pytest.mark.parametrize("state", [RunnerState.RUNNING, RunnerState.RELOADING, RunnerState.STARTING])
@pytest.mark.parametrize("broken", [False, True])
def test_the_status_json_is_the_one_the_merge_made(tmp_path: Path, state: RunnerState, broken: bool) -> None:
    daemon = FakeDaemon(SNAP, broken=broken)
    runner = Runner(tmp_path / "mqd.toml", MqdConfig(), daemon=daemon)
    runner._set_state(state)
    got = runner.status()
    runner_section = got.pop("runner")
    assert list(got) == list(merged_before(runner, daemon))
    assert json.dumps(got) == json.dumps(merged_before(runner, daemon))
    assert runner_section["config_file"] == str(tmp_path / "mqd.toml")
    assert list(runner.status())[-1] == "runner"


def test_the_sections_are_json_in_their_order() -> None:
    sections = SNAP.sections_json()
    assert list(sections) == [
        "burst",
        "uptime_s",
        "last_loop_age_s",
        "consumer",
        "landing",
        "user_paused",
        "subscription",
        "stats",
        "errors",
    ]
    assert sections["uptime_s"] == 12.346 and sections["last_loop_age_s"] == 0.012
    assert sections["landing"] == {
        "dir": "/landing",
        "pending_records": 3,
        "files": 2,
        "error": "disk full",
        "paused_for_disk": ["events/0", "events/1"],
        "chain_broken": {"events/2": "events/2/claims/7"},
        "table": None,
    }
    assert list(SNAP.status_json())[:3] == ["state", "health", "reasons"]
    json.dumps(SNAP.status_json())  # JSON at the edge: nothing left that is not


def test_without_a_daemon_the_runner_says_its_own_state(tmp_path: Path) -> None:
    runner = Runner(tmp_path / "mqd.toml", MqdConfig())
    st = runner.status()
    assert list(st) == ["state", "health", "runner"]
    assert st["state"] == "starting" and st["health"] == {
        "status": "degraded",
        "reasons": ["daemon is starting"],
    }


def test_a_built_daemon_says_the_same_keys() -> None:
    """A real daemon, built and never started (no I/O): its status JSON's keys and their order."""
    from mqd.process.daemon import Daemon

    daemon = Daemon(MqdConfig())
    snap = daemon.snapshot()
    assert snap.state == DaemonState.CREATED and snap.consumer is None and snap.uptime_s is None
    status = daemon.status()
    assert list(status) == [
        "state",
        "health",
        "reasons",
        "burst",
        "uptime_s",
        "last_loop_age_s",
        "consumer",
        "landing",
        "user_paused",
        "subscription",
        "stats",
        "errors",
    ]
    assert list(status["landing"])[-4:] == ["error", "paused_for_disk", "chain_broken", "table"]
    assert status["stats"] == daemon.stats and status["consumer"] is None
    json.dumps(status)
