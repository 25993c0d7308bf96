"""A tiny run of the pipeline benchmark (``python -m bench``): it still works end to end and reports
what it promises.

No timing thresholds: throughput only has to be measured (non-zero), and the mqd run has to land and
commit every record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO_ROOT

ROOT = REPO_ROOT
RECORDS = 6000


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bench_smoke_run_reports_every_part(tmp_path: Path) -> None:
    """`python -m bench --smoke` exits 0 and writes JSON + Markdown with machine facts, non-zero produce,
    sink-ceiling and (where installed) alternative throughput, and, once the daemon exists, an mqd
    run that landed and committed all records plus latency and memory figures."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--records",
            str(RECORDS),
            "--smoke",
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    result = json.loads((out / "smoke.json").read_text())
    table = (out / "smoke.md").read_text()
    assert "| pipeline | records/s |" in table

    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["versions"]["pyarrow"]
    assert result["config"]["records"] == RECORDS
    assert result["produce"]["records"] == RECORDS and result["produce"]["records_per_s"] > 0
    assert result["sink_ceiling"]["records"] == RECORDS and result["sink_ceiling"]["records_per_s"] > 0

    alt = result["alternative"]
    if "skipped" not in alt:
        for consumer in alt["consumers"]:
            if "error" in consumer:
                assert "not installed" in consumer["error"], consumer
                continue
            assert consumer["records"] == RECORDS and consumer["records_per_s"] > 0

    mqd = result["mqd"]
    if "skipped" in mqd:
        pytest.skip(f"mqd part not run: {mqd['skipped']}")
    assert mqd["complete"] and mqd["records"] == RECORDS
    assert mqd["committed"] == RECORDS
    assert mqd["records_per_s"] > 0 and mqd["cpu_s"] > 0 and mqd["peak_rss_mb"] > 0
    assert mqd["fetch_requests"] > 0 and mqd["records_per_request"] > 0
    assert mqd["time_to_first_file_s"] is not None
    for row in alt.get("consumers", []):
        if "records_per_s" in row:
            assert row["ratio_to_mqd"] > 0
    latency = result["latency"]
    assert latency["records"] > 0 and 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    memory = result["memory"]
    assert memory["peak_rss_mb"] > 0 and isinstance(memory["under_budget"], bool)
