"""Readers of the output table that are not Spark: what a user's DuckDB, Polars or delta-rs sees.

Each returns the table's (topic, partition, incarnation, offset) keys as a sorted list, so a test can
check both the count and that no record is there twice. A reader that fails raises: that is a
finding (the table issue's trial broke exactly these readers).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

Key = tuple[str, int, str | None, int]
KEY_COLUMNS = ["topic", "partition", "incarnation", "offset"]


def _keys(table: pa.Table) -> list[Key]:
    cols = [table.column(c).to_pylist() for c in KEY_COLUMNS]
    return sorted(zip(*cols, strict=True))


@dataclass(frozen=True)
class S3:
    """Where an ``s3://`` table's store is, for readers that are not Spark (SeaweedFS in tests)."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str

    def delta_rs(self) -> dict[str, str]:
        """object_store's options (delta-rs, and Polars through it)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }


def delta_rs_keys(path: Path | str, s3: S3 | None = None) -> list[Key]:
    """delta-rs (the ``deltalake`` package): the table as of its latest commit."""
    from deltalake import DeltaTable

    table = DeltaTable(str(path), storage_options=s3.delta_rs() if s3 else None)
    return _keys(table.to_pyarrow_table(columns=KEY_COLUMNS))


def polars_keys(path: Path | str, s3: S3 | None = None) -> list[Key]:
    import polars as pl

    frame = pl.read_delta(str(path), columns=KEY_COLUMNS, storage_options=s3.delta_rs() if s3 else None)
    return _keys(frame.to_arrow())


def _duckdb_extension(module: Any, name: str) -> Path:
    """An extension's file from its PyPI wheel (DuckDB would download it at run time otherwise)."""
    return next((Path(module.__file__).parent / "extensions").rglob(f"{name}.duckdb_extension"))


def duckdb_keys(path: Path | str, s3: S3 | None = None) -> list[Key]:
    """DuckDB's ``delta_scan``; an ``s3://`` table through httpfs with a path-style S3 secret."""
    import duckdb
    import duckdb_extension_delta
    import duckdb_extension_httpfs

    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_duckdb_extension(duckdb_extension_httpfs, 'httpfs')}'")
        con.execute(f"LOAD '{_duckdb_extension(duckdb_extension_delta, 'delta')}'")
        if s3 is not None:
            host = urllib.parse.urlsplit(s3.endpoint)
            con.execute(
                f"CREATE SECRET (TYPE s3, KEY_ID '{s3.access_key}', SECRET '{s3.secret_key}', "
                f"REGION '{s3.region}', ENDPOINT '{host.netloc}', URL_STYLE 'path', "
                f"USE_SSL {'true' if host.scheme == 'https' else 'false'})"
            )
        cols = ", ".join(f'"{c}"' for c in KEY_COLUMNS)
        table = con.execute(f"SELECT {cols} FROM delta_scan('{path}')").to_arrow_table()
    finally:
        con.close()
    return _keys(table)


DELTA_READERS: dict[str, Callable[[Path | str, S3 | None], list[Key]]] = {
    "delta-rs": delta_rs_keys,
    "polars": polars_keys,
    "duckdb": duckdb_keys,
}


def offsets(keys: list[Key]) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of each key, sorted; a key twice stays twice."""
    return sorted((t, p, o) for t, p, _inc, o in keys)


def every_reader_keys(path: Path | str, s3: S3 | None = None) -> dict[str, list[Key]]:
    """Each non-Spark reader's keys of the Delta table at ``path`` (an ``s3://`` one with ``s3``)."""
    return {name: read(path, s3) for name, read in DELTA_READERS.items()}


__all__ = [
    "DELTA_READERS",
    "KEY_COLUMNS",
    "S3",
    "Key",
    "delta_rs_keys",
    "duckdb_keys",
    "every_reader_keys",
    "offsets",
    "polars_keys",
]
