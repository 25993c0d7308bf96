"""``python -m bench.chain_read``: one reader's passes over the claim chains of an ``s3://``
landing (mqd/landing/chain_reader.py), per code tree, interleaved.

Every start of the Spark job's s3 source reads every live claim once (its reader starts empty),
every trigger reads each chain's floor and listing, and the lifecycle's cleaner does the same. What
runs:

1. SeaweedFS on 127.0.0.1 (mqd.testing.SeaweedFS); per shape ``FILESxPARTITIONS``, a landing prefix
   of that many files of 10 records, round-robin over the partitions (bench.spark_s3_files.land).
2. Rounds: per shape and per added latency (``--latency-ms``: every request made through the
   reader's Objects first sleeps that long, a remote store's round trip; 0 is loopback as it is),
   every variant (``--variant name=tree``) runs a fresh process with that tree's ``mqd`` that times
   a ``ChainReader``'s first pass (cold: every claim), then a second one (nothing new: what each
   trigger pays), the order rotated each round. Each pass must show every landed file.
3. Summary: median [min-max] per (shape, latency, variant), and the first pass's time over the
   first variant's, paired round by round.

Results: ``results/chain_read.json`` and ``.md``.

    python -m bench.chain_read --variant base=/tmp/mqd-base --variant new=. --shapes 2000x4,400x100
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, machine_facts, variant_trees, write_json
from bench.spark_s3_files import land, machine

RECORDS = 10

# run in the variant's tree: only its mqd is imported
CHILD = """
import json, sys, time
from mqd.landing.chain_reader import ChainReader
from mqd.landing.s3_objects import S3Objects

uri, endpoint, latency = sys.argv[1], sys.argv[2], float(sys.argv[3]) / 1000
inner = S3Objects(uri, endpoint_url=endpoint, region="us-east-1")

class Remote:
    # every request first waits one round trip (time.sleep releases the GIL, as a socket wait does)
    location = inner.location
    def get(self, key):
        time.sleep(latency); return inner.get(key)
    def head(self, key):
        time.sleep(latency); return inner.head(key)
    def list_objects(self, prefix, start_after=""):
        time.sleep(latency); return inner.list_objects(prefix, start_after)
    def list_dirs(self, prefix):
        time.sleep(latency); return inner.list_dirs(prefix)

reader = ChainReader(Remote() if latency else inner)
t0 = time.perf_counter(); c0 = time.process_time()
first = sum(len(v.files) for v in reader.refresh().values())
t1 = time.perf_counter(); c1 = time.process_time()
reader.refresh()
t2 = time.perf_counter()
print(json.dumps({"files": first, "first_s": t1 - t0, "first_cpu_s": c1 - c0, "idle_s": t2 - t1}))
"""


def summarize(runs: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["shape"], r["latency_ms"]) for r in runs}, key=lambda k: (k[1], k[0]))
    for (shape, lat), name in itertools.product(keys, names):
        mine = [r for r in runs if (r["shape"], r["latency_ms"], r["variant"]) == (shape, lat, name)]
        row: dict[str, Any] = {"shape": shape, "latency_ms": lat, "variant": name, "runs": len(mine)}
        row["exact"] = all(r["exact"] for r in mine)
        for key in ("first_s", "first_cpu_s", "idle_s"):
            values = [r[key] for r in mine]
            row[key] = [statistics.median(values), min(values), max(values)] if values else None
        first = {
            r["round"]: r
            for r in runs
            if (r["shape"], r["latency_ms"], r["variant"]) == (shape, lat, names[0])
        }
        ratios = [r["first_s"] / first[r["round"]]["first_s"] for r in mine if r["round"] in first]
        row["first_vs_first"] = round(statistics.median(ratios), 3) if ratios else None
        out.append(row)
    return out


def render_md(result: dict[str, Any]) -> str:
    def cell(v: list[float] | None) -> str:
        return "-" if v is None else f"{v[0]:.2f} [{v[1]:.2f}-{v[2]:.2f}]"

    lines = [
        f"Run {result['started']} on {machine(result['machine'])}; {result['rounds']} rounds, "
        f"variants interleaved; files of {RECORDS} records; SeaweedFS on 127.0.0.1, plus the added "
        "latency per request. Medians [min-max].",
        "",
        "| files x partitions | latency ms | variant | first pass s | its CPU s | idle pass s "
        "| first / first variant (paired) | exact |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['shape']} | {r['latency_ms']} | {r['variant']} | {cell(r['first_s'])} | "
            f"{cell(r['first_cpu_s'])} | {cell(r['idle_s'])} | {r['first_vs_first']} | {r['exact']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="2000x4,400x100", help="FILESxPARTITIONS, comma-separated")
    ap.add_argument("--latency-ms", default="0,20", help="added per request, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", action="append", help="name=tree (default: this tree as 'this')")
    ap.add_argument("--out", type=Path, default=RESULTS / "chain_read.json")
    args = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    latencies = [float(x) for x in args.latency_ms.split(",")]
    trees = variant_trees(args.variant)
    names = list(trees)

    from mqd.landing.s3_objects import S3Objects
    from mqd.testing.seaweedfs import SeaweedFS

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-chainread-") as tmp, SeaweedFS(Path(tmp) / "weed") as sw:
        uris = {}
        for files, parts in shapes:
            shape = f"{files}x{parts}"
            uris[shape] = f"s3://{sw.bucket}/chains-{shape}"
            t = time.monotonic()
            land(S3Objects(uris[shape], client=sw.client(sw.endpoints[0])), files, RECORDS, parts)
            print(f"landed {shape} in {time.monotonic() - t:.1f} s", flush=True)
        for rnd, (files, parts), lat in itertools.product(range(args.rounds), shapes, latencies):
            shape = f"{files}x{parts}"
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for name in order:
                env = {**os.environ, **sw.env(), "PYTHONPATH": str(trees[name])}
                argv_ = [sys.executable, "-c", CHILD, uris[shape], sw.endpoint, str(lat)]
                done = subprocess.run(
                    argv_, env=env, cwd=trees[name], capture_output=True, text=True, timeout=1800
                )
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    return 1
                got = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append(
                    {
                        "variant": name,
                        "shape": shape,
                        "latency_ms": lat,
                        "round": rnd,
                        **{k: round(v, 4) for k, v in got.items() if k != "files"},
                        "exact": got["files"] == files,
                        "load_1m": round(os.getloadavg()[0], 2),
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
    result = {
        "started": started,
        "machine": machine_facts(),
        "rounds": args.rounds,
        "variants": {k: str(v) for k, v in trees.items()},
        "runs": runs,
        "summary": summarize(runs, names),
    }
    write_json(args.out, result)
    md = render_md(result)
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return 0 if all(r["exact"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
