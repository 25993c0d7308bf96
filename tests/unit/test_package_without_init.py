"""prometheus_client's submodules without its package ``__init__`` in the mqd command
(mqd/package_without_init.py): run as a script named ``mqd``, mqd's metrics import without the
client's HTTP servers; a name only the package's ``__init__`` defines still works at its first
access (the ``__init__`` then runs, once, on the same module) and scrapes mqd's registry. Outside
the command the package imports whole, as it always did. (aiokafka's registration:
tests/unit/sources/kafka/test_aiokafka_import.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = """
import json, sys
import mqd.metrics
servers = sorted(m for m in ("prometheus_client.exposition", "http.server") if m in sys.modules)
import prometheus_client
from prometheus_client import generate_latest, Counter
print(json.dumps({
    "servers_before": servers,
    "same_counter": Counter is mqd.metrics.Counter,
    "same_module": sys.modules["prometheus_client"] is prometheus_client,
    "scraped": b"mqd_build_info" in generate_latest(mqd.metrics.REGISTRY),
}))
"""


def _probe(script: Path) -> dict[str, object]:
    script.write_text(PROBE)
    done = subprocess.run([sys.executable, str(script), "run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_mqd_command_imports_the_metrics_without_prometheus_clients_servers(tmp_path: Path) -> None:
    got = _probe(tmp_path / "mqd")
    assert got == {"servers_before": [], "same_counter": True, "same_module": True, "scraped": True}


def test_elsewhere_prometheus_client_imports_whole(tmp_path: Path) -> None:
    got = _probe(tmp_path / "app.py")
    assert got["servers_before"] == ["http.server", "prometheus_client.exposition"]
    assert got["scraped"] is True
