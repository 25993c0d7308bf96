"""The planning of the s3:// landing's Spark source (mqd.spark.landing_source), pure logic: how far a
micro-batch goes on each partition chain under maxFilesPerTrigger, which files it reads, how they are
packed into Spark input partitions and fetched ahead, and the Arrow batches a landed file becomes
(the job's source schema)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.config import write_file

from mqd.config import load_daemon_config
from mqd.landing import layout
from mqd.landing.layout import FileRange
from mqd.landing.publisher import file_range
from mqd.spark import landing_source
from mqd.spark.landing_source import (
    SOURCE_ARROW_SCHEMA,
    LandedFile,
    LandingSource,
    LandingSourceError,
    Split,
    fetched,
    file_batches,
    hive_values,
    new_files,
    pack,
    plan_end,
)
from mqd.spark.source_schema import SOURCE_FILE_COLUMN
from mqd.spark.static_checks import ddl_field_names
from mqd.wire import format as fmt

chains = st.lists(st.sampled_from(["a/0", "a/1", "b/0", "b/7"]), unique=True)


@st.composite
def offsets(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, int]]:
    """(start, heads): heads at or past start on most chains, new chains (absent from start) too."""
    keys = draw(chains)
    start = {k: draw(st.integers(0, 20)) for k in keys if draw(st.booleans())}
    heads = {k: start.get(k, 0) + draw(st.integers(0, 20)) for k in keys}
    return start, heads


@given(offsets(), st.one_of(st.none(), st.integers(1, 50)))
def test_plan_moves_towards_the_heads_within_the_budget(
    sh: tuple[dict[str, int], dict[str, int]], max_files: int | None
) -> None:
    """Every chain ends between its start and its head; the batch has min(budget, available)
    files, so a query always progresses and never reads past a head; no chain is left behind
    while another takes two files more than it (round-robin)."""
    start, heads = sh
    end = plan_end(start, heads, max_files)
    assert set(end) == set(start) | set(heads)
    for k, v in end.items():
        assert start.get(k, 0) <= v <= max(heads.get(k, 0), start.get(k, 0))
    available = sum(heads[k] - start.get(k, 0) for k in heads)
    taken = sum(end[k] - start.get(k, 0) for k in end)
    assert taken == (available if max_files is None else min(max_files, available))
    moved = [end[k] - start.get(k, 0) for k in heads if end[k] < heads[k]]
    if moved:  # a chain still behind its head got no fewer files than any other, minus one
        assert max(end[k] - start.get(k, 0) for k in heads) <= min(moved) + 1


def test_a_head_below_the_start_never_moves_the_offset_back() -> None:
    """A landing replaced under a checkpoint (fewer files than the offset says) keeps the offset;
    the planner of files then refuses it with an error naming the chain."""
    assert plan_end({"a/0": 5}, {"a/0": 2}, None) == {"a/0": 5}
    files = {"a/0": [FileRange(f"f{i}", "a", 0, i, i, 1, 0, 0) for i in range(2)]}
    with pytest.raises(LandingSourceError, match="a/0"):
        new_files({"a/0": 0}, {"a/0": 5}, files)


def test_new_files_are_the_chains_slices_in_chain_order() -> None:
    """(start, end] of each chain, chains in key order, files in chain order."""
    files = {k: [FileRange(f"{k}#{i}", "t", 0, i, i, 1, 0, 0) for i in range(4)] for k in ("t/0", "t/1")}
    got = new_files({"t/0": 1}, {"t/0": 3, "t/1": 2}, files)
    assert [r.path for r in got] == ["t/0#1", "t/0#2", "t/1#0", "t/1#1"]


def test_hive_values_of_a_landed_path() -> None:
    """dt and hour come from the folder names, as Spark's file source reads them."""
    assert hive_values("topic=e/dt=2026-01-01/hour=07/part-00000-00000000000000000000.parquet") == (
        "2026-01-01",
        7,
    )
    with pytest.raises(LandingSourceError):
        hive_values("somewhere/else.parquet")


def test_a_landed_file_becomes_batches_of_the_source_schema() -> None:
    """A file written by the landing's own writer reads as the job's source columns: dictionary
    columns decoded, ``timestamp`` as its epoch ms (out-of-range values untouched, the job clamps
    them), dt/hour from the path, the file's URI on every row; the Arrow schema and the DDL the
    data source declares agree column for column."""
    ts = np.array([1_767_225_600_000, -5, 2**62], dtype=np.int64)
    raw = fmt.encode_batch([b"a", b"b", b"c"], timestamps=ts, base_offset=40)
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    rng = file_range("events", 3, records, "0" * 32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.parquet"
        layout.write_parquet(path, layout.landing_table("events", 3, records, "0" * 32), rng, "snappy")
        data = path.read_bytes()
    [batch] = list(file_batches(data, "topic=events/dt=2026-01-01/hour=00/x.parquet", "s3://b/p/x"))
    assert batch.schema == SOURCE_ARROW_SCHEMA
    assert batch.column("timestamp").to_pylist() == ts.tolist()
    assert batch.column("offset").to_pylist() == [40, 41, 42]
    assert set(batch.column("topic").to_pylist()) == {"events"}
    assert set(batch.column("incarnation").to_pylist()) == {"0" * 32}
    assert (
        batch.column("dt").to_pylist() == ["2026-01-01"] * 3 and batch.column("hour").to_pylist() == [0] * 3
    )
    assert batch.column(SOURCE_FILE_COLUMN).to_pylist() == ["s3://b/p/x"] * 3
    assert SOURCE_ARROW_SCHEMA.names == ddl_field_names(LandingSource({}).schema())


def test_config_check_accepts_an_s3_landing_with_the_spark_job(tmp_path: Path) -> None:
    """An s3:// landing.dir with [landing.s3] and a [spark] section (JSON mode) loads: the job reads
    the URI landing, so nothing refuses the combination."""
    path = write_file(
        tmp_path,
        '[landing]\ndir = "s3://lake/landing"\n[landing.s3]\nendpoint_url = "http://127.0.0.1:8333"\n'
        '[spark]\nvalue_format = "json"\nvalue_schema = "user STRING"\nmax_files_per_trigger = 5\n',
    )
    cfg = load_daemon_config(path, {})
    assert cfg.landing.dir == "s3://lake/landing" and cfg.spark.max_files_per_trigger == 5


def test_the_reader_pickles_without_its_driver_state() -> None:
    """What Spark ships to executors for read(): the options only, not the driver's listing or
    clients (a listing grows with the landing; a boto3 client does not pickle)."""
    import pickle

    from mqd.spark.landing_source import LandingStreamReader

    reader = LandingStreamReader({"uri": "s3://b/p", "maxFilesPerTrigger": "7"})
    reader._chains = {"t/0": [FileRange("x", "t", 0, 0, 0, 1, 0, 0)]}
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options and copy.max_files == 7 and copy._chains == {}


def _files(sizes: list[int]) -> list[FileRange]:
    return [FileRange(f"f{i}", "t", 0, i, i, 1, 0, 0, bytes=b) for i, b in enumerate(sizes)]


@given(
    st.lists(st.integers(0, 300), max_size=60),
    st.integers(1, 400),
    st.integers(0, 50),
    st.integers(1, 8),
)
def test_packing_keeps_every_file_once_in_order_within_spark_s_split_size(
    sizes: list[int], max_bytes: int, open_cost: int, min_partitions: int
) -> None:
    """Every file lands in exactly one input partition, in the given order; a partition holds more
    than one file only within Spark's split size (min(max, max(open cost, total / min partitions)))."""
    split = Split(max_bytes, open_cost, min_partitions)
    files = _files(sizes)
    packed = pack(files, split)
    assert [f for part in packed for f in part] == files and all(packed)
    total = sum(b + open_cost for b in sizes)
    target = min(max_bytes, max(open_cost, total // min_partitions))
    for part in packed:
        assert len(part) == 1 or sum(f.bytes + open_cost for f in part) <= target


def test_many_small_files_share_a_task_and_big_ones_spread() -> None:
    """Spark's defaults: 5,600 files of 9 KB (a slow S3 landing) make tasks of 31 files (a split of
    128 MiB, a file costing its 4 MiB open cost and its bytes), not 5,600 tasks; files of 100 MB
    make one partition each."""
    small = pack(_files([9_000] * 5_600), Split(min_partitions=2))
    assert [len(p) for p in small] == [31] * 180 + [20]
    assert len(pack(_files([100_000_000] * 3), Split(min_partitions=2))) == 3
    assert pack([], Split()) == []


def test_split_options_round_trip() -> None:
    split = Split(64 << 20, 1 << 20, 3)
    assert Split.from_options({"uri": "s3://b/p", **split.to_options()}) == split
    assert Split.from_options({}) == Split()


def test_fetching_ahead_keeps_the_order_and_a_bounded_window() -> None:
    """Files come back in the partition's order with their own bodies, however the fetches finish,
    never more than FETCH_AHEAD_FILES in flight; a file the store lacks comes back as None."""
    import random
    import threading
    import time

    lock = threading.Lock()
    in_flight = peak = 0

    def get(path: str) -> tuple[bytes, str] | None:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        time.sleep(random.random() / 500)
        with lock:
            in_flight -= 1
        return None if path == "gone" else (path.encode(), "etag")

    files = [LandedFile(f"f{i}", 10) for i in range(40)] + [LandedFile("gone", 0)]
    got = list(fetched(files, get))
    assert [f for f, _ in got] == files
    assert [b for _, b in got] == [(f.path.encode(), "etag") for f in files[:-1]] + [None]
    assert 1 <= peak <= landing_source.FETCH_AHEAD_FILES


def test_fetching_ahead_stops_at_the_byte_window_and_when_the_reader_stops() -> None:
    """Files over FETCH_AHEAD_BYTES are fetched one at a time; closing the iterator early (a
    failed decode) starts no further fetch."""
    started: list[str] = []

    def get(path: str) -> tuple[bytes, str] | None:
        started.append(path)
        return b"", ""

    big = landing_source.FETCH_AHEAD_BYTES
    it = fetched([LandedFile(f"b{i}", big) for i in range(5)], get)
    next(it)
    assert len(started) <= 2  # the one read, and at most the next once the first was taken
    it.close()
    n = len(started)
    assert n < 5
    small = fetched([LandedFile(f"s{i}", 1) for i in range(100)], get)
    next(small)
    small.close()
    assert len(started) - n <= landing_source.FETCH_AHEAD_FILES + 1
