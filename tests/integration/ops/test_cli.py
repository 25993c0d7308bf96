"""The mqd command without a running daemon: config errors, exit codes, help text."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import REPO_ROOT

from mqd.operator.cli import main

ROOT = REPO_ROOT


def _cfg(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "mqd.toml"
    path.write_text(
        text + f'\n[daemon]\nstate_dir = "{tmp_path / "state"}"\npid_file = "{tmp_path / "mqd.pid"}"\n'
    )
    return path


def _run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_config_check_valid_files_exit_0() -> None:
    """Daemon, broker node and cluster files all check out, each named with its kind."""
    conf = ROOT / "config"
    code, out, _ = _run(
        "config",
        "check",
        str(conf / "mqd.toml"),
        str(conf / "single.toml"),
        str(conf / "cluster-single.toml"),
    )
    assert code == 0
    assert "mqd.toml: ok (daemon config)" in out
    assert "single.toml: ok (broker config)" in out
    assert "cluster-single.toml: ok (cluster config)" in out


def test_config_check_typo_wrong_type_missing_file_exit_2(tmp_path: Path) -> None:
    """Each bad file is reported on stderr with file and key path; the exit code is 2."""
    typo = tmp_path / "typo.toml"
    typo.write_text("[consumer]\nmax_queued_record = 10\n")
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[landing]\nmax_age = "5 parsecs"\n')  # "5s" is a duration (issue 17)
    code, out, err = _run(
        "config",
        "check",
        str(typo),
        str(wrong),
        str(tmp_path / "missing.toml"),
        str(ROOT / "config" / "mqd.toml"),
    )
    assert code == 2
    assert f"{typo}: invalid configuration" in err
    assert "consumer.max_queued_record: unknown key (did you mean 'max_queued_records'?)" in err
    assert f"{wrong}: invalid configuration" in err
    assert "landing.max_age: not a duration; use '500ms', '5s'" in err
    assert f"{tmp_path / 'missing.toml'}: config file not found" in err
    assert "mqd.toml: ok" in out  # the good file is still checked


def test_config_check_show_hides_secrets(tmp_path: Path) -> None:
    """--show prints the effective config (with MQD_* applied) but never a token."""
    path = _cfg(tmp_path, '[consumer]\nauth_token = "hunter2"\n')
    res = CliRunner().invoke(
        main, ["config", "check", "--show", str(path)], env={"MQD_CONSUMER__GROUP": "etl"}
    )
    assert res.exit_code == 0
    assert '"group": "etl"' in res.stdout and "hunter2" not in res.stdout and "<hidden>" in res.stdout


def test_run_with_invalid_config_exits_2_as_a_process(tmp_path: Path) -> None:
    """`mqd run` on a broken file exits 2 with the key path on stderr, before anything starts."""
    path = _cfg(tmp_path, "[consumer]\ntopics = 5\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "consumer.topics: Input should be a valid array (got 5)" in proc.stderr
    assert not (tmp_path / "mqd.pid").exists()


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    """Commands that need the config say which file is missing."""
    code, _, err = _run("run", "--config", str(tmp_path / "nope.toml"))
    assert code == 2 and "nope.toml: config file not found" in err


def test_status_stop_reload_when_not_running(tmp_path: Path) -> None:
    """status exits 3 (text and JSON), stop is a no-op success, reload and pause exit 3."""
    path = _cfg(tmp_path)
    code, out, _ = _run("status", "-c", str(path))
    assert code == 3 and "mqd is not running" in out
    code, out, _ = _run("status", "-c", str(path), "--json")
    assert code == 3 and '"state": "not running"' in out
    code, out, _ = _run("stop", "-c", str(path))
    assert code == 0 and "not running" in out
    assert _run("reload", "-c", str(path))[0] == 3
    assert _run("pause", "-c", str(path), "events:1")[0] == 3


def test_stale_pid_file_means_not_running(tmp_path: Path) -> None:
    """A pid file nobody holds (crash leftovers, even naming a live pid) is not a running daemon."""
    path = _cfg(tmp_path)
    (tmp_path / "mqd.pid").write_text("1\n")
    code, out, _ = _run("status", "-c", str(path))
    assert code == 3 and "not running" in out


def test_status_falls_back_to_raw_keys_when_the_file_broke(tmp_path: Path) -> None:
    """A daemon whose config file was broken after start can still be found and stopped."""
    path = _cfg(tmp_path, "[consumer]\nbogus = 1\n")
    code, out, err = _run("status", "-c", str(path))
    assert code == 3 and "warning:" in err and "consumer.bogus: unknown key" in err
    assert str(tmp_path / "mqd.pid") in out


def test_pause_refuses_bad_partition_spec(tmp_path: Path) -> None:
    """TOPIC[:PARTITION] is checked before any daemon is contacted (usage error: exit 2)."""
    code, _, err = _run("pause", "-c", str(_cfg(tmp_path)), "events:one")
    assert code == 2 and "bad partition" in err


@pytest.mark.parametrize(
    "command",
    [
        "run",
        "start",
        "stop",
        "status",
        "top",
        "reload",
        "pause",
        "resume",
        "config check",
        "broker",
        "produce",
        "spark",
    ],
)
def test_every_command_has_help_with_an_example(command: str) -> None:
    """--help works everywhere and shows at least one example."""
    code, out, _ = _run(*command.split(), "--help")
    assert code == 0
    assert "Example" in out, out


def test_start_reports_a_daemon_that_dies_at_start(tmp_path: Path) -> None:
    """`mqd start` waits for the child; when it exits (here: admin port taken) start exits 1 and
    shows the end of the daemon's log."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = _cfg(tmp_path, f'[admin]\nport = {port}\n[log]\nformat = "json"\n')
        proc = subprocess.run(
            [sys.executable, "-m", "mqd.operator.cli", "start", "--config", str(path), "--wait", "60"],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert proc.returncode == 1
    assert "mqd failed to start (exit code 1)" in proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert not (tmp_path / "mqd.pid").exists()
