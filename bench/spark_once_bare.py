"""The alternative at its best for bench/spark_once.py: the same landing to Delta in plain PySpark.

What a careful user writes without mqd: Spark's file source on the landing with the landing's schema
(never inferred), Delta's streaming sink, ``trigger(availableNow=True)``, its own checkpoint, the
same Delta jars from the same Ivy cache on the driver's class path (no resolution at start, no copy:
the fastest way to load them) and the same session settings as mqd's job, all given by the benchmark as
``--conf key=value``. Run by path (``python bench/spark_once_bare.py``), so that it imports pyspark
and nothing of mqd or the benchmark: its start-up is its own. Prints ``bare_session``,
``bare_started`` and ``bare_done rows=<n>`` as it gets there (the benchmark times them).
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--landing", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--ddl", required=True, help="the landing's schema as Spark DDL")
    p.add_argument("--max-files", type=int, required=True, help="maxFilesPerTrigger")
    p.add_argument("--partition-by", default="topic,dt")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--conf", action="append", default=[], help="a session setting, key=value")
    args = p.parse_args(argv)

    builder = SparkSession.builder.master(args.master).appName("bare-landing")
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    print("bare_session", flush=True)
    query = (
        spark.readStream.schema(args.ddl)
        .option("maxFilesPerTrigger", args.max_files)
        .option("pathGlobFilter", "*.parquet")
        .parquet(args.landing)
        .writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", args.checkpoint)
        .option("path", args.output)
        .partitionBy(*[c for c in args.partition_by.split(",") if c])
        .trigger(availableNow=True)
        .start()
    )
    print("bare_started", flush=True)
    query.awaitTermination()
    progress: dict[str, object] = query.lastProgress or {}
    print(f"bare_done rows={progress.get('numInputRows')} batch={progress.get('batchId')}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
