"""mqd.__version__ is written once, in mqd/__init__.py, and pyproject.toml reads it from there
(issue 34: no importlib.metadata lookup on the daemon's start path)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import mqd

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_distribution_has_the_packages_version() -> None:
    """What pip installed (its metadata) names the version the package says it is."""
    assert version("mqd") == mqd.__version__


def test_pyproject_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "mqd.__version__"}
