"""`mqd broker-credentials` for the shipped 3-group layout, and nodes that need credentials.

The command writes one private file per node of config/cluster-3g.toml (what the shipped node
files name); a node of a group with slaves that has none refuses to start with exit 2 (a config
error systemd does not restart), naming the command to run.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from support import REPO_ROOT

from mqd.broker.replica_auth import load_credentials
from mqd.config import load_broker_config


def _mqd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqd.operator.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )


def test_credentials_for_the_shipped_three_group_cluster(tmp_path: Path) -> None:
    """Six files, mode 0600, one cluster id; each shipped node file names its node's file."""
    out = tmp_path / "credentials"
    done = _mqd("broker-credentials", "--cluster", "config/cluster-3g.toml", "--out-dir", str(out))
    assert done.returncode == 0, done.stderr
    files = sorted(out.iterdir())
    assert [f.name for f in files] == sorted(
        f"broker-{g}-{r}.credentials.toml" for g in "abc" for r in ("master", "slave")
    )
    ids = set()
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        node = f.name.removesuffix(".credentials.toml")
        peer = node.replace("slave", "master") if node.endswith("slave") else node.replace("master", "slave")
        ids.add(load_credentials(f, node, [peer]).cluster_id)
        cfg, _ = load_broker_config(REPO_ROOT / "config" / f"{node}.toml")
        assert cfg.replica_credentials is not None and cfg.replica_credentials.name == f.name
    assert len(ids) == 1


def test_a_node_with_slaves_and_no_credentials_exits_2(tmp_path: Path) -> None:
    """A master of a group with a slave and no replica_credentials: exit 2 with the command to run."""
    (tmp_path / "cluster.toml").write_text(
        '[[groups]]\nname = "g"\n\n'
        '[[groups.nodes]]\nid = "m"\nurl = "http://127.0.0.1:1"\nrole = "master"\n\n'
        '[[groups.nodes]]\nid = "s"\nurl = "http://127.0.0.1:2"\nrole = "slave"\n\n'
        '[[topics]]\nname = "events"\npartitions = 1\n'
    )
    node = tmp_path / "m.toml"
    node.write_text(
        f'node_id = "m"\ncluster_file = "cluster.toml"\ndata_dir = "{tmp_path / "data"}"\nport = 0\n'
    )
    done = _mqd("broker", "--config", str(node))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "replica_credentials is required" in done.stderr and "mqd broker-credentials" in done.stderr
