"""``mqd landing query``: SQL over the landing's Delta table (landing.table = "delta") with DuckDB
(its ``delta`` extension) or Polars (``scan_delta``), the table named ``landing``.

The same as these one-liners, which need no mqd (a local landing; ``s3://`` ones take the S3
options of README.md's landing table section)::

    duckdb -c "SELECT count(*) FROM delta_scan('/data/landing')"
    python -c "import polars as pl; print(pl.scan_delta('/data/landing').select(pl.len()).collect())"

Read-only: a query never writes the log or the landing.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mqd.landing.errors import QueryError

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_SQL = (
    'SELECT topic, "partition", count(*) AS records, min("offset") AS first_offset, '
    'max("offset") AS last_offset, max("timestamp") AS newest FROM landing GROUP BY 1, 2 ORDER BY 1, 2'
)
ENGINES = ("duckdb", "polars")


def _extension(module: Any, name: str) -> Path:
    """A DuckDB extension from its PyPI wheel (DuckDB would download it at run time otherwise)."""
    return next((Path(module.__file__).parent / "extensions").rglob(f"{name}.duckdb_extension"))


def _duckdb(uri: str, sql: str, endpoint_url: str | None, region: str | None) -> pa.Table:
    try:
        import duckdb
        import duckdb_extension_delta
        import duckdb_extension_httpfs
    except ImportError as exc:
        raise QueryError(f"--engine duckdb needs duckdb and its delta extension: {exc}") from None
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_extension(duckdb_extension_httpfs, 'httpfs')}'")
        con.execute(f"LOAD '{_extension(duckdb_extension_delta, 'delta')}'")
        if uri.startswith("s3://"):
            parts = [f"TYPE s3, REGION '{region or os.environ.get('AWS_REGION', 'us-east-1')}'"]
            if os.environ.get("AWS_ACCESS_KEY_ID"):
                parts.append(f"KEY_ID '{os.environ['AWS_ACCESS_KEY_ID']}'")
                parts.append(f"SECRET '{os.environ.get('AWS_SECRET_ACCESS_KEY', '')}'")
                if os.environ.get("AWS_SESSION_TOKEN"):
                    parts.append(f"SESSION_TOKEN '{os.environ['AWS_SESSION_TOKEN']}'")
            else:
                parts.append("PROVIDER credential_chain")
            if endpoint_url:
                host = urllib.parse.urlsplit(endpoint_url)
                use_ssl = "true" if host.scheme == "https" else "false"
                parts.append(f"ENDPOINT '{host.netloc}', URL_STYLE 'path', USE_SSL {use_ssl}")
            con.execute(f"CREATE SECRET ({', '.join(parts)})")
        con.execute(f"CREATE VIEW landing AS SELECT * FROM delta_scan('{uri}')")
        return con.execute(sql).to_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(f"{uri}: {exc}") from None
    finally:
        con.close()


def _polars(uri: str, sql: str, storage: dict[str, str] | None) -> pa.Table:
    try:
        import polars as pl
    except ImportError as exc:
        raise QueryError(f"--engine polars needs polars: {exc}") from None
    try:
        frame = pl.SQLContext(landing=pl.scan_delta(uri, storage_options=storage)).execute(sql).collect()
    except Exception as exc:  # Polars' errors have no common base besides its compute errors
        raise QueryError(f"{uri}: {exc}") from None
    return frame.to_arrow()


def query(
    uri: str,
    sql: str = DEFAULT_SQL,
    *,
    engine: str = "duckdb",
    endpoint_url: str | None = None,
    region: str | None = None,
) -> pa.Table:
    """Run ``sql`` over the landing table at ``uri`` (named ``landing``); the result as Arrow."""
    from mqd.landing.delta_log import storage_options, table_exists

    storage = storage_options(uri, endpoint_url, region)
    if not table_exists(uri, storage):
        raise QueryError(f'{uri}: no landing table (landing.table = "delta" makes one)')
    if engine == "duckdb":
        return _duckdb(uri, sql, endpoint_url, region)
    if engine == "polars":
        return _polars(uri, sql, storage)
    raise QueryError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
