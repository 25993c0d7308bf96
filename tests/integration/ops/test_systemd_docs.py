"""The units' ``Documentation=`` points at files the installer installs (``systemctl help mqd``)."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

MQD_BIN = str(Path(sys.executable).parent / "mqd")


def _documentation(unit: Path) -> list[str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(unit)
    return parser["Unit"].get("Documentation", "").split()


@pytest.mark.skipif(not os.path.exists(MQD_BIN), reason="mqd entry point not installed in this env")
@pytest.mark.parametrize("docdir", [None, "/opt/mqd/share/doc"])
def test_every_documentation_uri_is_an_installed_file(tmp_path: Path, docdir: str | None) -> None:
    """Staged with DESTDIR (and optionally DOCDIR), every unit names at least one document, each a
    file:// URI of a file the installer put there, with the README's own content."""
    dest = tmp_path / "root"
    env = {**os.environ, "DESTDIR": str(dest), "MQD_BIN": MQD_BIN, "VERIFY": "0", "SYSTEMD_VERSION": "252"}
    if docdir is not None:
        env["DOCDIR"] = docdir
    proc = subprocess.run(
        ["sh", str(REPO_ROOT / "systemd" / "install.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    units = sorted((dest / "etc" / "systemd" / "system").glob("mqd*"))
    assert len(units) == 5, units
    for unit in units:
        uris = _documentation(unit)
        assert uris, f"{unit.name} has no Documentation="
        for uri in uris:
            assert uri.startswith(f"file://{docdir or '/usr/share/doc/mqd'}/"), (unit.name, uri)
            path = dest / uri.removeprefix("file:///")
            assert path.is_file(), f"{unit.name}: {uri} is not installed"
    readme = dest / (docdir or "/usr/share/doc/mqd").lstrip("/") / "README.md"
    assert readme.read_text() == (REPO_ROOT / "README.md").read_text()
