"""The mqd wheel ships mqd and nothing else: no dev tooling (chaos harness, demo: devtools/mqd_dev),
no benchmarks, no tests; the supported testing API (mqd.testing) and the broker's OpenAPI file are in.

Builds the wheel with pip (build isolation: the same setuptools a release uses) from a copy of the
project tree, so a stale build/ folder of a working tree can neither hide nor fake a leak.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import REPO_ROOT

ROOT = REPO_ROOT
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "demo-data",
    "spark-warehouse",
)


@pytest.mark.timeout(180)
def test_wheel_holds_only_the_mqd_package(tmp_path: Path) -> None:
    """Every file of the built wheel is under mqd/ or its dist-info; none is a chaos, demo, dev,
    bench or test module; mqd.testing, mqd/broker/openapi.yaml and the PEP 561 marker mqd/py.typed are
    there."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)
    out = tmp_path / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("mqd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"mqd"}, sorted(top)
    leaked = [n for n in names if any(w in n for w in ("chaos", "demo", "mqd_dev", "bench", "tests/"))]
    assert not leaked, leaked
    assert "mqd/testing/__init__.py" in names and "mqd/testing/process.py" in names
    assert "mqd/broker/openapi.yaml" in names
    assert "mqd/spark/jvm/ProtobufDecode.java" in names  # the Protobuf decoder is built from it
    assert "mqd/testing/apicurio/pom.xml" in names  # SchemaRegistry builds from it
    assert "mqd/py.typed" in names  # without it, mypy users of mqd get "missing library stubs"
