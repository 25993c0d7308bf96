"""bench/typed_decode.py's pure parts: the records it decodes (wire format, sizes, the schema
versions) and how its runs become the table. No Spark here: the logic only."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import REPO_ROOT


@pytest.fixture
def td(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(REPO_ROOT))  # bench is a package of the project root, not installed
    from bench import typed_decode

    yield typed_decode


def test_each_version_adds_one_nullable_field(td: ModuleType) -> None:
    v1, v3 = td.version_schema(1), td.version_schema(3)
    assert [f["name"] for f in v1["fields"]] == [n for n, _ in td.BASE_FIELDS]
    assert [f["name"] for f in v3["fields"]][-2:] == ["extra_2", "extra_3"]
    assert all(f["type"] == ["null", "long"] and f["default"] is None for f in v3["fields"][-2:])


def test_values_are_the_wire_format_and_about_100_bytes(td: ModuleType) -> None:
    records = td.make_records(300, 3)
    values = td.encode_wire(records)
    assert [int.from_bytes(v[1:5], "big") for v in values[:4]] == [101, 102, 103, 101]
    assert all(v[0] == 0 for v in values)
    for (sid, rec), v in zip(records, values, strict=True):
        schema = fastavro.parse_schema(td.version_schema(td.id_version(sid)))
        back: Any = fastavro.schemaless_reader(io.BytesIO(v[5:]), schema, None)
        assert {k: back[k] for k in rec} == rec
        assert all(back[k] is None for k in back.keys() - rec.keys())  # the older versions' fields
    one = td.encode_wire(td.make_records(1000, 1))
    assert 85 <= sum(map(len, one)) / len(one) <= 105


def test_files_tile_the_pool(td: ModuleType, tmp_path: Path) -> None:
    pool = pa.array([b"a", b"b", b"c"], pa.binary())
    assert td.tiled(pool, 2, 5).to_pylist() == [b"c", b"a", b"b", b"c", b"a"]
    paths = td.write_files(tmp_path, pool, 2, per_file=4)
    assert [pq.read_table(p).column("value").to_pylist() for p in paths] == [
        [b"a", b"b", b"c", b"a"],
        [b"b", b"c", b"a", b"b"],
    ]


def _run(td: ModuleType, variant: str, rnd: int, cpu: float, ids: int = 1, size: int = 1_000_000) -> object:
    return td.Run(
        variant, ids, size, rnd, wall_s=cpu * 2, jvm_cpu_s=cpu, worker_cpu_s=0.0, load_start=1, load_end=2
    )


def test_summary_medians_and_the_decode_step_alone(td: ModuleType) -> None:
    runs = [
        _run(td, v, r, cpu)
        for r, (m, f, s) in enumerate([(2.0, 1.0, 0.5), (4.0, 1.2, 0.6), (2.5, 0.9, 0.4)])
        for v, cpu in (("mqd", m), ("floor", f), ("scan", s))
    ]
    rows = td.summarize(runs)
    assert [r["variant"] for r in rows] == ["mqd", "floor", "scan"]
    mqd = rows[0]
    assert mqd["runs"] == 3
    assert mqd["records_per_cpu_s"] == {"median": 400_000, "min": 250_000, "max": 500_000}
    assert mqd["cpu_s_per_m"]["median"] == 2.5 and mqd["load"]["median"] == 2
    alone = {r["variant"]: r for r in td.decode_only(rows)}
    assert alone["mqd"]["cpu_s_per_m"] == 2.0 and alone["mqd"]["records_per_cpu_s"] == 500_000
    assert alone["floor"]["records_per_cpu_s"] == 2_000_000
    result = {
        "machine": {"time_utc": "t", "cores": 2, "cpu_model": "cpu"},
        "args": {"driver_memory": "4g", "rounds": 3},
        "versions": {},
        "data": [{"ids": 1, "avg_value_bytes": 100.0, "avg_payload_bytes": 95.0}],
        "summary": rows,
        "decode_only": td.decode_only(rows),
        "warmups": [
            {
                "ids": 50,
                "variant": "mqd",
                "records": 50_000,
                "first_wall_s": 240.0,
                "first_cpu_s": 100.0,
                "second_wall_s": None,
                "second_cpu_s": None,
                "finished": False,
            }
        ],
        "failed": ["mqd at 50 ids"],
    }
    md = td.render_md(result)
    assert "| 1,000,000 | 1 | mqd | 400,000 [250,000-500,000] |" in md
    assert "240.0 (100.0) (cancelled)" in md and "did not finish: mqd at 50 ids" in md
    json.dumps(result)


def test_rotation_and_variants(td: ModuleType) -> None:
    assert td.rotate(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert "floor" not in td.variants_for(2, False, set())
    assert td.variants_for(1, True, {"python"}) == ["mqd", "floor", "scan", *td.DIAGNOSTICS]
