"""``spark.partition_by``: how the output table is partitioned (pure logic, no pyspark, no pyiceberg).

An entry is one of:
- a column of the table: ``"topic"``, ``"dt"`` (the landing's folder day, from the record's Kafka
  timestamp), or a field of the parsed value (``value_format = "json"``);
- a Spark SQL expression over those columns, named: ``"to_date(ts) AS dt"`` (event time instead of
  the Kafka timestamp), ``"substr(country, 1, 2) AS region"``. The job adds the column; a name that
  is the landing's ``dt`` or ``hour`` replaces that column in the table (the Kafka time stays in
  ``timestamp``);
- for ``table_format = "iceberg"`` only, a hidden partition transform of Iceberg's spec:
  ``years(c)``, ``months(c)``, ``days(c)``, ``hours(c)``, ``bucket(N, c)``, ``truncate(W, c)``,
  ``identity(c)``. The table gets no extra column; readers prune on ``c`` itself.

A record for which an expression or transform gives null (a field missing, or a value it cannot
parse: the job evaluates with Spark's ANSI mode off, so a bad date is null, never a failed batch)
lands in the default partition, the null one (Spark and Hive name its folder
``__HIVE_DEFAULT_PARTITION__``), and is counted in the job's per-batch log line; nothing is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# what the landing derives from the Kafka timestamp: an expression may give them another meaning
REPLACEABLE = ("dt", "hour")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_AS = re.compile(r"^(?P<expr>.+?)\s+(?i:as)\s+(?P<name>`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*$", re.S)
_TRANSFORM = re.compile(
    r"^(?P<fn>years|months|days|hours|identity|bucket|truncate)\s*\(\s*"
    r"(?:(?P<arg>[0-9]+)\s*,\s*)?(?P<col>`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*\)$",
    re.I,
)
# Iceberg's own partition field names for each transform (what Spark's Iceberg runtime names them)
_SUFFIX = {"years": "year", "months": "month", "days": "day", "hours": "hour", "bucket": "bucket"}
_SUFFIX["truncate"] = "trunc"
TRANSFORMS = "years(c), months(c), days(c), hours(c), bucket(N, c), truncate(W, c), identity(c)"


@dataclass(frozen=True)
class PartitionField:
    """One parsed ``partition_by`` entry."""

    entry: str  # as configured
    name: str  # the table's partition column, or the Iceberg partition field's name
    expression: str | None = None  # Spark SQL giving the column ``name``
    transform: str | None = None  # Iceberg: identity, year, month, day, hour, bucket, truncate
    source: str | None = None  # the transform's column
    argument: int | None = None  # bucket's N, truncate's W

    @property
    def is_column(self) -> bool:
        """A column of the table as it is, partitioned by value."""
        return self.expression is None and self.transform is None

    @property
    def table_column(self) -> str | None:
        """The column the table is partitioned by in Delta/Parquet terms (None: a hidden transform)."""
        return None if self.transform is not None else self.name

    @property
    def nullable_input(self) -> str | None:
        """The column whose null puts a row in the default partition (computed or transformed)."""
        if self.expression is not None:
            return self.name
        return self.source if self.transform is not None else None


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith("`") else name


def parse(entry: str) -> PartitionField:
    """``entry`` parsed; ValueError saying what is wrong."""
    text = entry.strip()
    if not text:
        raise ValueError("an empty entry")
    if _NAME.fullmatch(text) or (text.startswith("`") and text.endswith("`") and len(text) > 2):
        return PartitionField(entry, _unquote(text))
    m = _TRANSFORM.fullmatch(text)
    if m is not None:
        fn, col, arg = m.group("fn").lower(), _unquote(m.group("col")), m.group("arg")
        if fn in ("bucket", "truncate") and (arg is None or int(arg) < 1):
            raise ValueError(f"{entry!r}: {fn} needs a positive number first: {fn}(16, {col})")
        if fn not in ("bucket", "truncate") and arg is not None:
            raise ValueError(f"{entry!r}: {fn} takes one column")
        if fn == "identity":
            return PartitionField(entry, col, transform="identity", source=col)
        return PartitionField(
            entry,
            f"{col}_{_SUFFIX[fn]}",
            transform=_SUFFIX[fn],
            source=col,
            argument=int(arg) if arg is not None else None,
        )
    m = _AS.fullmatch(text)
    if m is None:
        raise ValueError(
            f"{entry!r} is neither a column nor a named expression: write '<expression> AS <name>', "
            "e.g. 'to_date(ts) AS dt'"
        )
    return PartitionField(entry, _unquote(m.group("name")), expression=m.group("expr").strip())


def parse_all(entries: list[str]) -> list[PartitionField]:
    """Every entry parsed; ValueError naming the first bad one."""
    return [parse(e) for e in entries]


def problem(entries: list[str], columns: list[str], table_format: str) -> str | None:
    """Why the output table cannot be partitioned by ``entries`` given its ``columns`` (the table's
    columns before any expression), or None. Expressions are checked by Spark when the job starts."""
    try:
        fields = parse_all(entries)
    except ValueError as exc:
        return str(exc)
    names = [f.name for f in fields]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        return f"names columns more than once: {dupes}"
    hidden = [f.entry for f in fields if f.transform is not None]
    if hidden and table_format != "iceberg":
        return (
            f"{hidden} are Iceberg partition transforms: a {table_format} table is partitioned by "
            "columns; name an expression instead, e.g. 'to_date(ts) AS ts_day'"
        )
    missing = [f.name for f in fields if f.is_column and f.name not in columns]
    missing += [f.source for f in fields if f.source is not None and f.source not in columns]
    if missing:
        return f"names unknown columns {missing}; columns are {columns}"
    clash = [
        f.name for f in fields if f.expression is not None and f.name in columns and f.name not in REPLACEABLE
    ]
    if clash:
        return (
            f"expressions named like existing columns {clash}: give them new names "
            f"(only {list(REPLACEABLE)} may be replaced)"
        )
    plain = {f.name for f in fields if f.table_column is not None}
    if plain and len(plain) >= len(set(columns) | plain):
        return "cannot use every column as a partition column"
    return None


__all__ = ["REPLACEABLE", "TRANSFORMS", "PartitionField", "parse", "parse_all", "problem"]
