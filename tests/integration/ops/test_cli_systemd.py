"""systemd units and their installer: substitution, reload type by systemd version, verification."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

from mqd.config import DaemonSection, load_daemon_config

ROOT = REPO_ROOT
MQD_BIN = str(Path(sys.executable).parent / "mqd")


def _install(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    dest = tmp_path / "root"
    full = {**os.environ, "DESTDIR": str(dest), "MQD_BIN": MQD_BIN, **env}
    proc = subprocess.run(
        ["sh", str(ROOT / "systemd" / "install.sh")], env=full, capture_output=True, text=True, timeout=60
    )
    return proc, dest


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


@pytest.mark.skipif(not os.path.exists(MQD_BIN), reason="mqd entry point not installed in this env")
def test_install_stages_units_and_config(tmp_path: Path) -> None:
    """install.sh fills in the mqd path, installs a config that points at the service's directories,
    and (where systemd-analyze exists) the units pass `systemd-analyze verify`."""
    proc, dest = _install(tmp_path, SYSTEMD_VERSION="252")
    assert proc.returncode == 0, proc.stderr
    units = dest / "etc" / "systemd" / "system"
    assert {p.name for p in units.iterdir()} == {
        "mqd.service",
        "mqd-broker@.service",
        "mqd-spark.service",
        "mqd-spark-once.service",
        "mqd-spark.timer",
    }
    for unit in units.iterdir():
        assert "@MQD@" not in unit.read_text()
    svc = _unit(units / "mqd.service")["Service"]
    assert svc["Type"] == "notify"
    assert svc["ExecStart"] == f"{MQD_BIN} run --config /etc/mqd/mqd.toml"
    assert svc["ExecReload"].startswith("/bin/kill -HUP")
    assert svc["KillMode"] == "mixed" and svc["DynamicUser"] == "yes" and svc["ProtectSystem"] == "strict"
    assert int(svc["WatchdogSec"]) > 0
    # the stop timeout must leave room for the drain
    assert int(svc["TimeoutStopSec"]) > DaemonSection().shutdown_timeout
    cfg = load_daemon_config(dest / "etc" / "mqd" / "mqd.toml", {})
    assert cfg.daemon.state_dir == Path("/var/lib/mqd")
    assert cfg.daemon.pid_file == Path("/run/mqd/mqd.pid")
    assert cfg.landing.dir == Path("/var/lib/mqd/landing")
    assert cfg.spark.output_dir == Path("/var/lib/mqd/warehouse/events")
    if shutil.which("systemd-analyze"):
        assert "units verified" in proc.stdout


@pytest.mark.skipif(not os.path.exists(MQD_BIN), reason="mqd entry point not installed in this env")
def test_new_systemd_gets_notify_reload(tmp_path: Path) -> None:
    """On systemd >= 253 the unit uses Type=notify-reload and drops the kill -HUP ExecReload."""
    proc, dest = _install(tmp_path, SYSTEMD_VERSION="254", VERIFY="0")
    assert proc.returncode == 0, proc.stderr
    svc = _unit(dest / "etc" / "systemd" / "system" / "mqd.service")["Service"]
    assert svc["Type"] == "notify-reload"
    assert "ExecReload" not in svc


@pytest.mark.skipif(not os.path.exists(MQD_BIN), reason="mqd entry point not installed in this env")
def test_existing_config_is_kept(tmp_path: Path) -> None:
    """A second install never overwrites an operator's config."""
    proc, dest = _install(tmp_path, VERIFY="0")
    assert proc.returncode == 0, proc.stderr
    conf = dest / "etc" / "mqd" / "mqd.toml"
    conf.write_text('[consumer]\ngroup = "mine"\n')
    proc, _ = _install(tmp_path, VERIFY="0")
    assert proc.returncode == 0 and "keeping existing" in proc.stdout
    assert conf.read_text() == '[consumer]\ngroup = "mine"\n'


def test_relative_mqd_bin_is_refused(tmp_path: Path) -> None:
    """systemd needs an absolute ExecStart: a relative MQD_BIN is an error, nothing is installed."""
    proc, dest = _install(tmp_path, MQD_BIN="bin/mqd", VERIFY="0")
    assert proc.returncode == 1 and "absolute path" in proc.stderr
    assert not dest.exists()


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None or not os.path.exists(MQD_BIN),
    reason="systemd-analyze or the mqd entry point not available",
)
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """A unit with an unknown key fails the installer's verification (systemd-analyze only warns)."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "systemd", tree / "systemd")
    (tree / "config").mkdir()
    shutil.copy(ROOT / "config" / "mqd.toml", tree / "config")
    unit = tree / "systemd" / "mqd.service"
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=mixed\nKilMode=oops"))
    proc = subprocess.run(
        ["sh", str(tree / "systemd" / "install.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "DESTDIR": str(tmp_path / "root"), "MQD_BIN": MQD_BIN},
        timeout=60,
    )
    assert proc.returncode == 1
    assert "KilMode" in proc.stderr and "verify failed" in proc.stderr
