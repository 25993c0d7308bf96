"""``make screenshots``: the README's pictures of the views, taken from a real daemon under load.

Starts a broker cluster (:class:`mqd.testing.LocalCluster`) with a 4-partition topic, a producer
writing at a steady rate, and a daemon (``mqd start``) with one partition paused so the pictures show
lag, a state and throughput. Then it writes

- ``docs/img/status-page.png``: the admin page as headless chromium renders it (:mod:`mqd_dev.browser`),
- ``docs/img/top.svg`` and ``docs/img/top.txt``: one ``mqd top`` screen at 120 columns (rich's export),

and stops everything. Not part of the test suite (pictures are not assertions); run it when the
views change. ``python -m mqd_dev.screenshots --out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console

from mqd.operator.top import TopView
from mqd.testing import LocalCluster, to_toml
from mqd.waiting import wait_until_sync
from mqd_dev import browser

TOPIC = "events"
PARTITIONS = 4
RATE = 4000  # records/s: steady load the daemon keeps up with
WIDTH = 120


def _mqd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/status", timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _config(root: Path, bootstrap: str) -> Path:
    data = {
        "consumer": {
            "group": "landing",
            "client_id": "mqd-host-1",
            "bootstrap": [bootstrap],
            "topics": [TOPIC],
            "consume_from": "first",
        },
        "landing": {"dir": str(root / "landing"), "max_age": 1.0},
        "admin": {"port": 0},
        "log": {"level": "info", "format": "json"},
        "daemon": {
            "state_dir": str(root / "state"),
            "pid_file": str(root / "state" / "mqd.pid"),
            "log_file": str(root / "state" / "mqd.log"),
        },
    }
    path = root / "mqd.toml"
    path.write_text(to_toml(data))
    return path


def take(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mqd-screenshots-") as tmp:
        root = Path(tmp)
        with LocalCluster(root / "cluster", topics={TOPIC: PARTITIONS}) as cluster:
            produce = ["produce", "--bootstrap", cluster.bootstrap, "--topic", TOPIC]
            produce += ["--count", str(RATE * 600), "--rate", str(RATE), "--batch", "200"]
            producer = subprocess.Popen(
                [sys.executable, "-m", "mqd.operator.cli", *produce],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            cfg = _config(root, cluster.bootstrap)
            try:
                res = _mqd("start", "-c", str(cfg))
                if res.returncode != 0:
                    raise SystemExit(f"mqd start failed: {res.stdout}{res.stderr}")
                url = json.loads((root / "state" / "admin.json").read_text())["url"]
                wait_until_sync(
                    lambda: _status(url)["stats"]["records_published"] > RATE,
                    timeout=60,
                    what="a few seconds of records landed",
                )
                _mqd("pause", "-c", str(cfg), f"{TOPIC}:3")
                time.sleep(6)  # let the paused partition's lag and the rates build up (pictures only)
                view = TopView()
                view.sample(_status(url), time.monotonic())
                time.sleep(2)
                console = Console(record=True, width=WIDTH, file=io.StringIO())
                console.print(view.render(_status(url), WIDTH))
                # the same screen as text too, for terminals and diffs
                (out / "top.txt").write_text(console.export_text(clear=False))
                console.save_svg(str(out / "top.svg"), title="mqd top")
                browser.dump_dom(url + "/")  # a first load, so the page's throughput has two samples
                time.sleep(2)
                browser.screenshot(url + "/", out / "status-page.png", width=1280, height=560)
            finally:
                _mqd("stop", "-c", str(cfg), "--force")
                producer.kill()
                producer.wait()
    for name in ("status-page.png", "top.svg", "top.txt"):
        print(out / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    args = ap.parse_args()
    if browser.find_chromium() is None:
        raise SystemExit("chromium is not installed: apt-get install -y chromium")
    take(args.out)


if __name__ == "__main__":
    main()
