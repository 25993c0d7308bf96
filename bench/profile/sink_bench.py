"""The sink alone: Parquet encoding of daemon-shaped tables under different writer settings.

The input is built the way the daemon builds it: the bench workload's values encoded into wire
batches (``format.encode_batch``, 1000 records each), decoded with ``format.to_arrow`` (slices over
the wire buffers, one chunk per batch), per partition ``layout.concat`` + ``layout.landing_table``.
Each setting writes every partition's table to its own file, like one flush of the daemon; the
time is the encode (no fsync: ``--fsync`` adds one per file). CPU seconds are this process's.

    python bench/profile/sink_bench.py --records 500000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]

import common  # noqa: E402,F401
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from common import Workload  # noqa: E402

from mqd import format as fmt  # noqa: E402
from mqd.landing import layout  # noqa: E402

CURRENT: dict[str, Any] = {  # layout.write_parquet today
    "compression": "snappy",
    "use_dictionary": ["topic", "key"],
    "write_statistics": ["partition", "offset", "timestamp"],
}


def daemon_tables(work: Workload) -> list[pa.Table]:
    """One landing table per partition, chunked like drained batches."""
    per_part: dict[int, list[pa.RecordBatch]] = {}
    offsets: dict[int, int] = {}
    now = fmt.now_ms()
    for p, values in work.chunks():
        base = offsets.get(p, 0)
        ts = np.full(len(values), now, dtype=np.int64)
        wire = fmt.encode_batch(values, timestamps=ts, base_offset=base)
        info = fmt.read_header(wire)
        per_part.setdefault(p, []).append(fmt.to_arrow(pa.py_buffer(wire), info))
        offsets[p] = base + len(values)
    return [layout.landing_table("events", p, layout.concat(b)) for p, b in sorted(per_part.items())]


def write(path: Path, table: pa.Table, opts: dict[str, Any], fsync: bool) -> int:
    pq.write_table(table, path, **opts)
    if fsync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return path.stat().st_size


def measure(
    name: str,
    tables: list[pa.Table],
    opts: dict[str, Any],
    out_dir: Path,
    *,
    threads: int = 1,
    fsync: bool = False,
    prepare: Callable[[pa.Table], pa.Table] | None = None,
    repeat: int = 3,
) -> dict[str, Any]:
    records = sum(t.num_rows for t in tables)
    walls, cpus = [], []
    size = 0
    for r in range(repeat):
        paths = [out_dir / f"s{abs(hash(name))}-{r}-{i}.parquet" for i in range(len(tables))]
        cpu0, t0 = time.process_time(), time.perf_counter()
        inputs = [prepare(t) for t in tables] if prepare else tables
        if threads == 1:
            sizes = [write(p, t, opts, fsync) for p, t in zip(paths, inputs, strict=True)]
        else:
            with ThreadPoolExecutor(threads) as pool:
                pairs = zip(paths, inputs, strict=True)
                sizes = list(pool.map(lambda pt: write(pt[0], pt[1], opts, fsync), pairs))
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - cpu0)
        size = sum(sizes)
        for p in paths:
            p.unlink()
    wall = float(np.median(walls))
    return {
        "name": name,
        "records_per_s": round(records / wall),
        "wall_s": round(wall, 3),
        "cpu_s": round(float(np.median(cpus)), 3),
        "mb": round(size / 2**20, 1),
        "threads": threads,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", action="append", default=[], help="run only these setting names")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    args = ap.parse_args()
    work = Workload(args.records, args.size, args.partitions, 1000)
    tables = daemon_tables(work)
    nostats = {**CURRENT, "write_statistics": False}
    per_column = {c: ("none" if c == "value" else "snappy") for c in layout.LANDING_SCHEMA.names}
    settings: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("current (snappy, dict topic+key, stats partition/offset/ts)", CURRENT, {}),
        ("compression=none", {**CURRENT, "compression": None}, {}),
        ("compression=lz4", {**CURRENT, "compression": "lz4"}, {}),
        ("compression=zstd(level 1)", {**CURRENT, "compression": "zstd", "compression_level": 1}, {}),
        ("compression=zstd(default 3)", {**CURRENT, "compression": "zstd"}, {}),
        ("use_dictionary=True (all columns)", {**CURRENT, "use_dictionary": True}, {}),
        ("use_dictionary=False", {**CURRENT, "use_dictionary": False}, {}),
        ("write_statistics=True (all, incl. value)", {**CURRENT, "write_statistics": True}, {}),
        ("write_statistics=False", nostats, {}),
        ("value column uncompressed (snappy elsewhere)", {**CURRENT, "compression": per_column}, {}),
        ("row_group_size=65536", {**CURRENT, "row_group_size": 65_536}, {}),
        ("row_group_size=262144", {**CURRENT, "row_group_size": 262_144}, {}),
        ("data_page_size=8MiB", {**CURRENT, "data_page_size": 8 * 2**20}, {}),
        ("store_schema=False", {**CURRENT, "store_schema": False}, {}),
        ("combine_chunks before write", CURRENT, {"prepare": lambda t: t.combine_chunks()}),
        ("current, 2 threads (2 files at once)", CURRENT, {"threads": 2}),
        ("compression=none, 2 threads", {**CURRENT, "compression": None}, {"threads": 2}),
        ("current + fsync per file", CURRENT, {"fsync": True}),
        ("current + fsync, 2 threads", CURRENT, {"fsync": True, "threads": 2}),
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="mqd-sink-", dir=args.out if args.out.exists() else None) as tmp:
        for name, opts, kw in settings:
            if args.only and name not in args.only:
                continue
            r = measure(name, tables, opts, Path(tmp), repeat=args.repeat, **kw)
            results.append(r)
            print(
                f"{r['records_per_s']:>10,} rec/s  cpu {r['cpu_s']:6.3f} s  wall {r['wall_s']:6.3f} s  "
                f"{r['mb']:6.1f} MB  {name}",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sink.json").write_text(json.dumps({"records": args.records, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
