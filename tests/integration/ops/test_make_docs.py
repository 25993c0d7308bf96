"""`make docs`: the API reference is generated from the docstrings of every mqd module, with the
reStructuredText roles the docstrings use turned into links."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_docs_renders_every_module(tmp_path: Path) -> None:
    """The target (run with this interpreter's venv, without re-running `make install`) writes one
    page per module and subpackage, the library's entry points are documented, no module failed to
    import, and no rendered docstring shows a raw ``:class:`` role."""
    out = tmp_path / "docs"
    res = subprocess.run(
        ["make", "-s", "-o", "install", "docs", f"BIN={Path(sys.executable).parent}", f"DOCS_DIR={out}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Couldn't import" not in res.stderr and "Error importing" not in res.stderr, res.stderr
    modules = {p.stem for p in (REPO_ROOT / "mqd").glob("*.py")} - {"__init__"}
    packages = {p.parent.name for p in (REPO_ROOT / "mqd").glob("*/__init__.py")}
    pages = {p.stem for p in (out / "mqd").glob("*.html")}
    assert modules | packages <= pages, sorted((modules | packages) - pages)
    assert (out / "index.html").is_file() and (out / "mqd" / "spark" / "job.html").is_file()
    consumer = (out / "mqd" / "consumer.html").read_text()
    assert 'id="Consumer.fetched_batches"' in consumer and 'id="Consumer.mark_consumed"' in consumer
    producer = (out / "mqd" / "wire" / "producer.html").read_text()
    assert 'id="Producer.send_batch"' in producer
    for page in (out / "mqd").rglob("*.html"):
        docstrings = re.findall(r'<div class="docstring">(.*?)</div>', page.read_text(), re.S)
        raw = [d for d in docstrings if re.search(r":(class|meth|func|data):`", d)]
        assert not raw, f"{page.name}: {raw[0][:200]}"
