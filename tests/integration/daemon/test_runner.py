"""mqd as a service, end to end: real brokers, the daemon as a real process driven by the CLI,
signals, reload, sd_notify, and exactly-once landing across a stop under load."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from support.cli import SHUTDOWN_TIMEOUT, mqd, produce, write_config
from support.harness import Cluster
from support.landing import read_manifest

from mqd.operator.cli import main
from mqd.waiting import wait_until_sync


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in this process (no interpreter start-up); the daemon it talks to is still real."""
    res = CliRunner().invoke(main, list(args))
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def status(state_dir: Path) -> dict[str, Any] | None:
    """The running daemon's /status, or None while it has no admin endpoint yet."""
    try:
        info = json.loads((state_dir / "admin.json").read_text())
        with urllib.request.urlopen(f"{info['url']}/status", timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data
    except (OSError, ValueError, KeyError):
        return None


def published(state_dir: Path) -> int:
    st = status(state_dir)
    return int(((st or {}).get("stats") or {}).get("records_published", 0))


def assert_exactly_once(landing: Path, total: int) -> None:
    """Every partition's files hold offsets 0..n-1 once each, and all partitions add up to ``total``."""
    ranges: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for r in read_manifest(landing):
        ranges[(r.topic, r.partition)].append((r.first_offset, r.last_offset))
    landed = 0
    for tp, rs in ranges.items():
        rs.sort()
        expect = 0
        for first, last in rs:
            assert first == expect, f"{tp}: gap or overlap at {first}, expected {expect}"
            expect = last + 1
        landed += expect
    assert landed == total


@pytest.fixture
def cluster(cluster_factory: Callable[..., Cluster]) -> Cluster:
    return cluster_factory(topics={"events": 4})


@pytest.fixture
def cleanup_pids() -> Iterator[list[int]]:
    """Pids of daemons a test started; SIGKILLed at teardown if a failed test left them running."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_cli_start_status_pause_stop_round_trip(
    tmp_path: Path, cluster: Cluster, cleanup_pids: list[int]
) -> None:
    """start detaches and waits until up; status reports healthy (0) with the landed records; pause
    reaches the daemon; stop drains and reports a clean exit; then status says not running (3)."""
    produce(cluster, 2000)
    cfg = write_config(tmp_path, cluster)
    state = tmp_path / "state"
    res = mqd("start", "-c", str(cfg))
    assert res.returncode == 0, res.stderr + (state / "mqd.log").read_text()
    pid = int((state / "mqd.pid").read_text())
    cleanup_pids.append(pid)
    assert f"mqd started (pid {pid})" in res.stdout
    assert cli("start", "-c", str(cfg)).stdout.startswith(f"mqd is already running (pid {pid})")

    wait_until_sync(lambda: published(state) == 2000, timeout=30, what="2000 records landed")
    res = mqd("status", "-c", str(cfg))
    assert res.returncode == 0, res.stdout
    assert "mqd is running: ok" in res.stdout and "4 partitions assigned" in res.stdout
    res = cli("status", "-c", str(cfg), "--json")
    assert res.returncode == 0 and json.loads(res.stdout)["runner"]["pid"] == pid

    res = cli("pause", "-c", str(cfg), "events:1")
    assert res.returncode == 0 and "paused: events:1" in res.stdout, res.stderr
    st = status(state)
    assert st is not None and st["consumer"]["assignment"]["events/1"]["paused"] is True
    res = cli("top", "-c", str(cfg), "--iterations", "1")
    assert res.returncode == 0 and "paused" in res.stdout and "4 partitions  lag" in res.stdout
    assert cli("resume", "-c", str(cfg), "events").returncode == 0

    res = mqd("stop", "-c", str(cfg))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "mqd stopped cleanly" in res.stdout
    res = mqd("status", "-c", str(cfg))
    assert res.returncode == 3 and "last exit: code 0" in res.stdout
    assert not (state / "mqd.pid").exists() and not (state / "admin.json").exists()
    assert_exactly_once(tmp_path / "landing", 2000)


def test_reload_valid_change_applies_and_invalid_file_is_refused(
    tmp_path: Path, cluster: Cluster, cleanup_pids: list[int]
) -> None:
    """A valid change is applied in place; an invalid file is refused (the CLI exits 2 before
    signalling; a raw SIGHUP leaves the daemon on its old config, degraded, and it recovers)."""
    cfg = write_config(tmp_path, cluster)
    state = tmp_path / "state"
    assert cli("start", "-c", str(cfg)).returncode == 0
    pid = int((state / "mqd.pid").read_text())
    cleanup_pids.append(pid)

    good = cfg.read_text().replace('level = "info"', 'level = "warning"')
    good = good.replace("max_age = 0.3", "max_age = 0.2")
    cfg.write_text(good)
    res = cli("reload", "-c", str(cfg))
    assert res.returncode == 0 and "config reloaded" in res.stdout, res.stderr
    produce(cluster, 400)
    wait_until_sync(lambda: published(state) == 400, timeout=30, what="records landed after the reload")

    cfg.write_text(good.replace("[consumer]", "[consumer]\nmax_queued_recods = 5"))
    res = cli("reload", "-c", str(cfg))
    assert res.returncode == 2 and "consumer.max_queued_recods: unknown key" in res.stderr
    os.kill(pid, signal.SIGHUP)  # what systemd's ExecReload does, without the CLI's check
    st = wait_until_sync(
        lambda: (s := status(state)) and s["runner"]["reload"]["count"] == 2 and s,
        timeout=15,
        what="refused reload",
    )
    assert st["runner"]["reload"]["ok"] is False
    assert "max_queued_recods" in st["runner"]["reload"]["error"]
    res = cli("status", "-c", str(cfg))  # the broken file only degrades; status reads what it can
    assert res.returncode == 1 and "invalid; running the previous config" in res.stdout

    produce(cluster, 100)  # still consuming with the old config
    wait_until_sync(lambda: published(state) == 500, timeout=30, what="records landed on the old config")

    cfg.write_text(good.replace("[admin]\n", '[admin]\nhost = "127.0.0.2"\n'))
    res = cli("reload", "-c", str(cfg))
    assert res.returncode == 1 and "admin cannot change on reload" in res.stderr

    cfg.write_text(good)
    assert cli("reload", "-c", str(cfg)).returncode == 0
    assert cli("status", "-c", str(cfg)).returncode == 0
    assert cli("stop", "-c", str(cfg)).returncode == 0
    log_lines = [
        json.loads(line) for line in (state / "mqd.log").read_text().splitlines() if line.startswith("{")
    ]
    events = [x["event"] for x in log_lines]
    reloaded = next(x for x in log_lines if x["event"] == "config reloaded" and x["logger"] == "mqd.runner")
    assert reloaded["changed"] == ["landing.max_age", "log.level"]
    assert "reload refused: keeping the running config" in events
    # the reloaded level (warning) took effect: the info lines of the stop are gone
    assert "mqd running" in events and "daemon stopped" not in events and "mqd stopped" not in events
    assert_exactly_once(tmp_path / "landing", 500)


def test_sigterm_under_load_drains_in_time_and_loses_nothing(
    tmp_path: Path, cluster: Cluster, cleanup_pids: list[int]
) -> None:
    """SIGTERM while records stream in: the daemon exits 0 within shutdown_timeout; a burst run
    afterwards lands the rest; every produced record is landed exactly once."""
    total = 30_000
    cfg = write_config(tmp_path, cluster, landing={"max_age": 1.0})
    state = tmp_path / "state"
    with open(tmp_path / "run.log", "wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    cleanup_pids.append(daemon.pid)
    producer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mqd.operator.cli",
            "produce",
            "--bootstrap",
            cluster.bootstrap,
            "--topic",
            "events",
            "--count",
            str(total),
            "--rate",
            "10000",
            "--batch",
            "100",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_sync(lambda: published(state) > 0, timeout=30, what="first records landed")
        assert producer.poll() is None, "the producer should still be running (stop under load)"
        t0 = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=SHUTDOWN_TIMEOUT + 10)
        took = time.monotonic() - t0
    finally:
        _, err = producer.communicate(timeout=60)
    assert producer.returncode == 0, err
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert took < SHUTDOWN_TIMEOUT + 5  # a correctness bound (drain deadline), not a speed target
    last = json.loads((state / "last_exit.json").read_text())
    assert last["clean"] and last["pid"] == daemon.pid
    stopped_with = last["stats"]["records_published"]
    assert 0 < stopped_with

    res = mqd("run", "-c", str(cfg), "--burst", timeout=90)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_exactly_once(tmp_path / "landing", total)


def test_sd_notify_lifecycle_and_single_instance(
    tmp_path: Path, cluster: Cluster, cleanup_pids: list[int]
) -> None:
    """Under a (simulated) service manager on an @abstract socket: READY with MAINPID, STATUS lines,
    WATCHDOG pings while working, RELOADING+MONOTONIC_USEC then READY on SIGHUP, STOPPING on SIGTERM.
    A second daemon on the same config refuses to start."""
    cfg = write_config(tmp_path, cluster)
    name = f"mqd-test-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(0.2)
    messages: list[dict[str, str]] = []

    def receive_until(pred: Callable[[dict[str, str]], bool], timeout: float = 20) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                raw = sock.recv(4096).decode()
            except TimeoutError:
                continue
            msg = dict(line.split("=", 1) for line in raw.split("\n"))
            messages.append(msg)
            if pred(msg):
                return msg
        raise TimeoutError(f"no matching sd_notify message; got {messages}")

    env = {**os.environ, "NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "1000000"}
    with open(tmp_path / "run.log", "wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    cleanup_pids.append(daemon.pid)
    try:
        ready = receive_until(lambda m: m.get("READY") == "1")
        assert ready["MAINPID"] == str(daemon.pid) and "events" in ready["STATUS"]
        receive_until(lambda m: "WATCHDOG" in m)
        receive_until(lambda m: "published" in m.get("STATUS", ""))

        second = mqd("run", "-c", str(cfg))
        assert second.returncode == 1 and "already running" in second.stderr

        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        daemon.send_signal(signal.SIGHUP)
        reloading = receive_until(lambda m: m.get("RELOADING") == "1")
        assert int(reloading["MONOTONIC_USEC"]) >= before
        receive_until(lambda m: m.get("READY") == "1")

        daemon.send_signal(signal.SIGTERM)
        receive_until(lambda m: m.get("STOPPING") == "1")
        assert daemon.wait(timeout=SHUTDOWN_TIMEOUT + 10) == 0
    finally:
        sock.close()
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)


def test_second_sigterm_forces_exit_and_nothing_is_lost(
    tmp_path: Path, cluster: Cluster, cleanup_pids: list[int]
) -> None:
    """A drain stuck on a frozen broker is cut short by a second SIGTERM (exit 130, recorded as not
    clean); a later run resumes from the landing directory and every record lands exactly once."""
    produce(cluster, 1000)
    cfg = write_config(
        tmp_path,
        cluster,
        landing={"max_age": 60.0},
        consumer={"request_timeout": 30.0, "session_timeout": 3.0},
    )
    state = tmp_path / "state"
    run_log = tmp_path / "run.log"
    with open(run_log, "wb") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "run", "-c", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    cleanup_pids.append(daemon.pid)
    master = cluster.master(0)
    try:
        wait_until_sync(
            lambda: ((status(state) or {}).get("landing") or {}).get("pending_records") == 1000,
            timeout=30,
            what="1000 records buffered, none published (max_age 60 s)",
        )
        cluster.send_signal(master, signal.SIGSTOP)  # the final commit now hangs
        daemon.send_signal(signal.SIGTERM)
        wait_until_sync(lambda: "stopping: draining" in run_log.read_text(), timeout=10, what="drain started")
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(timeout=15)  # well before the 30 s request timeout the drain waits on
    finally:
        cluster.send_signal(master, signal.SIGCONT)
    assert code == 130, run_log.read_text()[-3000:]
    last = json.loads((state / "last_exit.json").read_text())
    assert last["clean"] is False and last["reason"] == "forced by a second SIGTERM"
    assert not (state / "mqd.pid").exists()

    # another group: its position can only come from the landing directory, the source of truth
    res = mqd(
        "run",
        "-c",
        str(cfg),
        "--burst",
        env={"MQD_CONSUMER__GROUP": "recovery", "MQD_LANDING__MAX_AGE": "0.3"},
        timeout=90,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert_exactly_once(tmp_path / "landing", 1000)


def test_stop_reports_a_drain_past_its_timeout_and_a_second_stop_forces(
    tmp_path: Path, cluster: Cluster, cleanup_pids: list[int]
) -> None:
    """`mqd stop --timeout` reports a daemon still draining (exit 1); a second `mqd stop` is the
    second SIGTERM: the daemon exits at once and stop reports the forced exit."""
    produce(cluster, 200)
    cfg = write_config(tmp_path, cluster, landing={"max_age": 60.0}, consumer={"request_timeout": 30.0})
    state = tmp_path / "state"
    assert cli("start", "-c", str(cfg)).returncode == 0
    cleanup_pids.append(int((state / "mqd.pid").read_text()))
    wait_until_sync(
        lambda: ((status(state) or {}).get("landing") or {}).get("pending_records") == 200,
        timeout=30,
        what="200 records buffered",
    )
    master = cluster.master(0)
    cluster.send_signal(master, signal.SIGSTOP)  # the drain's commit hangs
    try:
        res = cli("stop", "-c", str(cfg), "--timeout", "1")
        assert res.returncode == 1 and "is still running after 1s" in res.stderr
        res = cli("stop", "-c", str(cfg), "--timeout", "10")
        assert res.returncode == 1
        assert "mqd stopped with exit code 130: forced by a second SIGTERM" in res.stderr
    finally:
        cluster.send_signal(master, signal.SIGCONT)
    assert cli("status", "-c", str(cfg)).returncode == 3
