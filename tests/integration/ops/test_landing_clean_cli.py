"""``mqd landing clean`` as a user runs it (its own process): it deletes what every registered
query committed and says so, ``--list`` shows the registered queries, ``--deregister`` releases a
query's hold (exit 1 for a name that is not registered)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
from support.cli import mqd

from mqd.landing import LocalStore, Publisher, lifecycle
from mqd.wire import format as fmt

T0 = 1_767_225_600_000


def test_landing_clean_command(tmp_path: Path) -> None:
    """Three files, one query committed all, another none: nothing goes; after deregistering the
    one behind, the two older files go (the newest stays)."""
    (tmp_path / "mqd.toml").write_text(f'[landing]\ndir = "{tmp_path / "landing"}"\n')
    store = LocalStore(tmp_path / "landing")
    store.open()
    pub = Publisher(store)
    paths = []
    for first in (0, 10, 20):
        raw = fmt.encode_batch([b"v"] * 10, timestamps=np.full(10, T0, dtype=np.int64), base_offset=first)
        table = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
        paths.append(pub.publish("t", 0, table, None if first == 0 else first - 1).path)
    lifecycle.register(store, "main")
    lifecycle.register(store, "behind")
    lifecycle.record_committed(store, "main", {"t/0": 3}, 0)
    cfg = str(tmp_path / "mqd.toml")
    done = mqd("landing", "clean", "-c", cfg)
    assert done.returncode == 0 and "0 deleted" in done.stdout, done
    listed = mqd("landing", "clean", "-c", cfg, "--list")
    assert sorted(json.loads(line)["query"] for line in listed.stdout.splitlines()) == ["behind", "main"]
    assert mqd("landing", "clean", "-c", cfg, "--deregister", "behind").returncode == 0
    assert mqd("landing", "clean", "-c", cfg, "--deregister", "behind").returncode == 1
    done = mqd("landing", "clean", "-c", cfg)
    assert done.returncode == 0 and "2 deleted" in done.stdout, done
    assert [store.objects.head(p) is not None for p in paths] == [False, False, True]
