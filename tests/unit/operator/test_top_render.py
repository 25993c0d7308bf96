"""`mqd top` drawn from a status JSON made the daemon's way (typed snapshots through
consumer_status_json, the runner's and the admin endpoint's sections around it), read as text at 80
and 160 columns: exact offsets, the columns that fit, the header never wrapped mid-segment, errors
with their age, a lag bar drawn from the lag and not a stale ratio."""

from __future__ import annotations

from support.top_status import NODE_A, NODE_B, busy, partition, status

from mqd.consumer.snapshot import Totals
from mqd.operator.top import COLUMNS, TopView, layout, render_text, sort_rows


def lines_of(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def test_wide_terminal_shows_every_column_exact_offsets_full_node_names() -> None:
    """172 columns: all twelve columns, offsets digit for digit, full node names, the error with its
    age in the ERROR column; no line is wider than the terminal. LAG is the log end minus landed,
    FETCH-LAG the log end minus the fetch position."""
    text = render_text(TopView(), status(*busy()), 172, now=1.0)
    lines = lines_of(text)
    assert all(len(line) <= 172 for line in lines)
    head = next(line for line in lines if line.startswith("TOPIC:PARTITION"))
    assert head.split() == list(COLUMNS)
    assert "18352001" in text and "18352100" in text and "18350000" in text and "1218352" in text
    assert "18.4M" not in text and "1.2M" not in text
    assert NODE_A in text and NODE_B in text
    row1 = next(line for line in lines if line.startswith("events:1 "))
    assert "paused" in row1 and "18352" in row1.split() and "1m3" in row1  # TIME-LAG ~1m30s
    row0 = next(line for line in lines if line.startswith("events:0 ")).split()
    assert row0[COLUMNS.index("LAG")] == "2100" and row0[COLUMNS.index("FETCH-LAG")] == "99"
    assert "timeout" in row1
    # the column is narrower than this error: it is also listed whole under the table
    assert f"events:1: {NODE_B}: timeout (12s ago)" in text


def test_80_columns_drop_the_least_important_columns_and_never_wrap_the_header() -> None:
    """80 columns: FETCH-LAG, COMMITTED and POSITION go first; TOPIC:PARTITION, LAG, TIME-LAG and
    LANDED stay;
    every line fits; the error moves under the table with its age; the header's segments
    (group, member, generation, uptime, version, records/s, CPU, RSS, budget) are whole."""
    text = render_text(TopView(), status(*busy()), 80, now=1.0)
    lines = lines_of(text)
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    head = next(line for line in lines if line.startswith("TOPIC:PARTITION")).split()
    assert "COMMITTED" not in head and "POSITION" not in head and "RATE" not in head
    assert "FETCH-LAG" not in head
    for keep in ("NODE", "LAG", "TIME-LAG", "LANDED", "LOG-END", "STATE"):
        assert keep in head
    assert "broker-a-0.eu" in text and NODE_A not in text  # node names cut before a column goes
    assert f"events:1: {NODE_B}: timeout (12s ago)" in text
    header = " ".join(lines[:4])
    for seg in (
        "mqd 0.1.0",
        "group landing",
        "member host-1-4711",
        "generation 7",
        "up 1h02m",
        "records/s -",
        "CPU -",
        "RSS 84.0MiB",
        "budget 8.0MiB/64.0MiB (12%)",
    ):
        assert seg in header, seg


def test_rates_cpu_and_a_lag_bar_that_is_not_full_under_steady_load() -> None:
    """Second sample 2 s later: RATE per partition, records/s and CPU in the header. Steady load (a
    lag of 2100 records not landed, drained at 5000/s) draws an empty bar, never 100%; a lag of
    minutes of work fills it."""
    view = TopView()
    steady = (busy()[0], busy()[2])
    render_text(view, status(*steady), 160, now=10.0)
    moved = (partition(0, 18_362_001, 18_362_100, landed=18_360_000), busy()[2])
    text = render_text(view, status(*moved, cpu_s=11.0), 160, now=12.0)
    assert "records/s 5,000" in text and "CPU 50%" in text
    row0 = next(line for line in lines_of(text) if line.startswith("events:0 "))
    assert row0.split()[-2] == "5000"  # RATE, before the ERROR column's "-"
    bar = next(
        line for line in lines_of(text) if line.startswith("2 partitions  lag 2100 records not landed")
    )
    assert "[....................]" in bar and "100%" not in text
    far = (partition(0, 18_372_001, 19_372_001, landed=18_370_000), busy()[2])
    text = render_text(view, status(*far, cpu_s=12.0), 160, now=14.0)
    bar = next(line for line in lines_of(text) if line.startswith("2 partitions  lag 1002001 records"))
    assert "[####################] 3m20s to drain" in bar
    # nothing drains the lag (no rate), the bar says so instead of a time
    text = render_text(view, status(*far, cpu_s=12.0), 160, now=16.0)
    bar = next(line for line in lines_of(text) if line.startswith("2 partitions  lag 1002001 records"))
    assert "[####################] not draining" in bar
    # a paused partition's lag is said apart and stays out of the bar: nothing drains it
    ahead = partition(0, 18_382_001, 18_382_100, landed=18_380_000)
    text = render_text(view, status(ahead, busy()[1], cpu_s=13.0), 160, now=18.0)
    bar = next(line for line in lines_of(text) if line.startswith("2 partitions  lag 20452 records"))
    assert "(18352 paused or parked)" in bar and "[....................]" in bar


def test_sort_keys() -> None:
    """--sort lag / time-lag / rate: largest first, unknown last; partition: topic then number."""
    view = TopView()
    rows = view.sample(status(*busy()), now=1.0)
    assert [r.part.partition for r in sort_rows(rows, "lag")] == [1, 0, 2]
    assert [r.part.partition for r in sort_rows(rows, "partition")] == [0, 1, 2]
    assert [r.part.partition for r in sort_rows(rows, "rate")] == [0, 1, 2]  # no rates yet: by partition


def test_empty_and_partial_status_render() -> None:
    """A daemon with nothing assigned, or a status without the optional sections, still draws."""
    text = render_text(TopView(), {"state": "starting"}, 80, now=1.0)
    assert "no partitions assigned" in text and "starting" in text
    cols, _, _ = layout([], 80)
    assert cols[:2] == ["TOPIC:PARTITION", "STATE"] and "LAG" in cols


def test_a_partition_read_from_a_replica_names_its_leader() -> None:
    """The NODE column is where the partition is read; when a replica serves it (the mqd broker's
    slave suggestion, Kafka's preferred read replica) the leader is named beside it."""
    text = render_text(
        TopView(),
        status(partition(0, 10, 20, leader=NODE_B), partition(1, 5, 9, leader=NODE_B)),
        160,
        now=1.0,
    )
    row0 = next(line for line in lines_of(text) if line.startswith("events:0 "))
    row1 = next(line for line in lines_of(text) if line.startswith("events:1 "))
    assert f"{NODE_A} (leader {NODE_B})" in row0
    assert NODE_B in row1 and "leader" not in row1


def test_the_budget_shows_what_it_counts_and_the_memory_outside_its_charges() -> None:
    """The header's budget is what the byte budget counts (ByteBudget.used, which
    test_memory_gauge.py checks), and the RSS above idle outside the charges said apart."""
    totals = Totals(
        3,
        8 << 20,
        1000,
        64 << 20,
        4 << 20,
        20 << 20,
        5,
        1,
        0,
        (),
        memory_outside_bytes=6 << 20,
        budget_used_bytes=30 << 20,
    )
    header = " ".join(lines_of(render_text(TopView(), status(*busy(), totals=totals), 160, now=1.0))[:4])
    assert "budget 30.0MiB/64.0MiB (47%), 6.0MiB outside" in header
