"""``make demo``: the whole path on one machine, in about a minute.

1. starts a single-node broker (a subprocess, port 9400 or a free one if that is taken),
2. produces 100,000 records to ``events`` (8 partitions),
3. runs the daemon in burst mode (``mqd run --burst``): it lands the backlog as Parquet under
   ``./demo-data/landing``, commits, and exits,
4. runs the Spark job once (``mqd spark --once``) into the Delta Lake table
   ``./demo-data/warehouse/events``,
5. prints a count query over the table in Spark, counts it again with delta-rs (a reader that is not
   Spark), then stops everything.

Everything lives under ``./demo-data`` (wiped at the start of each run, except what other tools put
there). ``python -m mqd_dev.demo --records N`` changes the count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mqd.testing import (
    ManagedProcess,
    NodeAddress,
    ProcessError,
    broker_argv,
    cluster_toml,
    free_port,
    get_json,
    node_toml,
)

TOPIC = "events"
PARTITIONS = 8
GROUP = "demo"
# what the demo owns under demo-data/ (and so may wipe)
_OWNED = ("broker", "landing", "warehouse", "state", "broker.toml", "cluster.toml", "mqd.toml", "broker.log")


def _write_configs(base: Path, port: int) -> tuple[Path, Path]:
    url = f"http://127.0.0.1:{port}"
    node = NodeAddress("single", "broker-a", "master", url)
    topics = [{"name": TOPIC, "partitions": PARTITIONS}]
    (base / "cluster.toml").write_text(cluster_toml([node.group], [node], topics))
    broker = base / "broker.toml"
    settings = {"log_level": "warning", "log_format": "json"}
    broker.write_text(node_toml(node.id, Path("cluster.toml"), Path("broker"), port, settings))
    daemon = base / "mqd.toml"
    daemon.write_text(
        f'[consumer]\ngroup = "{GROUP}"\nclient_id = "demo-daemon"\nbootstrap = ["{url}"]\n'
        f'topics = ["{TOPIC}"]\nconsume_from = "first"\n\n'
        '[landing]\ndir = "landing"\nmax_age = 1.0\n\n'
        '[spark]\noutput_dir = "warehouse/events"\ncheckpoint_dir = "warehouse/_checkpoints/events"\n'
        'quarantine_dir = "warehouse/_quarantine/events"\nshuffle_partitions = 2\n\n'
        '[admin]\nenabled = false\n\n[log]\nlevel = "warning"\nformat = "console"\n\n'
        '[daemon]\nstate_dir = "state"\npid_file = "state/mqd.pid"\nlog_file = "state/mqd.log"\n'
        "watchdog = false\n"
    )
    return broker, daemon


def _healthy(url: str) -> bool:
    return get_json(f"{url}/v1/health", 1) is not None


def _step(msg: str) -> None:
    print(f"\n== {msg}", flush=True)


def run(base: Path, records: int, timeout: float = 300.0) -> int:
    from mqd.config import load_daemon_config
    from mqd.operator.produce_command import produce_cli

    base.mkdir(parents=True, exist_ok=True)
    for name in _OWNED:
        p = base / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    port = free_port(9400)
    url = f"http://127.0.0.1:{port}"
    broker_cfg, daemon_cfg = _write_configs(base, port)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    broker = ManagedProcess("broker", broker_argv(broker_cfg), base / "broker.log", env=env)
    try:
        _step(f"starting a single-node broker on {url} (log: {base / 'broker.log'})")
        broker.start()
        try:
            broker.wait_ready(lambda: _healthy(url), timeout=30, interval=0.1)
        except ProcessError:
            print(
                f"error: the broker exited with {broker.returncode}; see {base / 'broker.log'}",
                file=sys.stderr,
            )
            return 1
        except TimeoutError:
            print("error: the broker did not become healthy in 30 s", file=sys.stderr)
            return 1

        _step(f"producing {records:,} records of 100 bytes to {TOPIC!r} ({PARTITIONS} partitions)")
        code = produce_cli(url, TOPIC, records, 100, 0.0, 0, 1000, "master", None)
        if code != 0:
            return code

        _step(f"landing them: mqd run --burst (Parquet under {base / 'landing'})")
        t0 = time.perf_counter()
        try:
            daemon = subprocess.run(
                [sys.executable, "-m", "mqd.operator.cli", "run", "--config", str(daemon_cfg), "--burst"],
                env=env,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            print(f"error: the daemon did not finish in {timeout:.0f} s", file=sys.stderr)
            return 1
        if daemon.returncode != 0:
            print(f"error: the daemon exited with {daemon.returncode}", file=sys.stderr)
            return 1
        files = [p for p in (base / "landing").rglob("*.parquet") if not p.name.startswith(".")]
        print(f"landed {len(files)} files in {time.perf_counter() - t0:.1f} s")

        _step("appending them to the table: mqd spark --once")
        config = load_daemon_config(daemon_cfg)
        return _spark(config, records)
    finally:
        broker.stop(timeout=15.0)


def _spark(config: Any, records: int) -> int:
    from mqd.spark.job import build_session
    from mqd.spark.job import run as run_job

    # quiet console: no progress bars, no "hostname resolves to a loopback address" warning
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.ui.showConsoleProgress=false pyspark-shell")
    spark = build_session(config)  # the job reuses this session, so it is still there for the query
    spark.sparkContext.setLogLevel("ERROR")
    try:
        code = run_job(config, once=True, master=None)
        if code != 0:
            print(f"error: the Spark job exited with {code}", file=sys.stderr)
            return code
        table = str(config.spark.output_dir)
        _step(f"SELECT partition, count(*) FROM delta.`{table}` GROUP BY partition")
        df = spark.read.format("delta").load(table)
        df.groupBy("partition").count().orderBy("partition").show(PARTITIONS * 2, truncate=False)
        total = df.count()
        distinct = df.select("partition", "offset").distinct().count()
        print(f"total rows: {total:,} (distinct partition/offset pairs: {distinct:,}; produced: {records:,})")
        if total != records or distinct != records:
            print("error: the table does not hold each produced record exactly once", file=sys.stderr)
            return 1
        _step("the same table read by delta-rs (pip install deltalake), without Spark")
        from deltalake import DeltaTable

        rows = DeltaTable(table).to_pyarrow_table(columns=["partition", "offset"]).num_rows
        print(f"delta-rs: {rows:,} rows at version {DeltaTable(table).version()}")
        if rows != records:
            print("error: delta-rs does not read each produced record exactly once", file=sys.stderr)
            return 1
        print("ok: every record is in the table exactly once")
        return 0
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mqd_dev.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=Path("demo-data"), help="where everything goes")
    args = ap.parse_args(argv)
    if args.records < 1:
        ap.error("--records must be >= 1")
    return run(args.dir.resolve(), args.records)


if __name__ == "__main__":
    sys.exit(main())
