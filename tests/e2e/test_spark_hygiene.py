"""The Spark job as an operator meets it (issue 17, "Spark job hygiene"): `mqd spark` as its own
process with stderr not a terminal, as under systemd. An unreachable master ends it in one line
with exit 75 within seconds; a run prints no console progress bars and no log4j INFO chatter, and
names its query ``mqd-<table>`` in every line; `mqd config check` refuses what Spark would; the
timer and its oneshot unit install next to the streaming unit."""

from __future__ import annotations

import configparser
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support import REPO_ROOT
from support.cli import mqd

from mqd.landing import LocalStore, Publisher
from mqd.spark.session import EXIT_SESSION
from mqd.spark.static_checks import trigger_interval
from mqd.waiting import wait_until_sync
from mqd.wire import format as fmt

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MQD_BIN = str(Path(sys.executable).parent / "mqd")


def _config(tmp_path: Path, **spark: str) -> Path:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in spark.items())
    path = tmp_path / "mqd.toml"
    path.write_text(
        f'[landing]\ndir = "{tmp_path / "landing"}"\n'
        f'[spark]\noutput_dir = "{tmp_path / "events"}"\ncheckpoint_dir = "{tmp_path / "ckpt"}"\n'
        f'quarantine_dir = "{tmp_path / "quarantine"}"\n{extra}'
    )
    return path


def _land(root: Path, partitions: int, files: int, records: int) -> int:
    """``files`` files of ``records`` records into each partition of topic ``events``."""
    pub = Publisher(LocalStore(root))
    pub.store.open()
    for p in range(partitions):
        for f in range(files):
            values = [b"v%d" % i for i in range(records)]
            ts = np.full(records, T0 + f * 3_600_000, dtype=np.int64)
            raw = fmt.encode_batch(values, timestamps=ts, base_offset=f * records)
            batch = fmt.to_arrow(raw, fmt.scan(raw)[0])
            pub.publish("events", p, pa.Table.from_batches([batch]), pub.store.head("events", p).last_offset)
    return partitions * files * records


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_unreachable_master_is_one_line_and_exit_75_at_once(tmp_path: Path) -> None:
    """`--master spark://127.0.0.1:1` (nothing listens) ends the job within seconds, not Spark's
    3 x 20 s, with exit 75 and a single error line naming the master, and no Java trace."""
    _land(tmp_path / "landing", 1, 1, 10)
    t0 = time.monotonic()
    res = mqd("spark", "-c", str(_config(tmp_path)), "--once", "--master", "spark://127.0.0.1:1", timeout=60)
    took = time.monotonic() - t0
    assert res.returncode == EXIT_SESSION == 75, res.stderr
    lines = (res.stdout + res.stderr).splitlines()
    assert len(lines) == 1, lines
    (line,) = _json_lines(lines[0])
    assert line["event"] == "spark_session_failed" and line["level"] == "error"
    assert "spark://127.0.0.1:1" in line["error"] and line["query"] == "mqd-events"
    assert took < 30, took  # a Python start under load; Spark's own retries take 60 s


def test_master_from_the_config_is_checked_the_same_way(tmp_path: Path) -> None:
    """The config's `spark.master` gets the same check; a bad `--master` string is exit 2, one line."""
    _land(tmp_path / "landing", 1, 1, 10)
    res = mqd("spark", "-c", str(_config(tmp_path, master="spark://127.0.0.1:1")), "--once", timeout=60)
    assert res.returncode == 75 and len((res.stdout + res.stderr).splitlines()) == 1, res.stderr
    res = mqd("spark", "-c", str(_config(tmp_path)), "--once", "--master", "yarn-cluster-nope", timeout=60)
    assert res.returncode == 2, res.stderr
    (line,) = _json_lines(res.stdout + res.stderr)
    assert line["event"] == "spark_master_invalid" and "yarn-cluster-nope" in line["error"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("master", "yarn-cluster-nope"),
        ("trigger_interval", "ten seconds"),
        ("partition_by", ["topic", "day"]),
    ],
)
def test_config_check_refuses_what_the_job_would(tmp_path: Path, key: str, value: Any) -> None:
    """`mqd config check` exits 2 naming the key and the file for values that used to pass the
    check and fail only when the Spark job started."""
    path = tmp_path / "mqd.toml"
    path.write_text(f"[spark]\n{key} = {json.dumps(value)}\n")
    res = mqd("config", "check", str(path))
    assert res.returncode == 2, res.stdout
    assert f"spark.{key}" in res.stderr and str(path) in res.stderr


@pytest.mark.spark
def test_a_run_off_a_tty_prints_no_progress_bars_and_one_query_name(tmp_path: Path) -> None:
    """`mqd spark --once` with stdout and stderr piped (as in the journal): every record lands, the
    output has no `[Stage` progress text, no log4j INFO lines, and every job line names the query
    `mqd-events`, the name Spark reports too."""
    total = _land(tmp_path / "landing", 4, 10, 2000)  # 40 files: stages long enough for a bar
    res = mqd("spark", "-c", str(_config(tmp_path)), "--once", timeout=300, env={"TERM": "xterm"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "[Stage" not in out, out[-4000:]
    assert " INFO " not in out and "Setting default log level" not in out, out[-4000:]
    lines = [j for j in _json_lines(out) if j.get("logger") == "mqd.spark"]
    assert {j["event"] for j in lines} >= {"spark_query_started", "spark_query_done"}
    assert {j.get("query") for j in lines} == {"mqd-events"}, lines
    done = next(j for j in lines if j["event"] == "spark_query_done")
    assert done["rows"] == total


def _ui_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.mark.spark
def test_streaming_run_serves_the_ui_when_asked_and_stops_on_sigterm(tmp_path: Path) -> None:
    """`spark.ui = true` turns the Spark UI on (it is off by default) for the long-running job; the
    streaming query runs under its one name and SIGTERM stops it with exit 0."""
    _land(tmp_path / "landing", 1, 2, 100)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _config(tmp_path, trigger_interval="1s")
    cfg.write_text(cfg.read_text() + f"ui = true\nui_port = {port}\n")
    log = tmp_path / "spark.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mqd.operator.cli", "spark", "-c", str(cfg)], stdout=out, stderr=out
        )
    try:
        wait_until_sync(lambda: "spark_query_started" in log.read_text(), 240, "the streaming query")
        wait_until_sync(lambda: _ui_answers(port), 60, f"the Spark UI on port {port}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = log.read_text()
    assert "[Stage" not in text
    assert {j.get("query") for j in _json_lines(text) if j.get("logger") == "mqd.spark"} == {"mqd-events"}


@pytest.mark.spark
def test_trigger_interval_check_agrees_with_spark(spark: Any) -> None:
    """For each sample, mqd's static check and Spark's own trigger parser agree on accept/refuse
    (what the check passes on, in mqd's normalised form, Spark takes)."""
    df = spark.readStream.format("rate").load()
    samples = ["10 seconds", "1 minute 30 seconds", "interval 2 hours", "0 seconds", "1.5 seconds"]
    samples += ["500ms", "5s", "2m", "1h", "ten seconds", "1 month", "5 parsecs", "-5 seconds", "10"]
    for text in samples:
        try:
            spark_text = trigger_interval(text)
            ours = True
        except ValueError:
            spark_text, ours = text, False
        try:
            df.writeStream.trigger(processingTime=spark_text)
            theirs = True
        except Exception:  # Spark's parse errors come as several types
            theirs = False
        assert ours == theirs, (text, ours, theirs)


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


def _install(tmp_path: Path, version: str, verify: str) -> Path:
    dest = tmp_path / "root"
    env = {
        **os.environ,
        "DESTDIR": str(dest),
        "MQD_BIN": MQD_BIN,
        "SYSTEMD_VERSION": version,
        "VERIFY": verify,
    }
    proc = subprocess.run(
        ["sh", str(REPO_ROOT / "systemd" / "install.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return dest / "etc" / "systemd" / "system"


@pytest.mark.skipif(not os.path.exists(MQD_BIN), reason="mqd entry point not installed in this env")
def test_timer_runs_the_job_once_and_the_unit_backs_off(tmp_path: Path) -> None:
    """install.sh installs mqd-spark.timer, which starts a oneshot `mqd spark --once` that cannot
    run beside the streaming unit; the streaming unit restarts on exit 75 but not on 2, with a
    growing delay where systemd has one (>= 254) and a flat one before (the units verify on 252)."""
    units = _install(tmp_path / "old", "252", "1")
    timer = _unit(units / "mqd-spark.timer")
    once = _unit(units / timer["Timer"]["Unit"])
    assert once["Service"]["Type"] == "oneshot"
    assert once["Service"]["ExecStart"] == f"{MQD_BIN} spark --once --config /etc/mqd/mqd.toml"
    assert "mqd-spark.service" in once["Unit"]["Conflicts"]
    stream = _unit(units / "mqd-spark.service")["Service"]
    assert stream["Restart"] == "on-failure" and stream["RestartPreventExitStatus"] == "2"
    assert "RestartSteps" not in stream
    stream = _unit(_install(tmp_path / "new", "256", "0") / "mqd-spark.service")["Service"]
    assert int(stream["RestartSteps"]) > 0 and stream["RestartMaxDelaySec"]
