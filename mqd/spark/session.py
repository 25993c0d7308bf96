"""Creating the job's SparkSession: fast, quiet, and failing in one line.

Spark's standalone client tries an unreachable master three times 20 s apart (hard-coded, no
setting bounds it) and prints each attempt's Java trace; under systemd that is a minute of
journal per restart. So before starting the JVM the job connects to each ``spark://`` master
(``CONNECT_TIMEOUT``) and, when none answers, fails at once; any other failure to create the
session is caught too. Both end the job with ``EXIT_SESSION`` (75, EX_TEMPFAIL: the cluster may
come back; the unit restarts with a growing delay) and one error line, distinct from a failed
query (1) and a bad configuration (2, not restarted).

Output hygiene: log4j at ``spark.log_level`` (WARN by default), console progress bars only when
stderr is a terminal (they are carriage-return animations: garbage in a journal or log file), and
the Spark UI only when ``spark.ui`` asks for it.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from mqd.config import MqdConfig
from mqd.errors import MqdError
from mqd.spark.static_checks import spark_masters

EXIT_SESSION = 75  # sysexits' EX_TEMPFAIL: no Spark session now, a later try may get one
CONNECT_TIMEOUT = 5.0  # seconds per spark:// master for a TCP connect before the JVM starts


# log4j2 for the driver JVM, root at spark.log_level from its first line (Spark's own default is
# INFO, then "Setting default log level" once the context is up); Hadoop's native-library notice off
_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = error
"""


class SessionError(MqdError):
    """No Spark session: the master is unreachable or Spark failed to start. Retriable."""

    retriable = True


def check_reachable(master: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise SessionError unless some master of a ``spark://`` URL accepts a TCP connection
    (standby masters: one is enough). Other masters are not checked here."""
    nodes = spark_masters(master)
    errors = []
    for host, port in nodes:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    if nodes:
        raise SessionError(f"no Spark master reachable at {master} ({'; '.join(errors)})")


def is_local_master(url: str) -> bool:
    """A master that runs Spark in this process's JVM (``local``, ``local[2]``, ``local[*]``...)."""
    return url.startswith("local")


def build_session(config: MqdConfig, master: str | None = None) -> Any:
    """A SparkSession sized for a small machine unless the master is a real cluster. When a
    session is already active in this process (tests), it is reused as is."""
    from pyspark.sql import SparkSession

    sc = config.spark
    url = master or sc.master
    log4j: Path | None = None
    if not _jvm_running():
        # read once by the JVM as it starts: removed again below
        fd, name = tempfile.mkstemp(prefix="mqd-spark-log4j2-", suffix=".properties")
        log4j = Path(name)
        with os.fdopen(fd, "w") as f:
            f.write(_LOG4J2.format(level=sc.log_level))
    builder = (
        SparkSession.builder.master(url)
        .appName(sc.app_name)
        .config("spark.sql.shuffle.partitions", str(sc.shuffle_partitions))
        .config("spark.default.parallelism", str(sc.shuffle_partitions))
        .config("spark.ui.enabled", "true" if sc.ui else "false")
        .config("spark.ui.port", str(sc.ui_port))
        .config("spark.ui.showConsoleProgress", "true" if _stderr_is_tty() else "false")
        .config("spark.driver.memory", sc.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.files.ignoreCorruptFiles", "false")  # an unreadable file fails the job
        .config("spark.sql.streaming.schemaInference", "false")
        .config("spark.sql.adaptive.enabled", "false")  # AQE brings nothing to small micro-batches
    )
    for key, value in batch_options(config, url).items():
        builder = builder.config(key, value)
    table_options = table_session_options(is_local_master(url)) if sc.table_format == "delta" else {}
    for key, value in table_options.items():
        builder = builder.config(key, value)
    for key, value in s3a_options(config).items():
        builder = builder.config(key, value)
    if log4j is not None:
        opts = f"-Dlog4j2.configurationFile={log4j.as_uri()}"
        builder = builder.config("spark.driver.extraJavaOptions", opts)
        if is_local_master(url):
            # the JVM's first act is resolving the host name (a WARN when it is a loopback name)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if is_local_master(url):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    try:
        spark = builder.getOrCreate()
    finally:
        if log4j is not None:
            log4j.unlink(missing_ok=True)
    if log4j is not None and "spark.jars.packages" in table_options:
        _record_resolution(spark)
    # a reused session (tests, the demo) started without them: S3A reads Hadoop's configuration
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_options(config).items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)
    return spark


# New Delta tables stay readable by every Delta reader (delta-rs, DuckDB, Polars): no deletion
# vectors (mqd only appends; compaction rewrites files whole), classic checkpoints, not v2 ones
_DELTA_TABLE_DEFAULTS = {
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    "spark.databricks.delta.properties.defaults.checkpointPolicy": "classic",
}


def batch_options(config: MqdConfig, master: str | None = None) -> dict[str, str]:
    """What a micro-batch must not pay for (decisions 063 and 066). Spark lists a batch's files
    again as it reads them, and past ``parallelPartitionDiscovery.threshold`` (32) paths it does so
    with a Spark job of a task per file: 1-9 s of a 2-core machine for 40-310 landed files, where
    the driver stats them in milliseconds; no batch holds more than ``max_files_per_trigger``.
    Delta's sink looks up the query's last committed batch in a snapshot state it rebuilds after
    every commit: Delta 4.4 has no setting that reads it from the .crc instead (decision 066), so
    the rebuild stays and is made narrow. Its replay runs in ``snapshotPartitions`` tasks (50 unless
    set), and for mqd's small logs their CPU follows their count, not the log (4 tasks 0.68 CPU-s,
    1 task 0.07): on a local master one task (the rebuild 1.0 -> 0.47 CPU-s, a 50k-row batch 5.8 ->
    4.3 s), on a cluster the job's shuffle width, which grows with the tables it writes.

    Delta's VACUUM (the job's maintenance, ``mqd table``) walks the table's folders in a Spark job
    of ``parallelPartitionDiscovery.parallelism`` tasks, 10,000 unless set, however few folders
    there are: 50-64 s for a table of three files on 2 cores, 7-10 s with the job's shuffle width,
    which is what it gets on any master (decision 068)."""
    sc = config.spark
    local = is_local_master(master or sc.master)
    return {
        "spark.sql.sources.parallelPartitionDiscovery.threshold": str(max(32, sc.max_files_per_trigger)),
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(sc.shuffle_partitions),
        "spark.databricks.delta.snapshotPartitions": "1" if local else str(sc.shuffle_partitions),
    }


def table_session_options(local: bool = False) -> dict[str, str]:
    """What a session writing Delta tables needs: the packages from mqd's cache (the jars of the
    last resolution, or resolved by Spark: mqd/spark/packages.py; on the class path on a ``local``
    master), Delta's SQL extension and catalog, and the new tables' defaults."""
    from mqd.spark.packages import session_options

    return {**session_options(local=local), **_DELTA_TABLE_DEFAULTS}


def table_s3(config: MqdConfig) -> tuple[str | None, str | None, bool]:
    """(endpoint URL, region, path-style) of the tables' S3 store: ``[spark.s3]``, each unset key
    from ``[landing.s3]``; path-style on when an endpoint is set (a store that is not AWS)."""
    sc = config.spark
    endpoint = sc.s3.endpoint_url or config.landing.s3.endpoint_url
    region = sc.s3.region or config.landing.s3.region
    path_style = sc.s3.path_style if sc.s3.path_style is not None else endpoint is not None
    return endpoint, region, path_style


def s3a_options(config: MqdConfig) -> dict[str, str]:
    """Hadoop's S3A settings for an ``s3://`` table (none for a table on disk): ``[spark.s3]``, each
    unset key from ``[landing.s3]``. Credentials: S3A's default chain (the AWS variables, then the
    instance role), the same the landing's boto3 uses."""
    sc = config.spark
    if not any(isinstance(p, str) for p in (sc.output_dir, sc.quarantine_dir)):
        return {}
    endpoint, region, path_style = table_s3(config)
    opts = {"spark.hadoop.fs.s3a.path.style.access": "true" if path_style else "false"}
    if endpoint is not None:
        opts["spark.hadoop.fs.s3a.endpoint"] = endpoint
        tls = endpoint.startswith("https")
        opts["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "true" if tls else "false"
    if region is not None:
        opts["spark.hadoop.fs.s3a.endpoint.region"] = region
    return opts


def open_session(config: MqdConfig, master: str | None = None) -> Any:
    """``build_session`` after the reachability check; every failure is a SessionError whose
    message is one line (Spark's errors carry the JVM's trace: only its first line is kept)."""
    url = master or config.spark.master
    check_reachable(url)
    try:
        return build_session(config, master)
    except Exception as exc:  # py4j and pyspark raise their own types
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SessionError(f"Spark session for master {url} failed: {first[:500]}") from None


def _record_resolution(spark: Any) -> None:
    """This session's JVM resolved the packages (no record of an earlier resolution, or one for
    other versions): its jars go on record, so the next session skips Ivy (mqd/spark/packages.py).
    A record that cannot be written costs the next session a resolution, never this job."""
    from mqd.spark.packages import record_resolution

    try:
        record_resolution(spark.sparkContext.getConf().get("spark.jars", "") or "")
    except OSError:
        pass


def _jvm_running() -> bool:
    """This process already has Spark's JVM (a session before this one): it keeps its logging."""
    from pyspark import SparkContext

    return SparkContext._gateway is not None


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


__all__ = [
    "CONNECT_TIMEOUT",
    "EXIT_SESSION",
    "SessionError",
    "batch_options",
    "build_session",
    "check_reachable",
    "open_session",
    "s3a_options",
    "table_session_options",
]
