"""What Spark would refuse at session or query start, checked without Spark.

``mqd config check`` (mqd/config.py's spark section) and ``mqd spark --master`` use these, so a
master URL Spark cannot parse, a trigger interval it cannot read or a partition column the table
does not have is an error naming the key and the file, not a JVM stack trace minutes later. No
pyspark import here: the daemon host need not have Spark.
"""

from __future__ import annotations

import re

from mqd.units import spark_interval

RAW_TIMESTAMP_COLUMN = "timestamp_raw_ms"  # the producer's timestamp when ``timestamp`` was clamped
# the masters Spark 4 knows: SparkContext.createTaskScheduler plus its external cluster managers
# (YARN, Kubernetes); Mesos is gone since Spark 4
_LOCAL = re.compile(r"local(\[(\*|[1-9][0-9]*)(,\s*[1-9][0-9]*)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*\]")
_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")
MASTER_FORMS = (
    "local, local[N], local[*], local[N,F], local-cluster[N,C,M], spark://host:port[,host:port...], "
    "yarn, k8s://https://host:port"
)

# Spark's interval units (IntervalUtils); months and years are refused by processing-time triggers
_UNITS = {
    "week": "week",
    "day": "day",
    "hour": "hour",
    "minute": "minute",
    "second": "second",
    "millisecond": "millisecond",
    "microsecond": "microsecond",
}
_PAIR = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s+([a-z]+)")


def master_problem(master: str) -> str | None:
    """Why Spark would refuse ``master`` as a master URL, or None."""
    if _LOCAL.fullmatch(master) or _LOCAL_CLUSTER.fullmatch(master) or master == "yarn":
        return None
    if master.startswith("spark://"):
        nodes = master.removeprefix("spark://").split(",")
        for node in nodes:
            m = _HOST_PORT.fullmatch(node)
            if m is None or not 1 <= int(m.group(2)) <= 65535:
                return f"{master!r}: each spark:// master must be host:port (port 1-65535), got {node!r}"
        return None
    if master.startswith("k8s://") and len(master) > len("k8s://"):
        return None
    return f"{master!r} is not a Spark master URL; use one of: {MASTER_FORMS}"


def spark_masters(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a ``spark://`` master URL (standalone, possibly with standby
    masters); empty for any other kind of master."""
    if not master.startswith("spark://"):
        return []
    out = []
    for node in master.removeprefix("spark://").split(","):
        m = _HOST_PORT.fullmatch(node)
        if m is not None:
            out.append((m.group(1).strip("[]"), int(m.group(2))))
    return out


def trigger_interval(text: str) -> str:
    """``text`` as the processing-time interval Spark reads ("10 seconds", "1 minute 30 seconds",
    also mqd's short form "500ms", "5s", "2m", "1h"). Raises ValueError naming what is wrong."""
    short = spark_interval(text)  # mqd's one duration syntax (mqd/units.py)
    if short is not None:
        return short
    t = text.strip().lower()
    body = t.removeprefix("interval").strip()
    pairs = _PAIR.findall(body)
    if not pairs or _PAIR.sub("", body).strip():
        raise ValueError(
            f"{text!r} is not an interval: use '<number> <unit>' pairs such as '10 seconds' or "
            "'1 minute 30 seconds' (units: week, day, hour, minute, second, millisecond), or '5s', '500ms'"
        )
    for number, unit in pairs:
        base = unit.removesuffix("s") if unit.endswith("s") and unit != "s" else unit
        if base in ("month", "year"):
            raise ValueError(f"{text!r}: a trigger interval cannot be in months or years")
        if base not in _UNITS:
            raise ValueError(f"{text!r}: unknown unit {unit!r}; units are {', '.join(_UNITS)}")
        if "." in number and base != "second":
            raise ValueError(f"{text!r}: only seconds may have a fraction, not {unit!r}")
    return text.strip()


def ddl_field_names(ddl: str) -> list[str]:
    """The top-level field names of a Spark DDL struct ("a INT, b STRUCT<c: INT>" -> [a, b]),
    backquoted names unquoted. Best effort: Spark parses the DDL itself when the job starts."""
    names, depth, current = [], 0, ""
    for ch in ddl + ",":
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            field = current.strip()
            if field:
                m = re.match(r"`([^`]+)`|([^\s:]+)", field)
                if m is not None:
                    names.append(m.group(1) or m.group(2))
            current = ""
        else:
            current += ch
    return names


def table_columns(value_format: str, value_schema: str) -> list[str]:
    """The output table's columns: the landing's and the raw timestamp; with ``value_format =
    "json"`` the parsed value's fields instead of ``value``."""
    from mqd.landing.schema import landing_columns

    cols = [*landing_columns(), RAW_TIMESTAMP_COLUMN]
    if value_format == "json":
        cols = [c for c in cols if c != "value"] + ddl_field_names(value_schema)
    return cols


def partition_problem(partition_by: list[str], columns: list[str], table_format: str = "delta") -> str | None:
    """Why the output table cannot be partitioned by ``partition_by`` given its ``columns``
    (column names, named expressions, Iceberg transforms: mqd/spark/partitioning.py)."""
    from mqd.spark.partitioning import problem

    return problem(partition_by, columns, table_format)
