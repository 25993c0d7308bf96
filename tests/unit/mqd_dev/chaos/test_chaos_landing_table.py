"""The chaos end check of the landing table (devtools/mqd_dev/chaos/landing_table.py): each reader's keys
against the landing's and the ledger, a difference named; the daemons' stale-commit refusals counted."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from mqd_dev.chaos import landing_table
from mqd_dev.chaos.ledger import SCHEMA as LEDGER_SCHEMA
from mqd_dev.chaos.load import record_value

pytest.importorskip("deltalake")
pytest.importorskip("polars")
pytest.importorskip("duckdb_extension_delta")


def _rows(partition: int, offsets: range) -> dict[str, list[object]]:
    return {
        "topic": ["chaos"] * len(offsets),
        "partition": [partition] * len(offsets),
        "incarnation": ["inc-a"] * len(offsets),
        "offset": list(offsets),
        "value": [record_value(partition, o) for o in offsets],
    }


def _write(path: Path, *parts: dict[str, list[object]]) -> None:
    from deltalake import write_deltalake

    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("incarnation", pa.string()),
            ("offset", pa.int64()),
            ("value", pa.binary()),
        ]
    )
    for rows in parts:
        write_deltalake(str(path), pa.table(rows, schema=schema), mode="append")


def _ledger(partition: int, offsets: range) -> pa.Table:
    n = len(offsets)
    return pa.table(
        {
            "topic": ["chaos"] * n,
            "partition": [partition] * n,
            "offset": list(offsets),
            "payload": [record_value(partition, o) for o in offsets],
            "generation": [0] * n,
        },
        schema=LEDGER_SCHEMA,
    )


def _keys(partition: int, offsets: range) -> list[landing_table.Key]:
    return [("chaos", partition, "inc-a", o) for o in offsets]


def test_a_table_equal_to_the_landing_passes_for_every_reader(tmp_path: Path) -> None:
    _write(tmp_path / "t", _rows(0, range(10)), _rows(0, range(10, 20)))
    res = landing_table.check_table(
        landing_table.TableStore(str(tmp_path / "t")), _keys(0, range(20)), _ledger(0, range(20)), "chaos"
    )
    assert res.ok, res.failures
    assert set(res.readers) == {"delta-rs", "duckdb", "polars"}
    assert all(r["distinct"] == 20 and r["duplicates"] == 0 for r in res.readers.values())


def test_a_file_added_twice_and_one_missing_are_named(tmp_path: Path) -> None:
    _write(tmp_path / "t", _rows(0, range(10)), _rows(0, range(10)))  # offsets 10..19 never committed
    res = landing_table.check_table(
        landing_table.TableStore(str(tmp_path / "t")), _keys(0, range(20)), _ledger(0, range(20)), "chaos"
    )
    assert not res.ok
    text = "\n".join(res.failures)
    for reader in ("delta-rs", "duckdb", "polars"):
        assert f"landing table ({reader}): 10 keys of the landing not in the table" in text
        assert f"landing table ({reader}): 10 keys more than once" in text
        assert f"landing table ({reader}) vs the producer's ledger" in text


def test_stale_commit_refusals_are_counted_from_the_daemon_logs(tmp_path: Path) -> None:
    log = tmp_path / "d0.log"
    lines = [
        {"event": "landing table commit dropped: another committer added these partitions' files first"},
        {"event": "landing table commit dropped: another committer added these partitions' files first"},
        {"event": "landing table commit failed; retried next round"},
        {"event": "rebalanced"},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json landing table commit\n")
    assert landing_table.table_events([log, tmp_path / "absent.log"]) == {
        "commits_dropped": 2,
        "commit_failures": 1,
    }


def test_s3_storage_options_name_the_endpoint_and_credentials() -> None:
    store = landing_table.TableStore(
        "s3://b/p", endpoint="http://127.0.0.1:1", access_key="k", secret_key="s"
    )
    assert store.storage() == {
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
    }
    assert landing_table.TableStore("/x").storage() is None
