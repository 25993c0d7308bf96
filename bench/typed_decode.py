"""``python -m bench.typed_decode``: issue 30's decode step alone, ~100 B Avro records in the schema
registry's wire format decoded in one local[1] Spark session (CPU per core is meaningful there).

Data: N records (``--sizes``, default 2M and 6M) of one subject's writer schemas (``--ids``, default 1,
2 and 50 schema ids: version k adds a nullable field ``extra_k``), each value 0x00, the 4-byte id,
the Avro binary (fastavro, the encoder Confluent's Python serializer uses), in plain Parquet files with
one binary ``value`` column (the landing's ``value``). A pool of ``--pool`` distinct records is encoded
and tiled to N (the decode cost does not depend on values repeating).

Variants, interleaved round by round (the order rotated), each forced to a full evaluation by an
aggregate over every decoded field (``bit_xor(xxhash64(struct))``, which Spark cannot prune):

- ``mqd``: mqd's ColumnDecoder exactly as the job's foreachBatch uses it (typed_sink.py): the schema
  id column, ``decoded`` (the CASE over the ids: from_avro PERMISSIVE, the decode-failure check,
  ``conform``), the dead-letter ``reason`` over it; prepared by a lookup over the schemas in memory;
- ``floor``: Spark's own ``from_avro`` of the payload with the one writer schema (the 1-id data only);
- ``python``: the Python-worker alternative at its best without a new dependency: an Arrow UDF
  (``pyspark.sql.functions.arrow_udf``, pyarrow only; ``mapInArrow`` and ``mapInPandas`` need pandas,
  not installed) decoding each record with fastavro's ``schemaless_reader`` by its id's writer schema,
  building the table's struct with ``pa.array(dicts, type)``;
- ``scan``: reading ``value`` and the same aggregate over the raw bytes, no decoding: what every variant
  pays around the decode;
- diagnostics, rebuilt here from ColumnDecoder's plan (the first size, the first round only):
  ``mqd-no-reason`` (``decoded`` without the reason columns), ``mqd-no-check`` (without the
  decode-failure check), ``mqd-once`` (the change proposed in bench/README.md: each id's
  ``from_avro`` evaluated once per record in a projection below, the check and ``conform`` over its
  result).

CPU seconds: the JVM's (``/proc`` via psutil: every thread, JIT and GC included) plus its descendant
processes' (the Python workers, reaped ones through their parent's children times), over each run;
records per CPU second is the headline (records/s per core). Load: the 1-minute average at each run's
start and end. A warm-up run of every variant on a small file precedes the rounds (code generation, the
JIT); a variant too slow to finish a size within ``--run-timeout`` is measured on the warm-up file only
and marked so. Results: ``bench/results/typed_decode.json`` / ``.md`` and the table in bench/README.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.common import (
    RESULTS,
    bare_spark_conf,
    fmt_range,
    machine_facts,
    package_versions,
    replace_block,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "bench" / "README.md"
README_BEGIN = "<!-- typed_decode:begin -->"
README_END = "<!-- typed_decode:end -->"

FIRST_ID = 101  # the registry id of version 1; version k is FIRST_ID + k - 1
T0_MS = 1_767_225_600_000
FILE_RECORDS = 1_000_000  # records per Parquet file: a size of N uses the first N / FILE_RECORDS files
BASE_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "long"),
    ("name", "string"),
    ("score", "double"),
    ("count", "int"),
    ("flag", "boolean"),
    ("ts", "long"),
    ("city", "string"),
)
NAME_CHARS = 40
CITY_CHARS = 20
MAIN_VARIANTS = ("mqd", "floor", "python", "scan")
DIAGNOSTICS = ("mqd-no-reason", "mqd-no-check", "mqd-once")


def log(msg: str) -> None:
    print(f"[typed_decode {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the records (pure)


def version_schema(version: int) -> dict[str, Any]:
    """Version ``version`` (1-based) of the subject: the base fields, then ``extra_2`` .. ``extra_version``
    (nullable longs, default null): each version adds one field, as a compatible evolution does."""
    fields: list[dict[str, Any]] = [{"name": n, "type": t} for n, t in BASE_FIELDS]
    fields += [
        {"name": f"extra_{k}", "type": ["null", "long"], "default": None} for k in range(2, version + 1)
    ]
    return {"type": "record", "name": "Reading", "namespace": "bench", "fields": fields}


def schema_ids(n_ids: int) -> list[int]:
    return [FIRST_ID + v for v in range(n_ids)]


def id_version(schema_id: int) -> int:
    return schema_id - FIRST_ID + 1


def _letters(rng: np.random.Generator, n: int, width: int) -> list[str]:
    codes = rng.integers(ord("a"), ord("z") + 1, size=(n, width), dtype=np.uint8)
    return [row.tobytes().decode("ascii") for row in codes]


def make_records(n: int, n_ids: int, seed: int = 30) -> list[tuple[int, dict[str, Any]]]:
    """``n`` records as (schema id, record): the ids round-robin over ``n_ids`` versions, every base
    field set, a version's newest field set (its older extras null)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**40, size=n)
    scores = rng.random(n) * 1000
    counts = rng.integers(0, 100_000, size=n)
    names = _letters(rng, n, NAME_CHARS)
    cities = _letters(rng, n, CITY_CHARS)
    out = []
    for i in range(n):
        sid = FIRST_ID + i % n_ids
        rec: dict[str, Any] = {
            "id": int(ids[i]),
            "name": names[i],
            "score": float(scores[i]),
            "count": int(counts[i]),
            "flag": bool(i & 1),
            "ts": T0_MS + i,
            "city": cities[i],
        }
        v = id_version(sid)
        if v > 1:
            rec[f"extra_{v}"] = i
        out.append((sid, rec))
    return out


def encode_wire(records: Sequence[tuple[int, dict[str, Any]]]) -> list[bytes]:
    """Each record as a registry-aware serializer writes it: 0x00, the id big-endian, the Avro binary."""
    import fastavro

    from mqd.spark.wire_format import header

    parsed: dict[int, Any] = {}
    out = []
    for sid, rec in records:
        if sid not in parsed:
            parsed[sid] = fastavro.parse_schema(version_schema(id_version(sid)))
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed[sid], rec)
        out.append(header(sid) + buf.getvalue())
    return out


def tiled(pool: pa.Array, start: int, n: int) -> pa.Array:
    """Records ``start`` .. ``start + n - 1`` of the pool repeated end to end."""
    parts = []
    pos = start % len(pool)
    while n > 0:
        take = min(n, len(pool) - pos)
        parts.append(pool.slice(pos, take))
        n -= take
        pos = 0
    return pa.concat_arrays(parts)


def write_files(folder: Path, pool: pa.Array, files: int, per_file: int = FILE_RECORDS) -> list[Path]:
    """``files`` Parquet files of ``per_file`` values each (the pool tiled), kept when already there."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(files):
        path = folder / f"part-{k:03d}.parquet"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            table = pa.table({"value": tiled(pool, k * per_file, per_file)})
            pq.write_table(table, tmp, compression="snappy", use_dictionary=False, row_group_size=128 * 1024)
            tmp.rename(path)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
# the figures (pure)


@dataclass
class Run:
    variant: str
    ids: int
    size: int  # records the run decoded
    round: int
    wall_s: float
    jvm_cpu_s: float
    worker_cpu_s: float
    load_start: float
    load_end: float
    note: str = ""
    result: list[Any] = field(default_factory=list)

    @property
    def cpu_s(self) -> float:
        # a Python worker that exits during a run takes its CPU seconds out of the tree: never below 0
        return self.jvm_cpu_s + max(0.0, self.worker_cpu_s)


def median_range(values: Sequence[float], digits: int = 0) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def summarize(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per (size, ids, variant): records per CPU second (JVM + Python workers) and per wall second,
    CPU seconds per million records, load; medians with [min, max]. A variant's runs on the warm-up
    file (too slow for the size) are summarised under that size with their own record count."""
    keys: list[tuple[int, int, str]] = []
    for r in runs:
        k = (r.size, r.ids, r.variant)
        if k not in keys:
            keys.append(k)
    rows = []
    for size, ids, variant in sorted(keys, key=lambda k: (k[0], k[1], _order(k[2]))):
        mine = [r for r in runs if (r.size, r.ids, r.variant) == (size, ids, variant)]
        rows.append(
            {
                "size": size,
                "ids": ids,
                "variant": variant,
                "runs": len(mine),
                "records_per_cpu_s": median_range([size / r.cpu_s for r in mine if r.cpu_s > 0]),
                "records_per_s": median_range([size / r.wall_s for r in mine]),
                "cpu_s_per_m": median_range([r.cpu_s / size * 1e6 for r in mine], 2),
                "worker_cpu_share": round(
                    statistics.median([max(0.0, r.worker_cpu_s) / r.cpu_s for r in mine]), 2
                )
                if all(r.cpu_s > 0 for r in mine)
                else 0.0,
                "load": median_range([max(r.load_start, r.load_end) for r in mine], 1),
                "note": "; ".join(sorted({r.note for r in mine if r.note})),
            }
        )
    return rows


def _order(variant: str) -> int:
    names = MAIN_VARIANTS + DIAGNOSTICS
    return names.index(variant) if variant in names else len(names)


def decode_only(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each decoding variant's CPU per million records less the scan's at the same size and ids (the
    decode step alone), as records per CPU second."""
    scan = {(r["size"], r["ids"]): r["cpu_s_per_m"]["median"] for r in rows if r["variant"] == "scan"}
    out = []
    for r in rows:
        base = scan.get((r["size"], r["ids"]))
        if r["variant"] == "scan" or base is None:
            continue
        alone = r["cpu_s_per_m"]["median"] - base
        out.append(
            {
                "size": r["size"],
                "ids": r["ids"],
                "variant": r["variant"],
                "cpu_s_per_m": round(alone, 2),
                "records_per_cpu_s": round(1e6 / alone) if alone > 0 else None,
            }
        )
    return out


def marginal(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (ids, variant) measured at two sizes or more: the records per CPU second of the records
    between the smallest and the largest size (median CPU seconds of each), the per-query cost
    (planning, code generation, task start) left out; and that per-query cost itself."""
    out = []
    pairs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        if not r["note"]:
            pairs.setdefault((r["ids"], r["variant"]), []).append(r)
    for (ids, variant), mine in pairs.items():
        if len(mine) < 2:
            continue
        lo, hi = min(mine, key=lambda r: r["size"]), max(mine, key=lambda r: r["size"])
        cpu_lo = lo["cpu_s_per_m"]["median"] * lo["size"] / 1e6
        cpu_hi = hi["cpu_s_per_m"]["median"] * hi["size"] / 1e6
        if cpu_hi <= cpu_lo:
            continue
        rate = (hi["size"] - lo["size"]) / (cpu_hi - cpu_lo)
        out.append(
            {
                "ids": ids,
                "variant": variant,
                "sizes": [lo["size"], hi["size"]],
                "records_per_cpu_s": round(rate),
                "per_query_cpu_s": round(cpu_lo - lo["size"] / rate, 2),
            }
        )
    return sorted(out, key=lambda r: (r["ids"], _order(r["variant"])))


def render_md(result: dict[str, Any]) -> str:
    m = result["machine"]
    a = result["args"]
    data = result["data"]
    lines = [
        f"Run {m['time_utc']} on {m['cores']} cores ({m['cpu_model']}), one local[1] session "
        f"(driver memory {a['driver_memory']}), pyspark {result['versions'].get('pyspark')}, fastavro "
        f"{result['versions'].get('fastavro')}; {a['rounds']} interleaved rounds, medians [min-max]; "
        "records per CPU second = records / (JVM + Python workers' CPU seconds); load = the 1-minute "
        "average (the higher of a run's start and end).",
        "",
        "Data: "
        + "; ".join(
            f"{d['ids']} id(s): {d['avg_value_bytes']:.1f} B per value ({d['avg_payload_bytes']:.1f} B Avro)"
            for d in data
        ),
        "",
        "| records | ids | variant | records / CPU s | records / wall s | CPU s per M | "
        "workers' CPU share | load | note |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['size']:,} | {r['ids']} | {r['variant']} | "
            f"{fmt_range(r['records_per_cpu_s'], thousands=True)} | "
            f"{fmt_range(r['records_per_s'], thousands=True)} | {fmt_range(r['cpu_s_per_m'], 2)} | "
            f"{r['worker_cpu_share']:.2f} | "
            f"{fmt_range(r['load'], 1)} | {r['note']} |"
        )
    alone = result["decode_only"]
    if alone:
        lines += [
            "",
            "The decode step alone (CPU s per M records less the scan's at the same size and ids):",
            "",
            "| records | ids | variant | CPU s per M | records / CPU s |",
            "|---:|---:|---|---:|---:|",
        ]
        for r in alone:
            rate = f"{r['records_per_cpu_s']:,}" if r["records_per_cpu_s"] else "-"
            lines.append(f"| {r['size']:,} | {r['ids']} | {r['variant']} | {r['cpu_s_per_m']:.2f} | {rate} |")
    marg = result.get("marginal") or []
    if marg:
        lines += [
            "",
            "Per record, the per-query cost left out (CPU seconds between the two sizes, medians):",
            "",
            "| ids | variant | records / CPU s | per-query CPU s |",
            "|---:|---|---:|---:|",
        ]
        for r in marg:
            lines.append(
                f"| {r['ids']} | {r['variant']} | {r['records_per_cpu_s']:,} | {r['per_query_cpu_s']:.2f} |"
            )
    warm = result.get("warmups") or []
    if warm:
        lines += [
            "",
            "Warm-ups on the small file (the first run of a query pays its planning and code generation; "
            "the second, the compiled code):",
            "",
            "| ids | variant | records | first run wall s (CPU s) | second run wall s (CPU s) |",
            "|---:|---|---:|---:|---:|",
        ]
        for w in warm:
            second = (
                f"{w['second_wall_s']:.1f} ({w['second_cpu_s']:.1f})"
                if w["second_wall_s"] is not None
                else "-"
            )
            done = "" if w["finished"] else " (cancelled)"
            lines.append(
                f"| {w['ids']} | {w['variant']} | {w['records']:,} | "
                f"{w['first_wall_s']:.1f} ({w['first_cpu_s']:.1f}){done} | {second} |"
            )
    failed = result.get("failed") or []
    if failed:
        lines += ["", "Runs that did not finish: " + "; ".join(failed)]
    return "\n".join(lines) + "\n"


def update_readme(md: str) -> None:
    replace_block(README, README_BEGIN, README_END, md)


# ---------------------------------------------------------------------------------------------
# the Spark side


class Meter:
    """CPU seconds of the session's JVM and of its descendant processes (the Python workers)."""

    def __init__(self, spark: Any) -> None:
        import psutil

        proc = psutil.Process(spark.sparkContext._gateway.proc.pid)
        if "java" not in proc.name():
            found = [p for p in proc.children(recursive=True) if "java" in p.name()]
            if not found:
                raise SystemExit(f"no JVM under the gateway process {proc.pid} ({proc.name()})")
            proc = found[0]
        self.jvm = proc
        self.seen: dict[int, float] = {}  # descendant pid -> its last CPU seconds read

    def read(self) -> tuple[float, float]:
        """(the JVM's CPU seconds, its descendants'): a descendant that has exited counts with the last
        figure read while it ran, so the workers' total never goes down when the daemon or a worker
        exits (a worker started and reaped between two reads is in its parent's children times)."""
        import psutil

        t = self.jvm.cpu_times()  # its children times left out: a reaped descendant is in ``seen``
        for p in self.jvm.children(recursive=True):
            try:
                c = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
            self.seen[p.pid] = c.user + c.system + c.children_user + c.children_system
        return t.user + t.system, sum(self.seen.values())


class Variants:
    """The queries of one dataset (its ids' decoder prepared once, as the job's first batch does)."""

    def __init__(self, spark: Any, n_ids: int) -> None:
        from pyspark.sql.types import StructType

        from mqd.spark.typed_records import ColumnDecoder, WriterSchema

        self.spark = spark
        self.ids = schema_ids(n_ids)
        self.texts = {sid: json.dumps(version_schema(id_version(sid))) for sid in self.ids}

        def lookup(sid: int) -> WriterSchema:
            return WriterSchema(sid, "AVRO", self.texts[sid])

        reserved = ["topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers"]
        self.decoder = ColumnDecoder(spark, "value", lookup, StructType([]), reserved)
        t0 = time.perf_counter()
        self.decoder.prepare(self.ids)
        self.prepare_s = time.perf_counter() - t0

    def query(self, variant: str, df: Any) -> Any:
        from pyspark.sql import functions as F

        from mqd.spark import wire_format as wire

        def agg(col: str, *more: Any) -> Any:
            return F.bit_xor(F.xxhash64(F.col(col))).alias("h"), *more

        if variant == "scan":
            return df.agg(*agg("value"))
        if variant == "floor":
            from pyspark.sql.avro.functions import from_avro

            (sid,) = self.ids
            d = df.select(from_avro(wire.payload(F.col("value")), self.texts[sid]).alias("d"))
            return d.agg(*agg("d"))
        if variant == "python":
            d = df.select(self.python_udf()(F.col("value")).alias("d"))
            return d.agg(*agg("d"))
        staged = df.withColumn("_value_sid", wire.schema_id(F.col("value")))
        sid_col = F.col("_value_sid")
        if variant in ("mqd", "mqd-no-reason"):
            staged = staged.withColumns(self.decoder.raw_columns(sid_col))
            staged = staged.withColumn("_value_dec", self.decoder.decoded(sid_col))
        elif variant == "mqd-no-check":
            staged = staged.withColumn("_value_dec", self.rebuilt(sid_col, check=False))
        elif variant == "mqd-once":
            payload = wire.payload(F.col("value"))
            staged = staged.withColumns(
                {f"_d{sid}": F.when(sid_col == sid, self._from_avro(payload, sid)) for sid in self.ids}
            )
            staged = staged.withColumn("_value_dec", self.rebuilt(sid_col, check=True, once=True))
        else:
            raise ValueError(variant)
        if variant == "mqd-no-reason":
            return staged.agg(*agg("_value_dec"))
        cls, msg = self.decoder.reason(sid_col, F.col("_value_dec"))
        staged = staged.withColumns({"_reason": cls, "_message": msg})
        return staged.agg(*agg("_value_dec", F.count("_reason").alias("dead")))

    def _from_avro(self, data: Any, sid: int) -> Any:
        from pyspark.sql.avro.functions import from_avro

        return from_avro(data, self.texts[sid], {"mode": "PERMISSIVE"})

    def rebuilt(self, sid_col: Any, *, check: bool, once: bool = False) -> Any:
        """ColumnDecoder.decoded's expression rebuilt from its plan (record schemas, no renames here),
        with the decode-failure check or without, and with ``once`` over the ``_d<id>`` columns of a
        projection below (each id's from_avro evaluated once per record) instead of inline."""
        from pyspark.sql import functions as F

        from mqd.spark import wire_format as wire
        from mqd.spark.schema_evolution import conform

        dec = self.decoder
        table = dec.table_type
        data = wire.payload(F.col("value"))
        out = F.lit(None).cast(table)
        for sid in dec.ids(good=True):
            v = dec._verdicts[sid]
            assert v.wrap is None and not v.renames
            d = F.col(f"_d{sid}") if once else self._from_avro(data, sid)
            shaped = conform(d, v.writer, table)
            if check:
                all_null = F.lit(True)
                for n in v.writer.fieldNames():
                    all_null = all_null & d.getField(n).isNull()
                legit = data == F.lit(v.null_record) if v.null_record is not None else F.lit(False)
                shaped = F.when(all_null & ~legit, F.lit(None).cast(table)).otherwise(shaped)
            out = F.when(sid_col == sid, shaped).otherwise(out)
        return out

    def python_udf(self) -> Any:
        """An Arrow UDF decoding each value with fastavro by its id's writer schema into the table's
        struct (a failed or foreign value: null)."""
        from pyspark.sql import functions

        arrow_udf: Any = functions.arrow_udf  # type: ignore[attr-defined]  # pyspark 4.2's stubs lack it

        from mqd.spark.wire_format import HEADER_BYTES

        texts = dict(self.texts)
        table_type = self.decoder.table_type
        ddl = table_type  # a StructType: arrow_udf takes it as the return type

        cache: dict[str, Any] = {}

        def decode(values: pa.Array) -> pa.Array:
            import fastavro

            if not cache:
                cache["schemas"] = {sid: fastavro.parse_schema(json.loads(t)) for sid, t in texts.items()}
                from pyspark.sql.pandas.types import to_arrow_type

                cache["type"] = to_arrow_type(table_type)
            schemas = cache["schemas"]
            reader = fastavro.schemaless_reader
            out: list[Any] = []
            for v in values.to_pylist():
                if v is None or len(v) < HEADER_BYTES or v[0] != 0:
                    out.append(None)
                    continue
                schema = schemas.get(int.from_bytes(v[1:HEADER_BYTES], "big"))
                if schema is None:
                    out.append(None)
                    continue
                try:
                    out.append(reader(io.BytesIO(v[HEADER_BYTES:]), schema, None))
                except Exception:
                    out.append(None)
            return pa.array(out, type=cache["type"])

        return arrow_udf(decode, ddl)


class Timed:
    """Runs a query in a job group, cancelled after ``timeout`` seconds; its figures."""

    def __init__(self, spark: Any, meter: Meter) -> None:
        self.spark = spark
        self.meter = meter

    def __call__(self, query: Any, timeout: float) -> tuple[float, float, float, list[Any] | None]:
        sc = self.spark.sparkContext
        group = f"typed-decode-{time.monotonic_ns()}"
        sc.setJobGroup(group, "typed decode bench", interruptOnCancel=True)
        timer = threading.Timer(timeout, sc.cancelJobGroup, args=(group,))
        j0, w0 = self.meter.read()
        t0 = time.perf_counter()
        timer.start()
        try:
            rows: list[Any] | None = [list(r) for r in query.collect()]
        except Exception as exc:  # cancelled (the timeout), or a failure reported as the run's note
            log(f"  run failed: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else exc!r}")
            rows = None
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        j1, w1 = self.meter.read()
        return wall, j1 - j0, w1 - w0, rows


# ---------------------------------------------------------------------------------------------
# the benchmark


@dataclass
class Dataset:
    ids: int
    files: list[Path]
    warm: Path
    avg_value_bytes: float
    avg_payload_bytes: float

    def paths(self, size: int) -> list[str]:
        return [str(p) for p in self.files[: max(1, size // FILE_RECORDS)]]


def prepare_data(workdir: Path, n_ids: int, max_size: int, pool: int, warm: int) -> Dataset:
    t0 = time.perf_counter()
    values = pa.array(encode_wire(make_records(pool, n_ids)), pa.binary())
    folder = workdir / f"ids-{n_ids}-pool-{pool}"
    files = write_files(folder, values, (max_size + FILE_RECORDS - 1) // FILE_RECORDS)
    (warm_path,) = write_files(folder / "warm", values, 1, warm)
    sizes = np.asarray(pc.binary_length(values))
    log(f"data: {n_ids} id(s), {len(files)} files of {FILE_RECORDS:,} in {time.perf_counter() - t0:.1f} s")
    return Dataset(n_ids, files, warm_path, float(sizes.mean()), float(sizes.mean()) - 5)


def build_session(workdir: Path, driver_memory: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers need this venv's pyarrow and fastavro
    conf = bare_spark_conf(workdir, {"spark.driver.memory": driver_memory})
    builder = SparkSession.builder.master("local[1]").appName("mqd-bench-typed-decode")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def variants_for(n_ids: int, diagnose: bool, skip: set[str]) -> list[str]:
    out = [v for v in MAIN_VARIANTS if not (v == "floor" and n_ids != 1)]
    if diagnose:
        out += DIAGNOSTICS
    return [v for v in out if v not in skip]


def rotate(items: Sequence[str], k: int) -> list[str]:
    k %= max(1, len(items))
    return list(items[k:]) + list(items[:k])


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    workdir: Path = args.workdir
    data = {n: prepare_data(workdir, n, max(args.sizes), args.pool, args.warm) for n in args.ids}
    spark = build_session(workdir, args.driver_memory)
    runs: list[Run] = []
    failed: list[str] = []
    warmups: list[dict[str, Any]] = []
    try:
        meter = Meter(spark)
        timed = Timed(spark, meter)
        for n_ids in args.ids:
            ds = data[n_ids]
            variants = Variants(spark, n_ids)
            log(f"{n_ids} id(s): decoder prepared in {variants.prepare_s:.2f} s")
            names = variants_for(n_ids, args.diagnose, set(args.skip))
            slow: dict[str, float] = {}  # variant -> its warm-up rate, when too slow for the sizes
            for name in names:
                first = timed(variants.query(name, spark.read.parquet(str(ds.warm))), args.run_timeout)
                second = None
                if first[3] is not None and first[0] < args.run_timeout / 4:
                    second = timed(variants.query(name, spark.read.parquet(str(ds.warm))), args.run_timeout)
                warmups.append(
                    {
                        "ids": n_ids,
                        "variant": name,
                        "records": args.warm,
                        "first_wall_s": round(first[0], 2),
                        "first_cpu_s": round(first[1] + first[2], 2),
                        "second_wall_s": round(second[0], 2) if second else None,
                        "second_cpu_s": round(second[1] + second[2], 2) if second else None,
                        "finished": first[3] is not None,
                    }
                )
                log(f"  warm-up {name:14} {warmups[-1]}")
                if first[3] is None:
                    failed.append(
                        f"{name} at {n_ids} ids: the warm-up of {args.warm:,} records did not finish"
                    )
                elif second is None or args.warm / second[0] * args.run_timeout < max(args.sizes):
                    slow[name] = args.warm / (second or first)[0]
            for rnd in range(args.rounds):
                for size in args.sizes:
                    for name in rotate(names, rnd):
                        if name in DIAGNOSTICS and (size != args.sizes[0] or rnd > 0):
                            continue
                        if any(name in f and f"{n_ids} ids" in f for f in failed):
                            continue
                        on_warm = name in slow
                        paths = [str(ds.warm)] if on_warm else ds.paths(size)
                        records = args.warm if on_warm else size
                        if on_warm and size != args.sizes[0]:
                            continue
                        load0 = os.getloadavg()[0]
                        wall, jvm, wk, rows = timed(
                            variants.query(name, spark.read.parquet(*paths)), args.run_timeout
                        )
                        load1 = os.getloadavg()[0]
                        if rows is None:
                            failed.append(f"{name} at {n_ids} ids, {records:,} records, round {rnd}")
                            continue
                        note = (
                            f"on the {args.warm:,}-record warm-up file: too slow for {size:,}"
                            if on_warm
                            else ""
                        )
                        run = Run(name, n_ids, records, rnd, wall, jvm, wk, load0, load1, note, rows[0])
                        runs.append(run)
                        log(
                            f"  round {rnd} {n_ids:2} ids {records:>9,} {name:14} {wall:6.1f} s wall "
                            f"{run.cpu_s:6.1f} s CPU ({wk:.1f} workers) "
                            f"{records / run.cpu_s:>10,.0f} rec/CPU s "
                            f"load {load0:.1f}-{load1:.1f}"
                        )
    finally:
        spark.stop()
    summary = summarize(runs)
    return {
        "benchmark": "typed_decode",
        "machine": machine_facts(),
        "versions": package_versions(("pyspark", "fastavro", "pyarrow")),
        "args": {
            "sizes": args.sizes,
            "ids": args.ids,
            "rounds": args.rounds,
            "pool": args.pool,
            "warm": args.warm,
            "driver_memory": args.driver_memory,
            "run_timeout_s": args.run_timeout,
            "diagnose": args.diagnose,
        },
        "data": [
            {"ids": d.ids, "avg_value_bytes": d.avg_value_bytes, "avg_payload_bytes": d.avg_payload_bytes}
            for d in data.values()
        ],
        "summary": summary,
        "decode_only": decode_only(summary),
        "marginal": marginal(summary),
        "failed": failed,
        "warmups": warmups,
        "runs": [asdict(r) for r in runs],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.typed_decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2000000,6000000", help="records per run (multiples of 1M)")
    ap.add_argument("--ids", default="1,2,50", help="schema ids of each dataset")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pool", type=int, default=250_000, help="distinct records encoded, tiled to the size")
    ap.add_argument("--warm", type=int, default=100_000, help="records of the warm-up file")
    ap.add_argument("--driver-memory", default="4g", help="the session's heap (mqd's default is 1g)")
    ap.add_argument("--run-timeout", type=float, default=240.0, help="bound of one run, seconds")
    ap.add_argument(
        "--no-diagnose", dest="diagnose", action="store_false", help="leave the mqd-* variants out"
    )
    ap.add_argument("--skip", action="append", default=[], help="leave a variant out (repeatable)")
    ap.add_argument("--quick", action="store_true", help="1 round of 1M records, no diagnostics: does it run")
    ap.add_argument("--workdir", type=Path, default=None, help="keep the data here (reused)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--render", type=Path, default=None, help="re-summarise a result JSON's runs, no run")
    args = ap.parse_args(argv)
    args.sizes = sorted(int(s) for s in str(args.sizes).split(",") if s)
    args.ids = [int(s) for s in str(args.ids).split(",") if s]
    if args.quick:
        args.sizes, args.rounds, args.diagnose = [FILE_RECORDS], 1, False
        args.pool, args.warm = 50_000, 20_000
    if any(s % FILE_RECORDS for s in args.sizes):
        ap.error(f"--sizes must be multiples of {FILE_RECORDS:,}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        result = json.loads(args.render.read_text())
        result["summary"] = summarize([Run(**r) for r in result["runs"]])
        result["decode_only"] = decode_only(result["summary"])
        result["marginal"] = marginal(result["summary"])
        write_json(args.render, result)
        md = render_md(result)
        args.render.with_suffix(".md").write_text(md)
        if not args.no_readme and args.render.resolve().parent == RESULTS:
            update_readme(md)
        print(md)
        return 0
    temp = None
    if args.workdir is None:
        temp = tempfile.mkdtemp(prefix="mqd-typed-decode-")
        args.workdir = Path(temp)
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run_bench(args)
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    stem = "typed_decode-quick" if args.quick else "typed_decode"
    write_json(args.out / f"{stem}.json", result)
    md = render_md(result)
    (args.out / f"{stem}.md").write_text(md)
    if not args.quick and not args.no_readme and args.out == RESULTS:
        update_readme(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
