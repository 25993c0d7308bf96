"""The landing's format version (issues 12 and 15, "upgrades are safe"): a new landing gets the
format-3 marker (the claim chain); a landing of format 1 (before log incarnations) or 2 (flock +
link) is refused with the command that migrates it; ``mqd landing migrate`` builds each
partition's claim chain from its state and manifest, in place, idempotent and finished by a re-run
after a crash at any step; a format-2 daemon cannot publish into a migrated partition."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.cli import mqd

from mqd.config import LandingConfig
from mqd.landing import LandingSink, LocalStore, layout
from mqd.landing.errors import LandingCorrupt, LandingFormatError
from mqd.landing.layout import FileRange
from mqd.landing.local_format2 import PartitionState
from mqd.landing.local_migration import MigrationInterrupted, migrate
from mqd.landing.publisher import Publisher, file_range
from mqd.wire import format as fmt

T0 = 1_767_225_600_000
INC = "a" * 32


def records(first: int, count: int) -> pa.Table:
    raw = fmt.encode_batch([b"v"] * count, timestamps=np.full(count, T0, dtype=np.int64), base_offset=first)
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


def _land_format2_file(root: Path, partition: int, first: int, count: int, inc: str | None) -> FileRange:
    """One data file as format 2 published it: at its final name, with its range in its metadata."""
    table = records(first, count)
    rng = file_range("t", partition, table, inc)
    rng = dataclasses.replace(rng, created=layout.iso_now())
    path = root / rng.path
    path.parent.mkdir(parents=True, exist_ok=True)
    size = layout.write_parquet(path, layout.landing_table("t", partition, table, inc), rng, "snappy")
    return dataclasses.replace(rng, bytes=size)


def format2_landing(root: Path, *, version: int = 2, pending: bool = False) -> list[FileRange]:
    """A landing as format 2 (or, ``version=1``, format 1) left it: partition 0 with files 0..9
    and 10..19 in its day manifest and state record (with ``pending``: the second file linked but
    not yet in the manifest nor the state, as a crash left it), partition 1 resolved with nothing
    published, and the format marker (none for format 1)."""
    inc = INC if version == 2 else None
    files = [_land_format2_file(root, 0, 0, 10, inc), _land_format2_file(root, 0, 10, 10, inc)]
    mdir = root / "_manifest" / "t" / "00000"
    mdir.mkdir(parents=True)
    listed = files[:1] if pending else files
    lines = b"".join(json.dumps(r.to_json()).encode() + b"\n" for r in listed)
    (mdir / f"{files[0].created[:10]}.jsonl").write_bytes(lines)
    sdir = root / "_state" / "t"
    sdir.mkdir(parents=True)
    last = listed[-1]
    states: dict[int, dict[str, Any]] = {
        0: {
            "version": version,
            "incarnation": inc,
            "last_offset": last.last_offset,
            "watermark_ms": T0 + 5,
            "files": len(listed),
            "pending": files[1].to_json() if pending else None,
        },
        1: {"version": version, "incarnation": None, "last_offset": None, "watermark_ms": T0 + 7, "files": 0},
    }
    for p, d in states.items():
        if version == 1:
            d.pop("incarnation")
        (sdir / f"{p:05d}.json").write_text(json.dumps(d))
        (sdir / f"{p:05d}.lock").write_bytes(b"")
    if version == 2:
        (root / layout.FORMAT_FILE).write_text(json.dumps({"format": 2, "created": layout.iso_now()}))
    return files


def assert_migrated(root: Path, files: list[FileRange], inc: str | None = INC) -> None:
    """What a finished migration leaves: format 3, each partition's head, manifest and watermark as
    before, data files untouched, and publishing resumes after the landed end."""
    marker = json.loads((root / layout.FORMAT_FILE).read_bytes())
    assert (marker["format"], marker["store"]) == (3, "claim-chain")
    store = LocalStore(root)
    store.open()
    head = store.head("t", 0)
    assert (head.last_offset, head.incarnation, head.files) == (19, inc, 2)
    assert store.head("t", 1).last_offset is None
    assert store.watermarks("t", 2) == [T0 + 5, T0 + 7]
    assert [r.path for r in store.manifest("t")] == [r.path for r in files]
    assert store.visible_files() == sorted(r.path for r in files)
    assert not list((root / "_manifest" / "t" / "00000").glob("????-??-??.jsonl"))  # moved aside
    rng = Publisher(store).publish("t", 0, records(20, 5), 19, incarnation=inc, expected_incarnation=inc)
    assert store.head("t", 0).last_offset == 24
    assert [r.path for r in store.manifest("t")] == [r.path for r in files] + [rng.path]


def test_a_new_landing_gets_the_format_marker(tmp_path: Path) -> None:
    """open() on an empty directory writes _format.json with version 3 (the claim chain); opening
    again is fine."""
    store = LocalStore(tmp_path / "landing")
    store.open()
    store.open()
    d = json.loads((tmp_path / "landing" / layout.FORMAT_FILE).read_bytes())
    assert (d["format"], d["store"]) == (3, "claim-chain")


@pytest.mark.parametrize("version", [1, 2])
async def test_older_landings_are_refused_with_the_migration_command(tmp_path: Path, version: int) -> None:
    """A format-1 landing (state, no marker) and a format-2 one: the sink refuses to start (not
    retriable), naming `mqd landing migrate`; a marker of a newer format is refused too."""
    root = tmp_path / "landing"
    format2_landing(root, version=version)
    sink = LandingSink(LandingConfig(dir=root))
    with pytest.raises(LandingFormatError, match="mqd landing migrate") as err:
        await sink.start()
    await sink.close()
    assert not err.value.retriable
    (root / layout.FORMAT_FILE).write_text(json.dumps({"format": 4, "store": "claim-chain"}))
    with pytest.raises(LandingFormatError, match="newer mqd"):
        LocalStore(root).open()


def test_migrate_format2_builds_the_chain_and_the_landing_resumes(tmp_path: Path) -> None:
    """migrate() turns a format-2 landing into format 3: heads, manifests and watermarks carry
    over, data files stay, and a second run does nothing."""
    root = tmp_path / "landing"
    files = format2_landing(root)
    done = migrate(root)
    assert (done.from_version, done.to_version, done.states) == (2, 3, 2)
    assert migrate(root).states == 0
    assert_migrated(root, files)


def test_migrate_format1_goes_straight_to_format3(tmp_path: Path) -> None:
    """A format-1 landing migrates in one run; what it landed keeps an unknown incarnation."""
    root = tmp_path / "landing"
    files = format2_landing(root, version=1)
    assert (migrate(root).from_version, migrate(root).to_version) == (1, 3)
    assert_migrated(root, files, inc=None)


def test_migrate_completes_a_half_done_format2_publication(tmp_path: Path) -> None:
    """A format-2 daemon that died between its link and its manifest line: the migration finishes
    that publication first, so the file is in the chain once."""
    root = tmp_path / "landing"
    files = format2_landing(root, pending=True)
    migrate(root)
    assert_migrated(root, files)


def test_a_rerun_after_a_crash_at_any_step_finishes_the_migration(tmp_path: Path) -> None:
    """A migration stopped after each of its durable steps in turn (a crash there), then run again,
    leaves exactly what an uninterrupted one does; the landing is refused until it is done."""
    template = tmp_path / "template"
    files = format2_landing(template)
    total = 0
    while True:
        root = tmp_path / f"landing-{total}"
        shutil.copytree(template, root)
        try:
            migrate(root, stop_after=total + 1)
        except MigrationInterrupted:
            with pytest.raises(LandingFormatError):
                LocalStore(root).open()  # not finished: still refused
            migrate(root)
            assert_migrated(root, files)
            total += 1
            continue
        assert_migrated(root, files)
        break
    assert total >= 5  # archive, floor, manifest move, state copy, state replace (+ partition 1)


def test_mqd_landing_migrate_command(tmp_path: Path) -> None:
    """The documented command, as an operator runs it: exit 0, says what it did, then says there
    is nothing to do."""
    root = tmp_path / "landing"
    format2_landing(root)
    first = mqd("landing", "migrate", "--dir", str(root))
    assert first.returncode == 0, first.stderr
    assert "migrated from landing format 2 to 3" in first.stdout
    again = mqd("landing", "migrate", "--dir", str(root))
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_a_format2_daemon_cannot_publish_into_a_migrated_partition(tmp_path: Path) -> None:
    """Format 2's reader refuses the record a migrated partition has in its place (its head,
    commit and watermark all read it first), and its open() refuses the format-3 marker."""
    root = tmp_path / "landing"
    format2_landing(root)
    migrate(root)
    for p in (0, 1):
        d = json.loads((root / "_state" / "t" / f"{p:05d}.json").read_bytes())
        with pytest.raises(LandingCorrupt, match="unknown state version None"):
            PartitionState.from_json(d)
    assert json.loads((root / layout.FORMAT_FILE).read_bytes())["format"] > 2  # format 2 refuses > 2
