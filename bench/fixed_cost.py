"""The daemon's fixed cost per run (issue 34): spawn to first fetch, and CPU seconds as the intercept
of CPU against run size, for each source, per code tree, interleaved.

One mqd broker cluster and (when the benchmark extras are installed) one Tansu broker hold the same
records at two sizes, a topic per size. Each round runs every variant (a code tree: a checkout of
mqd) on every source at both sizes, in an order rotated per round, each run ``mqd run --burst`` with
a fresh group and landing over its whole topic, configured as a user runs it (the admin endpoint
on, JSON logs). Per run: CPU seconds of the process, spawn to its first fetch (the ``first fetch
sent`` log line), spawn to exit (wall), the tail from its ``burst complete`` line to its exit, whether
it landed every record. Per variant and source: the medians, and the fixed cost, CPU and wall, as
the intercept of the line through the round's two sizes, its median over rounds (the wall's decides
the whole-process ratio of a small run, bench/README.md "The shapes")::

    python -m bench.fixed_cost                          # this tree, both sources, 5 rounds
    python -m bench.fixed_cost --variant base=/tmp/mqd-base --variant new=. --rounds 7

A tree's modules are compiled before the first round (``compileall``): an installed package has
its bytecode, and ``PYTHONDONTWRITEBYTECODE`` in the environment would otherwise make every run
compile mqd again.
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import alt_kafka, common
from bench import pipeline as pl
from bench.common import WatchedProcess, Workload
from mqd.testing import LocalCluster, to_toml
from mqd.testing.configfiles import daemon_section
from mqd.testing.tansu import Tansu

PARTITIONS = 12
VALUE_SIZE = 100
RESULTS = Path(__file__).resolve().parent / "results"


def topic(size: int) -> str:
    return f"fixed-{size}"


def daemon_config(
    path: Path, source: str, bootstrap: list[str], size: int, group: str, landing: Path
) -> Path:
    """A daemon over ``topic(size)``: the mqd broker source in a consumer group, or the Kafka
    source in broadcast mode (no group join: the issue's setting for the Kafka side)."""
    state = path.parent / f"state-{group}"
    consumer: dict[str, Any] = {
        "group": group,
        "client_id": f"{group}-daemon",
        "bootstrap": bootstrap,
        "topics": [topic(size)],
        "consume_from": "first",
    }
    if source == "kafka":
        consumer |= {"source": "kafka", "mode": "broadcast", "offset_file": str(state / "offsets.json")}
    body = {
        "consumer": consumer,
        "landing": {
            "dir": str(landing),
            "max_records": 500_000,
            "max_bytes": 32 * 2**20,
            "max_age": 5.0,
            "compression": "snappy",
        },
        "admin": {"enabled": True, "host": "127.0.0.1", "port": 0},
        "log": {"level": "info", "format": "json"},
        "daemon": daemon_section(state),
    }
    path.write_text(to_toml(body))
    return path


def run_once(
    variant: str, tree: Path, source: str, bootstrap: list[str], size: int, workdir: Path, tag: str
) -> dict[str, Any]:
    group = f"fc-{variant}-{source}-{size}-{tag}"
    landing = workdir / f"landing-{group}"
    cfg = daemon_config(workdir / f"{group}.toml", source, bootstrap, size, group, landing)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    # a tree from before issue 32 moved the CLI into mqd/operator/ has it at mqd/cli.py
    cli = "mqd.operator.cli" if (tree / "mqd" / "operator" / "cli.py").exists() else "mqd.cli"
    proc = WatchedProcess(
        [sys.executable, "-m", cli, "run", "--config", str(cfg), "--burst"],
        log_path=workdir / f"{group}.log",
        cwd=workdir,
        env=env,
    )
    load = os.getloadavg()[0]
    proc.start()
    stats = proc.finish(300.0)
    if stats.exit_code != 0:
        tail = proc.log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{group}: exit {stats.exit_code}:\n{tail}")
    landed = pl.LandedCounter(landing, topic(size))()
    shutil.rmtree(landing, ignore_errors=True)
    first = common.log_event_time(proc.log_path, "first fetch sent")
    complete = common.log_event_time(proc.log_path, "burst complete")
    exited = stats.started_at + stats.wall_s
    return {
        "variant": variant,
        "source": source,
        "size": size,
        "exact": landed == size,
        "landed": landed,
        "cpu_s": round(stats.cpu_s, 3),
        "wall_s": round(stats.wall_s, 3),
        "spawn_to_first_fetch_s": round(first - stats.started_at, 3) if first else None,
        "tail_s": round(exited - complete, 3) if complete else None,
        "load": round(load, 2),
    }


def intercept(small: dict[str, Any], big: dict[str, Any], key: str = "cpu_s") -> tuple[float, float]:
    """(fixed seconds, seconds per million records) of the line through two runs' ``key``."""
    slope = (big[key] - small[key]) / (big["size"] - small["size"])
    return small[key] - slope * small["size"], slope * 1e6


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summarize(runs: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["variant"], r["source"]) for r in runs}, key=lambda k: (k[1], k[0]))
    lo, hi = min(sizes), max(sizes)
    for variant, source in keys:
        mine = [r for r in runs if r["variant"] == variant and r["source"] == source]
        rounds = sorted({r["round"] for r in mine})
        pairs = [{r["size"]: r for r in mine if r["round"] == n} for n in rounds]
        pairs = [p for p in pairs if lo in p and hi in p]
        fits = [intercept(p[lo], p[hi]) for p in pairs]
        walls = [intercept(p[lo], p[hi], "wall_s") for p in pairs]
        row: dict[str, Any] = {
            "variant": variant,
            "source": source,
            "runs": len(mine),
            "exact": all(r["exact"] for r in mine),
            "spawn_to_first_fetch_s": _median(
                [r["spawn_to_first_fetch_s"] for r in mine if r["spawn_to_first_fetch_s"] is not None]
            ),
            "fixed_cpu_s": _median([f[0] for f in fits]),
            "cpu_s_per_million": _median([f[1] for f in fits]),
            "fixed_wall_s": _median([f[0] for f in walls]),
            "wall_s_per_million": _median([f[1] for f in walls]),
            "tail_s": _median([r["tail_s"] for r in mine if r.get("tail_s") is not None]),
            "load": round(statistics.median(r["load"] for r in mine), 2),
        }
        for size in sizes:
            row[f"cpu_s_at_{size}"] = _median([r["cpu_s"] for r in mine if r["size"] == size])
            row[f"wall_s_at_{size}"] = _median([r["wall_s"] for r in mine if r["size"] == size])
        out.append(row)
    return out


def paired(runs: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Each variant against the first, run by run: the difference of CPU, wall and tail of the two
    runs of one source and size in one round (they ran within a minute, so a burst of load from
    elsewhere hits both alike), its median over rounds. Negative: the variant costs less."""
    names = list(dict.fromkeys(r["variant"] for r in runs))
    cell = {(r["variant"], r["source"], r["size"], r["round"]): r for r in runs}
    out = []
    for name in names[1:]:
        for source in sorted({r["source"] for r in runs}):
            for size in sizes:
                pairs = [
                    (cell[(names[0], source, size, n)], r)
                    for (v, src, sz, n), r in cell.items()
                    if (v, src, sz) == (name, source, size) and (names[0], source, size, n) in cell
                ]
                row: dict[str, Any] = {"variant": name, "against": names[0], "source": source, "size": size}
                for key in ("cpu_s", "wall_s", "tail_s"):
                    diffs = [
                        b[key] - a[key] for a, b in pairs if a.get(key) is not None and b.get(key) is not None
                    ]
                    row[key] = _median(diffs)
                row["rounds"] = len(pairs)
                out.append(row)
    return out


def markdown(result: dict[str, Any]) -> str:
    sizes = result["sizes"]
    head = (
        "| source | variant | spawn → first fetch s | fixed CPU-s | CPU-s per M | fixed wall s | wall s per M"
        " | burst complete → exit s | " + " | ".join(f"CPU-s at {s:,} | wall s at {s:,}" for s in sizes)
    )
    lines = [head + " | exact | load |", "|" + "---|" * (10 + 2 * len(sizes))]
    for r in result["summary"]:
        cells = [
            r["source"],
            r["variant"],
            r["spawn_to_first_fetch_s"],
            r["fixed_cpu_s"],
            r["cpu_s_per_million"],
            r.get("fixed_wall_s"),
            r.get("wall_s_per_million"),
            r.get("tail_s"),
        ]
        for size in sizes:
            cells += [r[f"cpu_s_at_{size}"], r.get(f"wall_s_at_{size}")]
        cells += [r["exact"], r["load"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if result.get("paired"):
        lines += [
            "",
            "| source | size | variant - first, paired per round (median) | CPU-s | wall s | tail s | rounds"
            " |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in result["paired"]:
            cells = [p["source"], f"{p['size']:,}", f"{p['variant']} - {p['against']}"]
            cells += [p["cpu_s"], p["wall_s"], p["tail_s"], p["rounds"]]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="200000,1000000", help="two run sizes, records")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variant", action="append", help="name=tree (default: this tree as 'this')")
    ap.add_argument("--source", default="mqd,kafka", help="mqd, kafka or both")
    ap.add_argument("--out", type=Path, default=RESULTS / "fixed_cost.json")
    ap.add_argument("--again", type=Path, help="summarize the runs of this result file again (no runs)")
    args = ap.parse_args()
    if args.again is not None:
        result = json.loads(args.again.read_text())
        result["summary"] = summarize(result["runs"], result["sizes"])
        result["paired"] = paired(result["runs"], result["sizes"])
        common.write_json(args.again, result)
        args.again.with_suffix(".md").write_text(markdown(result))
        print(markdown(result))
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(","))
    variants = [
        (name, Path(tree).resolve())
        for name, _, tree in (v.partition("=") for v in (args.variant or [f"this={Path.cwd()}"]))
    ]
    sources = args.source.split(",")
    if "kafka" in sources and (why := alt_kafka.tansu_available()):
        print(f"kafka source skipped: {why}", flush=True)
        sources.remove("kafka")
    for name, tree in variants:
        if not any((tree / "mqd" / "sources" / "kafka").glob("_rbv2*.so")):
            # the pure-Python fallback decodes ~10x slower: the Kafka rows would measure it
            raise SystemExit(
                f"{name}: {tree} has no compiled records kernel; build it there with "
                "`python setup.py build_ext --inplace`"
            )
        compileall.compile_dir(tree / "mqd", quiet=1)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mqd-fixed-") as tmp:
        workdir = Path(tmp)
        cluster = LocalCluster(
            workdir / "cluster",
            topics={topic(s): PARTITIONS for s in sizes},
            groups=1,
            slaves=0,
            node_settings={"log_level": "warning"},
        )
        tansu = Tansu(workdir / "tansu") if "kafka" in sources else None
        with cluster:
            urls = list(cluster.urls.values())
            for s in sizes:
                asyncio.run(pl.produce_workload(urls, topic(s), Workload(s, VALUE_SIZE, PARTITIONS, 1000), 4))
            try:
                if tansu is not None:
                    tansu.start()
                    for s in sizes:
                        tansu.create_topic(topic(s), PARTITIONS)
                        alt_kafka.produce(
                            tansu.bootstrap, topic(s), Workload(s, VALUE_SIZE, PARTITIONS, 1000)
                        )
                boot = {"mqd": urls, "kafka": [tansu.bootstrap] if tansu else []}
                cells = list(itertools.product(variants, sources, sizes))
                for n in range(args.rounds):
                    k = n % len(cells)
                    for (variant, tree), source, size in cells[k:] + cells[:k]:
                        r = run_once(variant, tree, source, boot[source], size, workdir, str(n))
                        r["round"] = n
                        runs.append(r)
                        print(json.dumps(r), flush=True)
            finally:
                if tansu is not None:
                    tansu.stop()
    result = {
        "sizes": sizes,
        "rounds": args.rounds,
        "machine": common.machine_facts(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
        "summary": summarize(runs, sizes),
        "paired": paired(runs, sizes),
    }
    common.write_json(args.out, result)
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(r["exact"] for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
