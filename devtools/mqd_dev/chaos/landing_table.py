"""The end check of the landing table (``landing.table = "delta"``, issue 35): after the daemons
stopped (each stop commits what it published), one catch-up round over every chain says whether
the table had caught up; then the table is read by delta-rs, DuckDB and Polars, and each reader's
(topic, partition, incarnation, offset) keys must be the landing's, each once, and its records the
producer's ledger's (``check.check_payloads``, as the landing's are checked).

The catch-up round is mqd's own committer (``TableCommitter.round``) run once more by the chaos
process over every partition's chain: the files it adds are the ones the daemons left out of the
table when they stopped. They are reported (``caught_up_files``); the readers see the table after it.
"""

from __future__ import annotations

import json
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mqd.landing.objects import Objects
from mqd_dev.chaos import check

KEY_COLUMNS = ["topic", "partition", "incarnation", "offset"]
READ_COLUMNS = [*KEY_COLUMNS, "value"]
Key = tuple[str, int, str | None, int]
# the committer's warning when delta-rs refused a stale commit (table_committer.py)
DROPPED_EVENT = "landing table commit dropped"
FAILED_EVENT = "landing table commit failed"
TABLE_CHOICES = ("none", "delta")


@dataclass
class TableCheck:
    """The landing table against the landing and the ledger."""

    version: int | None = None
    caught_up_files: int = 0  # files the end's catch-up round added (the daemons had not)
    catch_up: dict[str, Any] = field(default_factory=dict)
    landing_keys: int = 0
    readers: dict[str, dict[str, Any]] = field(default_factory=dict)  # per reader: rows, diff, ledger
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TableStore:
    """Where the table is and how to reach it: a local landing's path, or an ``s3://`` URI with its
    endpoint and credentials (SeaweedFS in chaos)."""

    uri: str
    endpoint: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    region: str | None = None

    def storage(self) -> dict[str, str] | None:
        """object_store's options (delta-rs, Polars)."""
        if not self.uri.startswith("s3://"):
            return None
        opts = {"AWS_REGION": self.region or "us-east-1"}
        if self.endpoint:
            opts["AWS_ENDPOINT_URL"] = self.endpoint
            if self.endpoint.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        if self.access_key:
            opts["AWS_ACCESS_KEY_ID"] = self.access_key
            opts["AWS_SECRET_ACCESS_KEY"] = self.secret_key or ""
        return opts


# -- the catch-up round ----------------------------------------------------------------------------


def catch_up(
    objects: Objects, store: TableStore, topic: str, partitions: int, rounds: int = 4
) -> dict[str, Any]:
    """Run the committer's round over every chain of ``topic`` until nothing is missing (a round
    dropped as stale or with a head not visible yet is followed by another, ``rounds`` at most)."""
    from mqd.landing.delta_log import LandingTable
    from mqd.landing.table_committer import TableCommitter

    committer = TableCommitter(
        objects, LandingTable(store.uri, objects, storage=store.storage()), name="chaos-end-check"
    )
    chains = {(topic, p) for p in range(partitions)}
    out: dict[str, Any] = {"files": 0, "rounds": 0, "stale": 0, "pending": False, "error": None}
    try:
        for _ in range(rounds):
            res = committer.round(set(chains))
            out["rounds"] += 1
            out["files"] += res.files
            out["stale"] += int(res.stale)
            out["pending"], out["error"] = res.pending, res.error
            if res.version is not None:
                out["version"] = res.version
            if not (res.stale or res.pending or res.error or committer.status()["pending_files"]):
                break
        out["skipped_gone"] = committer.stats.gone
        out["pending_files"] = committer.status()["pending_files"]
    finally:
        committer.close()
    return out


# -- the readers -----------------------------------------------------------------------------------


def _as_copy(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "topic": table.column("topic").cast(pa.string()),
            "partition": table.column("partition").cast(pa.int32()),
            "incarnation": table.column("incarnation").cast(pa.string()),
            "offset": table.column("offset").cast(pa.int64()),
            "value": table.column("value").cast(pa.binary()),
        }
    )


def read_delta_rs(store: TableStore) -> pa.Table:
    from deltalake import DeltaTable

    return _as_copy(
        DeltaTable(store.uri, storage_options=store.storage()).to_pyarrow_table(columns=READ_COLUMNS)
    )


def read_polars(store: TableStore) -> pa.Table:
    import polars as pl

    frame = pl.read_delta(store.uri, columns=READ_COLUMNS, storage_options=store.storage())
    return _as_copy(frame.to_arrow())


def _duckdb_extension(module: Any, name: str) -> Path:
    """An extension's file from its PyPI wheel (no download at run time)."""
    return next((Path(module.__file__).parent / "extensions").rglob(f"{name}.duckdb_extension"))


def read_duckdb(store: TableStore) -> pa.Table:
    import duckdb
    import duckdb_extension_delta
    import duckdb_extension_httpfs

    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_duckdb_extension(duckdb_extension_httpfs, 'httpfs')}'")
        con.execute(f"LOAD '{_duckdb_extension(duckdb_extension_delta, 'delta')}'")
        if store.uri.startswith("s3://"):
            host = urllib.parse.urlsplit(store.endpoint or "")
            con.execute(
                f"CREATE SECRET (TYPE s3, KEY_ID '{store.access_key}', SECRET '{store.secret_key}', "
                f"REGION '{store.region or 'us-east-1'}', ENDPOINT '{host.netloc}', URL_STYLE 'path', "
                f"USE_SSL {'true' if host.scheme == 'https' else 'false'})"
            )
        cols = ", ".join(f'"{c}"' for c in READ_COLUMNS)
        table = con.execute(f"SELECT {cols} FROM delta_scan('{store.uri}')").to_arrow_table()
    finally:
        con.close()
    return _as_copy(table)


READERS: dict[str, Callable[[TableStore], pa.Table]] = {
    "delta-rs": read_delta_rs,
    "duckdb": read_duckdb,
    "polars": read_polars,
}


# -- the landing's keys ----------------------------------------------------------------------------


def _keys_of(table: pa.Table) -> list[Key]:
    cols = [table.column(c).to_pylist() for c in KEY_COLUMNS]
    return list(zip(*cols, strict=True))


def _file_keys(table: pa.Table, topic: str) -> pa.Table:
    n = table.num_rows
    inc = table.column("incarnation") if "incarnation" in table.column_names else pa.nulls(n, pa.string())
    return pa.table(
        {
            "topic": pa.array([topic] * n, pa.string()),
            "partition": table.column("partition").cast(pa.int32()),
            "incarnation": inc.cast(pa.string()),
            "offset": table.column("offset").cast(pa.int64()),
        }
    )


def landing_keys_local(landing: Path, topic: str) -> list[Key]:
    """The (topic, partition, incarnation, offset) of every published row of a local landing."""
    root = landing / f"topic={topic}"
    out: list[Key] = []
    for path in check._data_files(root) if root.is_dir() else []:
        names = pq.read_schema(path).names
        t = pq.read_table(path, columns=[c for c in ("partition", "incarnation", "offset") if c in names])
        out.extend(_keys_of(_file_keys(t, topic)))
    return out


def landing_keys_store(objects: Objects, visible: Iterable[str], topic: str) -> list[Key]:
    """The same for an object-store landing: its visible files (``store.visible_files()``)."""
    import io

    out: list[Key] = []
    for key in visible:
        if not key.startswith(f"topic={topic}/"):
            continue
        got = objects.get(key)
        if got is None:
            raise FileNotFoundError(f"{key} listed as visible but absent")
        t = pq.read_table(io.BytesIO(got[0]))
        out.extend(_keys_of(_file_keys(t, topic)))
    return out


# -- the check -------------------------------------------------------------------------------------


def _diff(name: str, got: list[Key], want: Counter[Key]) -> tuple[dict[str, Any], list[str]]:
    """``got`` (a reader's keys) against the landing's, each once."""
    seen = Counter(got)
    missing = [k for k in want if k not in seen]
    extra = [k for k in seen if k not in want]
    twice = [k for k, n in seen.items() if n > 1]
    res = {"rows": len(got), "distinct": len(seen), "missing": len(missing), "not_in_landing": len(extra)}
    res["duplicates"] = sum(n - 1 for n in seen.values())
    problems = []
    if missing:
        problems.append(
            f"landing table ({name}): {len(missing)} keys of the landing not in the table, "
            f"e.g. {sorted(missing, key=str)[:3]}"
        )
    if extra:
        problems.append(
            f"landing table ({name}): {len(extra)} keys not in the landing, e.g. {sorted(extra, key=str)[:3]}"
        )
    if twice:
        problems.append(
            f"landing table ({name}): {len(twice)} keys more than once ({res['duplicates']} extra rows), "
            f"e.g. {sorted(twice, key=str)[:3]}"
        )
    return res, problems


def check_table(
    store: TableStore,
    landing_keys: list[Key],
    ledger: pa.Table,
    topic: str,
    catch_up_result: dict[str, Any] | None = None,
    lossy: Iterable[tuple[int, int]] = (),
) -> TableCheck:
    """Each reader's view of the table against the landing's keys and the producer's ledger."""
    res = TableCheck(catch_up=catch_up_result or {}, landing_keys=len(landing_keys))
    res.caught_up_files = int(res.catch_up.get("files", 0))
    if res.catch_up.get("error"):
        res.failures.append(f"landing table: the end's catch-up round failed: {res.catch_up['error']}")
    if res.catch_up.get("pending_files"):
        res.failures.append(
            f"landing table: {res.catch_up['pending_files']} files still not committed after the end's "
            f"catch-up rounds ({res.catch_up})"
        )
    want = Counter(landing_keys)
    dup_landing = [k for k, n in want.items() if n > 1]
    if dup_landing:
        res.failures.append(f"the landing holds {len(dup_landing)} keys twice, e.g. {dup_landing[:3]}")
    lossy = list(lossy)
    for name, read in READERS.items():
        try:
            table = read(store)
        except Exception as exc:  # a reader that cannot read the table is the finding
            res.readers[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            res.failures.append(f"landing table: {name} could not read it: {type(exc).__name__}: {exc}"[:800])
            continue
        mine = table.filter(pc.equal(table.column("topic"), topic))
        if mine.num_rows != table.num_rows:
            res.failures.append(
                f"landing table ({name}): {table.num_rows - mine.num_rows} rows of another topic"
            )
        diff, problems = _diff(name, _keys_of(mine), want)
        res.failures.extend(problems)
        payloads = check.check_payloads(ledger, mine.select(check.COPY_COLUMNS), lossy)
        if not payloads.ok:
            res.failures.append(f"landing table ({name}) vs the producer's ledger: {payloads.examples}")
        diff["ledger"] = {
            k: v for k, v in payloads.to_json().items() if k not in ("examples",) and v not in (0, None)
        } | {"lost": payloads.lost, "duplicates": payloads.duplicates}
        res.readers[name] = diff
    try:
        from deltalake import DeltaTable

        res.version = DeltaTable(store.uri, storage_options=store.storage()).version()
    except Exception as exc:
        res.failures.append(f"landing table: no version: {exc}")
    return res


def table_events(log_paths: Iterable[Path]) -> dict[str, int]:
    """Stale-commit refusals and failed rounds the daemons logged (their JSON logs)."""
    counts = {"commits_dropped": 0, "commit_failures": 0}
    for path in log_paths:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if "landing table commit" not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            event = str(rec.get("event", "")) if isinstance(rec, dict) else ""
            if event.startswith(DROPPED_EVENT):
                counts["commits_dropped"] += 1
            elif event.startswith(FAILED_EVENT):
                counts["commit_failures"] += 1
    return counts


def summary_line(t: dict[str, Any], events: dict[str, int] | None) -> str:
    """The summary's line about the landing table."""
    if not t or "readers" not in t:
        return f"landing table: {t or 'off'}"
    readers = ", ".join(
        f"{name} {r.get('distinct')} keys" + (f" (ERROR {r['error'][:80]})" if r.get("error") else "")
        for name, r in t["readers"].items()
    )
    first: dict[str, Any] = next(iter(t["readers"].values()), {})
    led = first.get("ledger", {})
    ev = events or {}
    same = all(
        not r.get("error") and not (r.get("missing") or r.get("not_in_landing") or r.get("duplicates"))
        for r in t["readers"].values()
    )
    return (
        f"landing table: version {t.get('version')}, {t.get('landing_keys')} landing keys; {readers}; "
        f"{'equal to the landing, each once' if same else 'DIFFERS from the landing'}; vs ledger lost "
        f"{led.get('lost')}, duplicated {led.get('duplicates')}; caught up at the end: "
        f"{t.get('caught_up_files')} files; commits dropped as stale {ev.get('commits_dropped', 0)}, "
        f"failed rounds {ev.get('commit_failures', 0)}"
    )
