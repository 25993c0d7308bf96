"""``mqd landing migrate``: a local landing of format 1 or 2 becomes format 3 (the claim chain), in
place. Every daemon of the landing must be stopped first.

Per partition, from its format-2 state (completed under its old flock, so a half-done format-2
publication is finished first) and its day manifests:

1. the archive ``_manifest/<t>/<p>/<0>-<n-1>.jsonl``: the n published files as claims 0..n-1, in
   publication order (the chain's own archive format, claim_chain.py);
2. ``_log/<t>/<p>/floor.json`` (create-only) at seq n-1 with the partition's state (last offset,
   incarnation, files, watermark): the chain's head until the next claim (n). Its existence means
   "this partition is migrated";
3. the day manifests move to ``_format2/_manifest/<t>/<p>/`` and the state record is copied to
   ``_format2/_state/<t>/`` and replaced by the chain's idle-watermark record (which a format-2
   daemon refuses: a daemon of the old format cannot publish into a migrated partition);

and, after every partition, the format marker (format 3), last: a landing is either refused as
format 2 or complete. Each step is idempotent and checks what is done, so re-running after a crash
at any point finishes the migration; a migrated landing is left alone. Data files keep their names
and places (what Spark reads does not change).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mqd.landing import layout
from mqd.landing.claim_chain import ChainState, Floor, archive_prefix, chain_prefix
from mqd.landing.errors import LandingFormatError, PreconditionFailed
from mqd.landing.layout import FileRange
from mqd.landing.local_format2 import (
    MIGRATION_LOCK_TIMEOUT_S,
    Format2Store,
    read_format,
    upgrade_states_1_to_2,
)
from mqd.landing.local_objects import LocalObjects

LEGACY_DIR = "_format2"  # format 2's manifests and state records, kept for audit
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}\.jsonl$")
_PARTITION = re.compile(r"^(\d{5})(?:\.json)?$")
_FILE = re.compile(r"^part-(\d{5})-")


class MigrationInterrupted(BaseException):
    """Raised by ``migrate(stop_after=n)`` (tests only) after n durable steps: a crash there."""


class _Steps:
    """Counts durable steps; ``stop_after`` ends the migration after that many (a crash)."""

    def __init__(self, stop_after: int | None) -> None:
        self.stop_after = stop_after
        self.done = 0

    def step(self) -> None:
        self.done += 1
        if self.stop_after is not None and self.done >= self.stop_after:
            raise MigrationInterrupted(f"stopped after {self.done} steps")


@dataclass(frozen=True, slots=True)
class Migration:
    """What ``migrate`` did."""

    from_version: int
    to_version: int
    states: int  # partitions converted to a claim chain


def migrate(root: Path, *, stop_after: int | None = None) -> Migration:
    """Migrate the local landing ``root`` to format 3 (module docstring). Idempotent;
    LandingFormatError for a landing newer than this mqd; LandingCorrupt for a state record
    mqd did not write; fsutil.LockTimeout when a format-2 daemon still holds a partition's lock.
    ``stop_after`` (tests only): MigrationInterrupted after that many durable steps."""
    root = Path(root)
    steps = _Steps(stop_after)
    marker = root / layout.FORMAT_FILE
    version = 1
    if marker.exists():
        data = marker.read_bytes()
        version = read_format(data, marker)
        store = json.loads(data).get("store")
        if store == layout.FORMAT_STORE and version in (2, layout.FORMAT_VERSION):
            return Migration(version, layout.FORMAT_VERSION, 0)
        if version >= layout.FORMAT_VERSION:
            raise LandingFormatError(f"{root}: landing format {version} is newer than this mqd's")
    if version == 1:
        upgrade_states_1_to_2(root)
    old = Format2Store(root)
    objects = LocalObjects(root, cas_lock_timeout=MIGRATION_LOCK_TIMEOUT_S)
    converted = 0
    for topic, partition in _partitions(root):
        converted += _migrate_partition(root, old, objects, topic, partition, steps)
    body = {
        "format": layout.FORMAT_VERSION,
        "store": layout.FORMAT_STORE,
        "migrated_from": version,
        "created": layout.iso_now(),
    }
    root.mkdir(parents=True, exist_ok=True)
    layout.write_atomic(marker, json.dumps(body).encode())
    return Migration(version, layout.FORMAT_VERSION, converted)


def _partitions(root: Path) -> list[tuple[str, int]]:
    """Every (topic, partition) with a format-2 state record, day manifest or data file (format
    2 rebuilt a lost state and manifest from the files' metadata; the migration does too)."""
    found: set[tuple[str, int]] = set()
    for path in root.glob("topic=*/dt=*/hour=*/part-*.parquet"):
        m = _FILE.match(path.name)
        if m:
            found.add((path.parts[-4][len("topic=") :], int(m.group(1))))
    for base in (root / layout.STATE_DIR, root / layout.MANIFEST_DIR):
        if not base.is_dir():
            continue
        for tdir in base.iterdir():
            if not tdir.is_dir() or tdir.name.startswith((".", "_")):
                continue
            for entry in tdir.iterdir():
                m = _PARTITION.match(entry.name)
                if m and (entry.is_dir() or entry.name.endswith(".json")):
                    found.add((tdir.name, int(m.group(1))))
    return sorted(found)


def _migrate_partition(
    root: Path, old: Format2Store, objects: LocalObjects, topic: str, partition: int, steps: _Steps
) -> int:
    """Steps 1-3 for one partition; 1 when this call built its chain, 0 when it was built."""
    floor_key = f"{chain_prefix(topic, partition)}floor.json"
    built = 0
    if objects.get(floor_key) is None:
        # under the old lock: a format-2 publication half done by a crashed daemon is completed
        st = old.state(topic, partition, MIGRATION_LOCK_TIMEOUT_S)
        ranges = old.manifest_ranges(topic, partition)
        n = len(ranges)
        if n:
            lines = b"".join(
                json.dumps({"seq": seq, "range": rng.to_json()}, separators=(",", ":")).encode() + b"\n"
                for seq, rng in enumerate(ranges)
            )
            objects.put(f"{archive_prefix(topic, partition)}{0:020d}-{n - 1:020d}.jsonl", lines)
            steps.step()
        head = _head(ranges, st.last_offset, st.incarnation)
        floor = Floor(n - 1, ChainState(head[0], head[1], n, st.watermark_ms))
        try:
            objects.put(floor_key, floor.to_bytes(), if_absent=True)
            built = 1
        except PreconditionFailed:
            pass  # a concurrent run of the migration built it
        steps.step()
    _retire_format2(root, topic, partition, steps)
    return built


def _head(
    ranges: list[FileRange], last: int | None, incarnation: str | None
) -> tuple[int | None, str | None]:
    """The chain's head: the state's, which format 2 kept equal to its last manifest line."""
    if last is None and ranges:
        return ranges[-1].last_offset, ranges[-1].incarnation
    return last, incarnation


def _retire_format2(root: Path, topic: str, partition: int, steps: _Steps) -> None:
    """Step 3: move the day manifests aside and replace the state record (idempotent)."""
    mdir = root / layout.topic_manifest_dir(topic) / f"{partition:05d}"
    if mdir.is_dir():
        for path in sorted(mdir.iterdir()):
            if _DAY.match(path.name):
                dest = root / LEGACY_DIR / layout.topic_manifest_dir(topic) / f"{partition:05d}" / path.name
                layout.makedirs_durable(dest.parent, root)
                os.replace(path, dest)
                layout.fsync_dir(dest.parent)
                steps.step()
        layout.fsync_dir(mdir)
    state = root / layout.topic_state_dir(topic) / f"{partition:05d}.json"
    try:
        d = json.loads(state.read_bytes())
    except (FileNotFoundError, ValueError):
        return
    if isinstance(d, dict) and d.get("version") is not None:  # a format-2 record: keep a copy, replace
        backup = root / LEGACY_DIR / layout.topic_state_dir(topic) / state.name
        layout.makedirs_durable(backup.parent, root)
        layout.write_atomic(backup, state.read_bytes())
        steps.step()
        idle = {"watermark_ms": d.get("watermark_ms"), "updated": layout.iso_now(), "migrated": True}
        layout.write_atomic(state, json.dumps(idle).encode())
        steps.step()
