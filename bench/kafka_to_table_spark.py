"""The alternative for bench/kafka_to_table.py: Kafka straight into a Delta table with Spark's own
Kafka source (``spark-sql-kafka-0-10``), no mqd.

What a careful user writes: ``spark.readStream.format("kafka")`` from the earliest offsets (no
``maxOffsetsPerTrigger``: one batch takes everything there is), the columns mqd's table has
(topic, partition, offset, timestamp, key, value, headers, and ``dt``/``hour`` from the record's
timestamp as mqd's landing folders give them), Delta's streaming sink partitioned by topic and dt,
its own checkpoint. ``--trigger availableNow`` drains the topic and exits; ``--trigger 1s`` keeps
running on a processing-time trigger until SIGTERM (the latency part). Every Spark and Kafka
consumer setting comes from the benchmark (``--conf`` for the session, ``--option`` for the
source), so what was tuned is recorded there. Run by path so that it imports pyspark and nothing of
mqd: its start-up is its own. Prints ``bare_session``, ``bare_started`` and ``bare_done rows=<n>``
(the benchmark reads them).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--trigger", default="availableNow", help="availableNow, or a processing-time interval")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--conf", action="append", default=[], help="a session setting, key=value")
    p.add_argument("--option", action="append", default=[], help="a Kafka source option, key=value")
    args = p.parse_args(argv)

    builder = SparkSession.builder.master(args.master).appName("bare-kafka")
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    print("bare_session", flush=True)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
    )
    for item in args.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)
    # dt and hour as the landing's folders name them (UTC: the session's time zone is UTC)
    df = reader.load().select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        "value",
        "headers",
        F.date_format("timestamp", "yyyy-MM-dd").alias("dt"),
        F.hour("timestamp").alias("hour"),
    )
    writer = (
        df.writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", args.checkpoint)
        .option("path", args.output)
        .partitionBy("topic", "dt")
    )
    if args.trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)
    query = writer.start()
    print("bare_started", flush=True)
    stopping = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    # the streaming run ends on SIGTERM: stop the query between batches, not the JVM under it
    signal.signal(signal.SIGTERM, _stop)
    while not stopping.is_set() and query.isActive:
        query.awaitTermination(1)  # seconds (an int to pyspark)
    rows = sum(int(pr.get("numInputRows") or 0) for pr in query.recentProgress)
    if query.isActive:
        query.stop()
    print(f"bare_done rows={rows}", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
