"""``python -m bench.spark_s3_files``: ``mqd spark --once`` over an ``s3://`` landing of many small
files, per code tree, interleaved.

A landing on S3 that a slow topic fills holds many small files (chaos on SeaweedFS: ~5,600 files of
~70 records). The job reads it through its Python data source (mqd/spark/landing_source.py). What
runs:

1. SeaweedFS on 127.0.0.1 (mqd.testing.SeaweedFS); per size, a landing prefix of N files over 4
   partitions, ``--records`` (60) records of 100 B each, published once with this tree's
   ``Publisher`` (every variant reads the same landing).
2. Rounds (``--rounds``): per size, every variant (``--variant name=tree``, default this tree) runs
   ``python -m mqd.operator.cli spark --once`` into a fresh table and checkpoint, the order rotated
   each round. Per run: wall from spawn to exit, CPU of the process tree (Spark's JVM too: this
   process reaps it, bench.spark_once.timed_run), when the query started and ended; the table, read by
   delta-rs, must hold every landed record.
3. Summary: median [min-max] per (size, variant), and each variant's wall over the first's, paired
   round by round.

Results: ``results/spark_s3_files.json`` and ``.md``.

    python -m bench.spark_s3_files --variant base=/tmp/mqd-base --variant new=. --sizes 400,2000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.common import RESULTS, become_subreaper, machine_facts, variant_trees, write_json
from bench.spark_once import table_rows, timed_run

PARTITIONS = 4
TOPIC = "events"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def land(objects: Any, files: int, records: int, partitions: int = PARTITIONS) -> None:
    """``files`` files of ``records`` records, round-robin over ``partitions``, offsets dense."""
    from mqd.landing import Publisher
    from mqd.landing.store import LandingStore
    from mqd.wire import format as fmt

    store = LandingStore(objects)
    store.open()
    pub = Publisher(store)
    value = b"x" * 100
    for i in range(files):
        p, first = i % partitions, (i // partitions) * records
        raw = fmt.encode_batch([value] * records, timestamps=[T0] * records, base_offset=first)
        batch = fmt.to_arrow(raw, fmt.scan(raw)[0])
        pub.publish(TOPIC, p, pa.Table.from_batches([batch]), store.head(TOPIC, p).last_offset)


def job_config(path: Path, uri: str, endpoint: str) -> Path:
    from mqd.testing import to_toml

    path.mkdir(parents=True)
    spark = {
        # the table's name is the query's, which the landing's lifecycle registers once per landing
        "output_dir": str(path / f"table-{path.name}"),
        "checkpoint_dir": str(path / "ckpt"),
        "quarantine_dir": str(path / "quarantine"),
        "max_files_per_trigger": 1_000_000,  # one batch: what a job that was down meets
    }
    s3 = {"endpoint_url": endpoint, "region": "us-east-1"}
    cfg = path / "mqd.toml"
    cfg.write_text(to_toml({"landing": {"dir": uri}, "landing.s3": s3, "spark": spark}))
    return cfg


def summarize(runs: list[dict[str, Any]], names: list[str], sizes: list[int]) -> list[dict[str, Any]]:
    out = []
    for size, name in itertools.product(sizes, names):
        mine = [r for r in runs if r["size"] == size and r["variant"] == name]
        row: dict[str, Any] = {"size": size, "variant": name, "runs": len(mine)}
        row["exact"] = all(r["exact"] for r in mine)
        for key in ("wall_s", "cpu_s", "query_s"):
            values = [r[key] for r in mine if r.get(key) is not None]
            row[key] = [statistics.median(values), min(values), max(values)] if values else None
        first = {r["round"]: r for r in runs if r["size"] == size and r["variant"] == names[0]}
        ratios = [r["wall_s"] / first[r["round"]]["wall_s"] for r in mine if r["round"] in first]
        row["wall_vs_first"] = round(statistics.median(ratios), 3) if ratios else None
        out.append(row)
    return out


def machine(facts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in facts.items() if isinstance(v, (str, int, float)))


def render_md(result: dict[str, Any]) -> str:
    def cell(v: list[float] | None) -> str:
        return "-" if v is None else f"{v[0]:.1f} [{v[1]:.1f}-{v[2]:.1f}]"

    lines = [
        f"Run {result['started']} on {machine(result['machine'])}; {result['rounds']} rounds, "
        "variants interleaved; "
        f"{PARTITIONS} partitions, {result['records']} records of 100 B a file; SeaweedFS on 127.0.0.1. "
        "Medians [min-max].",
        "",
        "| files | variant | wall s | CPU s (tree) | query s | wall / first (paired) | exact |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['size']:,} | {r['variant']} | {cell(r['wall_s'])} | {cell(r['cpu_s'])} | "
            f"{cell(r['query_s'])} | {r['wall_vs_first']} | {r['exact']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="400,2000", help="files in the landing (default 400,2000)")
    ap.add_argument("--records", type=int, default=60, help="records per file")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variant", action="append", help="name=tree (default: this tree as 'this')")
    ap.add_argument("--out", type=Path, default=RESULTS / "spark_s3_files.json")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    trees = variant_trees(args.variant)
    names = list(trees)
    become_subreaper()

    from mqd.landing.s3_objects import S3Objects
    from mqd.testing.seaweedfs import SeaweedFS

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-s3files-") as tmp, SeaweedFS(Path(tmp) / "weed") as sw:
        work = Path(tmp)
        uris = {}
        for size in sizes:
            uris[size] = f"s3://{sw.bucket}/files-{size}"
            t = time.monotonic()
            land(S3Objects(uris[size], client=sw.client(sw.endpoints[0])), size, args.records)
            print(f"landed {size} files in {time.monotonic() - t:.1f} s", flush=True)
        for rnd, size in itertools.product(range(args.rounds), sizes):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                run_dir = work / f"run-{size}-{name}-{rnd}"
                cfg = job_config(run_dir, uris[size], sw.endpoint)
                env = {**os.environ, **sw.env(), "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(trees[name])}
                argv_ = [sys.executable, "-m", "mqd.operator.cli", "spark", "--once", "-c", str(cfg)]
                r = timed_run(
                    argv_,
                    env,
                    trees[name],
                    run_dir / "run.log",
                    pipeline=name,
                    size=size,
                    mode="catch-up",
                    rnd=rnd,
                )
                rows = table_rows(run_dir / f"table-{run_dir.name}") if r.exit_code == 0 else -1
                q0, q1 = r.phases.get("query_started"), r.phases.get("query_done")
                runs.append(
                    {
                        "variant": name,
                        "size": size,
                        "round": rnd,
                        "wall_s": r.wall_s,
                        "cpu_s": r.cpu_s,
                        "query_s": round(q1 - q0, 3) if q0 is not None and q1 is not None else None,
                        "exit_code": r.exit_code,
                        "exact": rows == size * args.records,
                        "load_1m": r.load_1m,
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
    result = {
        "started": started,
        "machine": machine_facts(),
        "rounds": args.rounds,
        "records": args.records,
        "variants": {k: str(v) for k, v in trees.items()},
        "runs": runs,
        "summary": summarize(runs, names, sizes),
    }
    write_json(args.out, result)
    md = render_md(result)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if all(r["exact"] and r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
