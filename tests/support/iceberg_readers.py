"""Readers of an Iceberg output table that are not Spark (Spark 4.2 has no Iceberg runtime): what a
user's pyiceberg, DuckDB or Polars sees, each given only the table's folder (the folder catalog's
``metadata/version-hint.text`` leads them to the newest version).

Each returns the table's (topic, partition, incarnation, offset) keys as a sorted list, like
support.table_readers does for Delta; a reader that fails raises.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from support.table_readers import KEY_COLUMNS, S3, Key

__all__ = [
    "ICEBERG_READERS",
    "duckdb_iceberg_keys",
    "every_iceberg_reader_column",
    "every_iceberg_reader_keys",
    "every_s3_iceberg_reader_keys",
    "polars_iceberg_keys",
    "pyiceberg_keys",
]


def _keys(table: pa.Table) -> list[Key]:
    cols = [table.column(c).to_pylist() for c in KEY_COLUMNS]
    return sorted(zip(*cols, strict=True))


def _pyiceberg(path: Path, columns: list[str]) -> pa.Table:
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(path)).scan(selected_fields=tuple(columns)).to_arrow()


def _duckdb(path: Path, columns: list[str]) -> pa.Table:
    """DuckDB's ``iceberg_scan`` on the folder; the iceberg extension and the avro one it needs
    (manifests are Avro) loaded from their PyPI wheels: no download at run time."""
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = duckdb.connect()
    try:
        for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
            ext = next((Path(module.__file__ or "").parent / "extensions").rglob(f"{name}.duckdb_extension"))
            con.execute(f"LOAD '{ext}'")
        cols = ", ".join(f'"{c}"' for c in columns)
        return con.execute(f"SELECT {cols} FROM iceberg_scan('{path}')").to_arrow_table()
    finally:
        con.close()


def _polars(path: Path, columns: list[str]) -> pa.Table:
    import polars as pl

    return pl.scan_iceberg(str(path)).select(columns).collect().to_arrow()


def pyiceberg_keys(path: Path) -> list[Key]:
    """pyiceberg's ``StaticTable`` (no catalog): the version the hint names."""
    return _keys(_pyiceberg(path, KEY_COLUMNS))


def duckdb_iceberg_keys(path: Path) -> list[Key]:
    return _keys(_duckdb(path, KEY_COLUMNS))


def polars_iceberg_keys(path: Path) -> list[Key]:
    return _keys(_polars(path, KEY_COLUMNS))


ICEBERG_READERS: dict[str, Callable[[Path], list[Key]]] = {
    "pyiceberg": pyiceberg_keys,
    "duckdb": duckdb_iceberg_keys,
    "polars": polars_iceberg_keys,
}

_COLUMN_READERS: dict[str, Callable[[Path, list[str]], pa.Table]] = {
    "pyiceberg": _pyiceberg,
    "duckdb": _duckdb,
    "polars": _polars,
}


def every_iceberg_reader_keys(path: Path) -> dict[str, list[Key]]:
    """Each non-Spark reader's keys of the Iceberg table at ``path``."""
    return {name: read(path) for name, read in ICEBERG_READERS.items()}


def every_iceberg_reader_column(path: Path, column: str) -> dict[str, list[tuple[int, int, object]]]:
    """Each reader's (partition, offset, ``column``) rows, sorted by partition and offset (a column
    the schema gained later reads as None in the rows written before)."""
    out: dict[str, list[tuple[int, int, object]]] = {}
    for name, read in _COLUMN_READERS.items():
        table = read(path, ["partition", "offset", column])
        rows = zip(*(table.column(c).to_pylist() for c in ("partition", "offset", column)), strict=True)
        out[name] = sorted(rows, key=lambda r: (r[0], r[1]))
    return out


def _pyiceberg_properties(s3: S3) -> dict[str, str]:
    return {
        "s3.endpoint": s3.endpoint,
        "s3.access-key-id": s3.access_key,
        "s3.secret-access-key": s3.secret_key,
        "s3.region": s3.region,
        "s3.force-virtual-addressing": "false",
    }


def _s3_pyiceberg(uri: str, s3: S3) -> pa.Table:
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(uri, properties=_pyiceberg_properties(s3))
    return table.scan(selected_fields=tuple(KEY_COLUMNS)).to_arrow()


def _s3_duckdb(uri: str, s3: S3) -> pa.Table:
    """DuckDB's ``iceberg_scan`` through httpfs with a path-style S3 secret."""
    import urllib.parse

    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = duckdb.connect()
    try:
        for module, name in (
            (duckdb_extension_httpfs, "httpfs"),
            (duckdb_extension_avro, "avro"),
            (duckdb_extension_iceberg, "iceberg"),
        ):
            ext = next((Path(module.__file__ or "").parent / "extensions").rglob(f"{name}.duckdb_extension"))
            con.execute(f"LOAD '{ext}'")
        host = urllib.parse.urlsplit(s3.endpoint)
        con.execute(
            f"CREATE SECRET (TYPE s3, KEY_ID '{s3.access_key}', SECRET '{s3.secret_key}', "
            f"REGION '{s3.region}', ENDPOINT '{host.netloc}', URL_STYLE 'path', USE_SSL false)"
        )
        cols = ", ".join(f'"{c}"' for c in KEY_COLUMNS)
        return con.execute(f"SELECT {cols} FROM iceberg_scan('{uri}')").to_arrow_table()
    finally:
        con.close()


def _s3_polars(uri: str, s3: S3) -> pa.Table:
    import polars as pl
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(uri, properties=_pyiceberg_properties(s3))
    return pl.scan_iceberg(table).select(KEY_COLUMNS).collect().to_arrow()


def every_s3_iceberg_reader_keys(uri: str, s3: S3) -> dict[str, list[Key]]:
    """Each non-Spark reader's keys of the Iceberg table at ``s3://...`` ``uri``."""
    readers = {"pyiceberg": _s3_pyiceberg, "duckdb": _s3_duckdb, "polars": _s3_polars}
    return {name: _keys(read(uri, s3)) for name, read in readers.items()}
