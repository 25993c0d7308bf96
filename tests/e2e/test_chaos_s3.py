"""Chaos on an object-store landing (``python -m mqd_dev.chaos --landing s3``, issue 15).

The plan on S3 draws the gateway faults and never the landing-disk kinds or ``lock_freeze`` (they
need a local directory); a local plan never draws the gateway faults, so local seeds plan what they
planned before. The short run is the in-``make test`` version of ``make chaos LANDING=s3``: real
brokers, two real daemons publishing through two SeaweedFS gateways, two seeded rounds of SIGKILL
and SIGSTOP of daemons and of a gateway; every acknowledged record must be in the store's visible
files exactly once, and the manifest must list exactly the visible files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mqd_dev.chaos.runner import ALL_KINDS, STORE_KINDS, ChaosOptions, ChaosRun, expand_kinds
from mqd_dev.chaos.s3_landing import NOT_ON_S3
from support import REPO_ROOT

_KINDS = "daemon_kill,daemon_freeze,gateway_freeze,gateway_kill,master_kill,net_reset"


def test_s3_plans_draw_gateway_faults_and_no_disk_or_lock_faults(tmp_path: Path) -> None:
    """Over 200 planned rounds from every kind, an s3 run draws both gateway kinds and none of the
    kinds that need a local landing; a local run (disk faults available) never draws a gateway kind."""

    def kinds(landing: str) -> set[str]:
        run = ChaosRun(ChaosOptions(root=tmp_path, seed=5, faults_per_round=4, landing=landing))
        run.disk.available = landing == "local"
        return {k for _ in range(200) for k in run._plan_round()[0]}

    on_s3 = kinds("s3")
    assert set(STORE_KINDS) <= on_s3 and not on_s3 & set(NOT_ON_S3)
    local = kinds("local")
    assert not local & set(STORE_KINDS) and set(NOT_ON_S3) <= local
    assert set(STORE_KINDS) <= set(ALL_KINDS)


def test_unknown_landing_is_refused(tmp_path: Path) -> None:
    """``landing`` is local or s3; anything else is a bad option, named."""
    with pytest.raises(ValueError, match="landing is local or s3"):
        ChaosRun(ChaosOptions(root=tmp_path, landing="gcs"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_short_s3_chaos_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """Two seeded rounds on s3:// (seed 130: a daemon SIGSTOPped past its session + connection
    resets + the second gateway SIGKILLed and restarted; a daemon SIGKILLed + the second gateway
    SIGSTOPped): every acknowledged record is in the store's visible files exactly once, manifest
    and visible files agree, no daemon or node crashed, every round recovered."""
    run = ChaosRun(
        ChaosOptions(
            root=tmp_path,
            seed=130,
            rounds=2,
            faults_per_round=3,
            landing="s3",
            kinds=expand_kinds(_KINDS),
            hold_min=1.5,
            hold_max=3,
        )
    )
    planned = [run._plan_round()[0] for _ in range(2)]
    assert planned == [["daemon_freeze", "net_reset", "gateway_kill"], ["daemon_kill", "gateway_freeze"]]
    out = tmp_path / "summary.json"
    argv = [sys.executable, "-m", "mqd_dev.chaos", "--landing", "s3", "--rounds", "2", "--seed", "130"]
    argv += ["--groups", "1", "--partitions", "2", "--daemons", "2", "--faults-per-round", "3"]
    argv += ["--hold-min", "1.5", "--hold-max", "3", "--round-timeout", "40", "--run-timeout", "150"]
    argv += ["--batch-records", "10", "--kinds", _KINDS, "--no-spark"]
    argv += ["--root", str(tmp_path / "run"), "--out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=190, cwd=REPO_ROOT)
    assert out.exists(), r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    assert s["failures"] == [], "\n".join(s["failures"])
    assert r.returncode == 0 and s["ok"]
    assert [x["kinds"] for x in s["round_log"]] == planned
    assert s["landing"].startswith("s3://")
    rec = s["records"]
    assert rec["acknowledged"] > 0
    assert rec["losses"] == 0 and rec["duplicates"] == 0 and rec["mismatched"] == 0
    assert rec["landed_distinct"] == rec["in_log"] == rec["acknowledged"] + rec["unacknowledged_written"]
    assert s["crashes"] == {}
    assert all(x["recovery_s"] is not None for x in s["round_log"])
