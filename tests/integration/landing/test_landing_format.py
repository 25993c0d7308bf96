"""The landing's format version (issue 12, "upgrades are safe"): a new landing gets the format-2
marker; a format-1 landing (landed before log incarnations) is refused with the command that
migrates it; ``mqd landing migrate`` rewrites it in place (incarnation unknown for what was landed
before) and is idempotent; a format-1 daemon cannot publish into a format-2 partition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.cli import mqd

from mqd import format as fmt
from mqd.config import LandingConfig
from mqd.landing import LandingSink, LocalStore, layout
from mqd.landing.layout import LandingCorrupt, LandingFormatError
from mqd.landing.local_store import PartitionState, migrate
from mqd.landing.publisher import Publisher

T0 = 1_767_225_600_000


def records(first: int, count: int) -> pa.Table:
    raw = fmt.encode_batch([b"v"] * count, timestamps=np.full(count, T0, dtype=np.int64), base_offset=first)
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


def format1_landing(root: Path) -> None:
    """A landing as format 1 left it: a file of 0..9 and a version-1 state record, no marker."""
    store = LocalStore(root)
    store.open()
    Publisher(store).publish("t", 0, records(0, 10), None)
    state = root / "_state" / "t" / "00000.json"
    d = json.loads(state.read_bytes())
    d["version"] = 1
    del d["incarnation"]
    state.write_text(json.dumps(d))
    (root / layout.FORMAT_FILE).unlink()


def format1_reader(d: dict[str, Any]) -> None:
    """The state check of format 1's PartitionState.from_json, as main shipped it before issue 12:
    any version but 1 is refused (LandingCorrupt), so every read of the head, every commit and
    every watermark update of that partition fails and nothing is published."""
    if d.get("version") != 1:
        raise LandingCorrupt(f"unknown state version {d.get('version')!r}")


def test_a_new_landing_gets_the_format_marker(tmp_path: Path) -> None:
    """open() on an empty directory writes _format.json with version 2; opening again is fine."""
    store = LocalStore(tmp_path / "landing")
    store.open()
    store.open()
    assert json.loads((tmp_path / "landing" / layout.FORMAT_FILE).read_bytes())["format"] == 2


async def test_a_format1_landing_is_refused_with_the_migration_command(tmp_path: Path) -> None:
    """A landing with format-1 state and no marker: the sink refuses to start (not retriable),
    naming `mqd landing migrate`; a marker of a newer format is refused too."""
    root = tmp_path / "landing"
    format1_landing(root)
    sink = LandingSink(LandingConfig(dir=root))
    with pytest.raises(LandingFormatError, match="mqd landing migrate") as err:
        await sink.start()
    await sink.close()
    assert not err.value.retriable
    (root / layout.FORMAT_FILE).write_text(json.dumps({"format": 3}))
    with pytest.raises(LandingFormatError, match="newer mqd"):
        LocalStore(root).open()


def test_migrate_rewrites_the_state_and_the_landing_resumes(tmp_path: Path) -> None:
    """migrate() turns the version-1 state into version 2 (incarnation unknown), writes the marker,
    and is idempotent; the store then opens, its head is the landed end with no incarnation, and
    the first incarnation's records land after it."""
    root = tmp_path / "landing"
    format1_landing(root)
    done = migrate(root)
    assert (done.from_version, done.to_version, done.states) == (1, 2, 1)
    assert migrate(root).states == 0
    store = LocalStore(root)
    store.open()
    head = store.head("t", 0)
    assert (head.last_offset, head.incarnation) == (9, None)
    rng = Publisher(store).publish("t", 0, records(10, 5), 9, incarnation="c" * 32)
    assert rng.incarnation == "c" * 32 and store.head("t", 0).incarnation == "c" * 32


def test_mqd_landing_migrate_command(tmp_path: Path) -> None:
    """The documented command, as an operator runs it: exit 0, says what it did, then says there
    is nothing to do."""
    root = tmp_path / "landing"
    format1_landing(root)
    first = mqd("landing", "migrate", "--dir", str(root))
    assert first.returncode == 0, first.stderr
    assert "migrated from landing format 1 to 2" in first.stdout
    again = mqd("landing", "migrate", "--dir", str(root))
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_a_format1_daemon_cannot_publish_into_a_format2_partition(tmp_path: Path) -> None:
    """Every partition a format-2 store resolved has a version-2 state record, published or not,
    and format 1's reader refuses it: a format-1 daemon's head, commit and watermark of that
    partition all fail, so the two formats never publish into one partition."""
    store = LocalStore(tmp_path / "landing")
    store.open()
    store.head("t", 1)  # resolved, nothing published
    Publisher(store).publish("t", 0, records(0, 3), None, incarnation="d" * 32)
    for p in (0, 1):
        d = json.loads((tmp_path / "landing" / "_state" / "t" / f"{p:05d}.json").read_bytes())
        with pytest.raises(LandingCorrupt, match="unknown state version 2"):
            format1_reader(d)
        assert PartitionState.from_json(d).files == (1 if p == 0 else 0)


def test_a_format1_state_in_a_format2_landing_is_named(tmp_path: Path) -> None:
    """A format-1 daemon that published into a partition no format-2 daemon had resolved leaves a
    version-1 state: the format-2 store refuses it with the migration command, not as garbage."""
    store = LocalStore(tmp_path / "landing")
    store.open()
    state = tmp_path / "landing" / "_state" / "t" / "00002.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"version": 1, "last_offset": 4, "watermark_ms": T0, "files": 1}))
    with pytest.raises(LandingFormatError, match="format-1 state record"):
        store.head("t", 2)
