"""End-of-run checks: the producer's ledger vs the landing, the Spark table and the broker log.

The truth is the producer's ledger (mqd_dev.chaos.ledger): every acknowledged payload id must be in
the landing files and in the Spark table exactly once, at the partition and offset it was
acknowledged at (:func:`check_payloads`); no payload id, acknowledged or not, may appear twice.
This holds however the broker log changed meanwhile (a new incarnation reuses offsets).

The broker log, read back from every partition's master directly (no proxy), must still hold the
acknowledged records of the partition's current generation at their offsets (:func:`check_log`); it
may hold more (a produce whose answer was lost in transit is written but not acknowledged).
:func:`compare` (a copy against the log, offset by offset) checks replicas against their master, and
is reported for the landing and the table for information only: once offsets are reused, the landing
legitimately holds records the current log no longer has.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient
from mqd_dev.chaos.load import Ack, record_value

COPY_COLUMNS = ["partition", "offset", "value"]
COPY_SCHEMA = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("value", pa.binary())])


@dataclass
class Comparison:
    """One copy (landing or table) against the log."""

    rows: int = 0
    distinct: int = 0
    lost: int = 0  # in the log, not in the copy
    duplicates: int = 0  # rows beyond the first per (partition, offset)
    mismatched: int = 0  # same offset, different value
    not_in_log: int = 0  # offsets the log does not have
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.mismatched or self.not_in_log)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class LogCheck:
    records: int = 0
    acknowledged: int = 0
    acked_missing: int = 0  # acknowledged, not in the log at that offset (a broker loss)
    unacknowledged_written: int = 0  # in the log, never acknowledged (answer lost in transit)
    examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


async def read_log(
    client: BrokerClient, url_of: dict[int, str], topic: str, problems: list[str] | None = None
) -> dict[int, pa.Table]:
    """Every record of every partition, ``{partition: table(offset, value)}``, from each master.

    A damaged batch the broker serves (bad CRC) is skipped and described in ``problems``; one whose
    header is damaged ends that partition's read there (nothing after it can be found)."""
    out: dict[int, pa.Table] = {}
    problems = problems if problems is not None else []
    for partition, url in url_of.items():
        batches: list[pa.RecordBatch] = []
        offset = 0
        for _ in range(1_000_000):  # bounded: each round trip moves forward or ends the loop
            answer = await client.fetch(
                url,
                [{"topic": topic, "partition": partition, "offset": offset}],
                max_wait_ms=0,
                max_bytes=8 * 1024 * 1024,
            )
            p = answer.partitions[0]
            data = bytes(p.data)
            if not data:
                if offset < p.next_offset < p.max_offset:  # a hole the broker reports: read past it
                    offset = p.next_offset
                    continue
                break
            start = offset
            try:
                infos = fmt.scan(data, crc=False)
            except fmt.BatchError as exc:
                problems.append(f"{url} partition {partition}: unreadable batch at offset {offset}: {exc}")
                break
            for info in infos:
                try:
                    fmt.check_crc(data, info)
                except fmt.BatchError as exc:
                    problems.append(
                        f"{url} partition {partition}: damaged batch served, offsets "
                        f"{info.base_offset}..{info.next_offset - 1}: {exc}"
                    )
                    offset = max(offset, info.next_offset)
                    continue
                rb = fmt.to_arrow(data, info, offset)
                if rb.num_rows:
                    batches.append(rb.select(["offset", "value"]))
                    offset = int(rb.column("offset")[-1].as_py()) + 1
            if offset >= p.max_offset or offset == start:
                break
        schema = pa.schema([("offset", pa.int64()), ("value", pa.binary())])
        table = pa.Table.from_batches(batches, schema) if batches else schema.empty_table()
        out[partition] = table.combine_chunks()
    return out


def check_log(log: dict[int, pa.Table], acks: Iterable[Ack]) -> LogCheck:
    res = LogCheck(records=sum(t.num_rows for t in log.values()))
    by_partition: dict[int, list[Ack]] = {}
    for a in acks:
        res.acknowledged += a.count
        by_partition.setdefault(a.partition, []).append(a)
    for partition in sorted(set(log) | set(by_partition)):
        t = log.get(partition)
        log_off = t.column("offset").to_numpy() if t is not None else np.empty(0, np.int64)
        mine = by_partition.get(partition, [])
        acked = np.concatenate(
            [np.arange(a.base_offset, a.base_offset + a.count) for a in mine] or [np.empty(0, np.int64)]
        )
        res.unacknowledged_written += int(np.setdiff1d(log_off, acked).size)
        if not acked.size:
            continue
        want = pa.array(
            [record_value(partition, a.first_seq + i) for a in mine for i in range(a.count)], pa.binary()
        )
        idx = np.minimum(np.searchsorted(log_off, acked), max(len(log_off) - 1, 0))
        present = (log_off[idx] == acked) if len(log_off) else np.zeros(acked.size, bool)
        same = np.zeros(acked.size, bool)
        if t is not None and len(log_off):
            got = t.column("value").take(pa.array(idx))
            same = pc.fill_null(pc.equal(got, want), False).to_numpy(zero_copy_only=False)
        bad = ~(present & same)
        res.acked_missing += int(bad.sum())
        if bad.any() and len(res.examples) < 5:
            first = acked[bad][:5].tolist()
            res.examples.append(f"partition {partition}: acked offsets not in the log {first}")
    return res


@dataclass
class PayloadCheck:
    """One copy (landing or table) against the producer's ledger, by payload id."""

    acknowledged: int = 0
    rows: int = 0
    distinct: int = 0  # distinct payload ids in the copy
    lost: int = 0  # acknowledged, not in the copy
    duplicates: int = 0  # copies beyond the first of any payload id
    moved: int = 0  # acknowledged, but in the copy at another partition or offset
    unacknowledged: int = 0  # distinct ids in the copy that no ack names (written, answer lost)
    foreign: int = 0  # rows whose value is no payload of this partition (damaged or alien)
    # acknowledged into a source log that was destroyed before any daemon fetched them (a Kafka
    # broker with memory storage restarted): gone from the source, so not counted as lost
    gone_with_source: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.moved or self.foreign)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def payload_partition(value: bytes) -> int | None:
    """The partition a chaos payload (``load.record_value``) names, None if ``value`` is none."""
    if len(value) != 18 or value[:1] != b"p" or value[6:8] != b"-s" or not value[1:6].isdigit():
        return None
    return int(value[1:6]) if value[8:].isdigit() else None


def check_payloads(ledger: pa.Table, copy: pa.Table, lossy: Collection[tuple[int, int]] = ()) -> PayloadCheck:
    """``ledger`` as ``ledger.read_ledger`` gives it; ``copy`` has columns partition, offset, value.
    Acknowledgements of generation -1 (before the daemons' start position) are not expected.

    ``lossy`` names (partition, generation) pairs whose source log was destroyed under the daemons
    (a Kafka broker with memory storage restarted): a daemon lands a log in offset order, so what
    landed of such a generation must be a prefix of what was acknowledged into it; acknowledged
    records past the last landed one went with the source (``gone_with_source``), and a hole below
    it is a loss."""
    expected = pc.greater_equal(ledger.column("generation"), 0)
    res = PayloadCheck(acknowledged=int(pc.sum(expected).as_py() or 0), rows=copy.num_rows)
    before_start = set(ledger.filter(pc.invert(expected)).column("payload").to_pylist())
    acked: dict[bytes, tuple[int, int]] = dict(
        zip(
            ledger.column("payload").to_pylist(),
            zip(ledger.column("partition").to_pylist(), ledger.column("offset").to_pylist(), strict=True),
            strict=True,
        )
    )
    seen: dict[bytes, int] = {}
    moved: set[bytes] = set()
    parts = copy.column("partition").to_pylist()
    offsets = copy.column("offset").to_pylist()
    for value, partition, offset in zip(copy.column("value").to_pylist(), parts, offsets, strict=True):
        if payload_partition(value) != partition:
            res.foreign += 1
            if len(res.examples) < 8:
                res.examples.append(f"partition {partition} offset {offset}: foreign value {value[:40]!r}")
            continue
        seen[value] = seen.get(value, 0) + 1
        where = acked.get(value)
        # offset -1: acknowledged without an offset (a Kafka producer's retried batch): any will do
        if where is not None and where != (partition, offset) and where != (partition, -1):
            moved.add(value)
    res.distinct = len(seen)
    res.duplicates = sum(n - 1 for n in seen.values())
    res.moved = len(moved)
    lost = [v for v in acked if v not in seen and v not in before_start]
    if lossy and lost:
        generation_of = dict(
            zip(ledger.column("payload").to_pylist(), ledger.column("generation").to_pylist(), strict=True)
        )
        landed_max: dict[tuple[int, int], int] = {}
        for v in seen:
            where = acked.get(v)
            if where is not None:
                key = (where[0], generation_of[v])
                landed_max[key] = max(landed_max.get(key, -1), where[1])
        gone = {
            v
            for v in lost
            if (acked[v][0], generation_of[v]) in lossy
            # offset -1: acknowledged without one, its place in the destroyed log unknown
            and (acked[v][1] < 0 or acked[v][1] > landed_max.get((acked[v][0], generation_of[v]), -1))
        }
        res.gone_with_source = len(gone)
        lost = [v for v in lost if v not in gone]
    res.lost = len(lost)
    res.unacknowledged = sum(1 for v in seen if v not in acked)
    if lost:
        by_partition: dict[int, list[int]] = {}
        for v in lost:
            p, o = acked[v]
            by_partition.setdefault(p, []).append(o)
        for p, offs in sorted(by_partition.items()):
            res.examples.append(
                f"partition {p}: {len(offs)} acknowledged records lost, offsets {min(offs)}..{max(offs)}"
            )
    dups = [v for v, n in seen.items() if n > 1]
    if dups:
        res.examples.append(f"{len(dups)} payloads duplicated, e.g. {[d.decode() for d in dups[:3]]}")
    if moved:
        first = sorted(moved)[:3]
        res.examples.append(f"{len(moved)} acknowledged payloads at another offset, e.g. {first}")
    return res


def compare(log: dict[int, pa.Table], copy: pa.Table) -> Comparison:
    """``copy`` has columns partition, offset, value."""
    res = Comparison(rows=copy.num_rows)
    parts = copy.column("partition").to_numpy() if copy.num_rows else np.empty(0, np.int32)
    for partition in sorted(set(log) | {int(p) for p in np.unique(parts)}):
        mine = copy.filter(pc.equal(copy.column("partition"), partition)) if copy.num_rows else copy
        mine = mine.sort_by("offset")
        offs = mine.column("offset").to_numpy()
        uniq, first_idx, counts = np.unique(offs, return_index=True, return_counts=True)
        res.distinct += int(uniq.size)
        res.duplicates += int((counts - 1).sum())
        t = log.get(partition)
        log_off = t.column("offset").to_numpy() if t is not None else np.empty(0, np.int64)
        lost = np.setdiff1d(log_off, uniq)
        extra = np.setdiff1d(uniq, log_off)
        res.lost += int(lost.size)
        res.not_in_log += int(extra.size)
        if lost.size and len(res.examples) < 5:
            res.examples.append(f"partition {partition}: {lost.size} offsets lost, first {lost[:5].tolist()}")
        if extra.size and len(res.examples) < 5:
            res.examples.append(f"partition {partition}: offsets not in the log {extra[:5].tolist()}")
        if counts.max(initial=1) > 1 and len(res.examples) < 5:
            res.examples.append(f"partition {partition}: duplicated offsets {uniq[counts > 1][:5].tolist()}")
        if t is None or not uniq.size:
            continue
        both, in_log, in_copy = np.intersect1d(log_off, uniq, return_indices=True)
        log_vals = t.column("value").take(pa.array(in_log))
        copy_vals = mine.column("value").take(pa.array(first_idx[in_copy]))
        bad = pc.invert(pc.fill_null(pc.equal(log_vals, copy_vals), False))
        n_bad = int(pc.sum(bad).as_py() or 0)
        res.mismatched += n_bad
        if n_bad and len(res.examples) < 5:
            first_bad = both[np.flatnonzero(bad.to_numpy(zero_copy_only=False))[:5]].tolist()
            res.examples.append(f"partition {partition}: values differ at {first_bad}")
    return res


def as_copy(partition: int, table: pa.Table) -> pa.Table:
    """A ``read_log`` table as a copy for ``compare`` (adds the partition column)."""
    return table.add_column(0, "partition", pa.array(np.full(table.num_rows, partition), pa.int32()))


def _data_files(root: Path) -> list[Path]:
    """Published data files: ``_``/``.`` paths are state, manifests and temp files."""
    out = []
    for path in root.rglob("*.parquet"):
        rel = path.relative_to(root).parts
        if not any(part.startswith(("_", ".")) for part in rel):
            out.append(path)
    return sorted(out)


def read_parquet_files(paths: Iterable[Path]) -> pa.Table:
    tables = [pq.read_table(p, columns=COPY_COLUMNS).select(COPY_COLUMNS).cast(COPY_SCHEMA) for p in paths]
    return pa.concat_tables(tables) if tables else COPY_SCHEMA.empty_table()


def read_landing(landing: Path, topic: str) -> pa.Table:
    root = landing / f"topic={topic}"
    return read_parquet_files(_data_files(root) if root.is_dir() else [])


def landing_incarnations(landing: Path, topic: str) -> dict[int, list[str]]:
    """Per partition, the log incarnations its landed rows carry (empty for a landing whose files
    have no ``incarnation`` column: made before incarnations existed). Information for the summary."""
    root = landing / f"topic={topic}"
    out: dict[int, set[str]] = {}
    for path in _data_files(root) if root.is_dir() else []:
        if "incarnation" not in pq.read_schema(path).names:
            continue
        t = pq.read_table(path, columns=["partition", "incarnation"])
        for p, inc in zip(
            t.column("partition").to_pylist(), t.column("incarnation").to_pylist(), strict=True
        ):
            out.setdefault(int(p), set()).add(str(inc))
    return {p: sorted(v) for p, v in sorted(out.items())}


def spark_committed_files(output_dir: Path) -> list[Path]:
    """The files Spark's file sink committed, from its ``_spark_metadata`` log (the only correct way
    to read a file sink's output: files of failed batches may lie in the directory)."""
    meta = output_dir / "_spark_metadata"
    added: set[str] = set()
    deleted: set[str] = set()
    if not meta.is_dir():
        return []
    for entry in sorted(meta.iterdir()):
        if entry.name.startswith(".") or entry.name.endswith(".crc"):
            continue
        for line in entry.read_text().splitlines()[1:]:  # first line is the log version
            if not line.strip():
                continue
            rec = json.loads(line)
            (deleted if rec.get("action") == "delete" else added).add(rec["path"])
    paths = []
    for uri in sorted(added - deleted):
        parsed = urllib.parse.urlparse(uri)
        paths.append(Path(urllib.parse.unquote(parsed.path)))
    return paths


def read_table_output(output_dir: Path, topic: str) -> pa.Table:
    """The table's rows of ``topic``. A Delta table (the job's default) is read by delta-rs, a
    reader that is not Spark: what a user's DuckDB or Polars sees is what is checked. A parquet
    table is read from the files its ``_spark_metadata`` commits."""
    from mqd.spark.table_format import existing_format

    if existing_format(output_dir) == "delta":
        from deltalake import DeltaTable

        rows = DeltaTable(str(output_dir)).to_pyarrow_table(
            columns=COPY_COLUMNS, filters=[("topic", "=", topic)]
        )
        return rows.select(COPY_COLUMNS).cast(COPY_SCHEMA)
    files = [p for p in spark_committed_files(output_dir) if f"topic={topic}" in p.parts]
    return read_parquet_files(files)
