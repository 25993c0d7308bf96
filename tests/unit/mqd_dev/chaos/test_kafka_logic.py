"""The Kafka chaos variant's pure logic: which kinds it plans, the ledger entries of acks that carry
no offset, and the end check's rule for a source log a memory-storage broker destroyed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Message
from mqd_dev.chaos.check import check_payloads
from mqd_dev.chaos.kafka_source import KafkaChaosRun, KafkaLoad
from mqd_dev.chaos.ledger import Ledger, read_ledger
from mqd_dev.chaos.load import record_value
from mqd_dev.chaos.runner import ALL_KINDS, KAFKA_KINDS, ChaosOptions, expand_kinds


def _table(rows: list[tuple[int, int, int]], generation: int = 0) -> pa.Table:
    """A ledger: (partition, offset, seq) per acknowledged record."""
    return pa.table(
        {
            "topic": pa.array(["t"] * len(rows), pa.string()),
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "payload": pa.array([record_value(r[0], r[2]) for r in rows], pa.binary()),
            "generation": pa.array([generation] * len(rows), pa.int32()),
        }
    )


def _copy(rows: list[tuple[int, int, int]]) -> pa.Table:
    """A landing: (partition, offset, seq) per landed row."""
    return pa.table(
        {
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "value": pa.array([record_value(r[0], r[2]) for r in rows], pa.binary()),
        }
    )


def test_kafka_plans_draw_every_kafka_kind_and_nothing_else(tmp_path: Path) -> None:
    """Over 200 planned rounds a Kafka run draws each of its kinds and no mqd-broker kind; ``all``
    means the Kafka kinds there; an mqd-broker kind, or an s3 landing, is refused by name."""
    run = KafkaChaosRun(
        ChaosOptions(root=tmp_path, seed=5, faults_per_round=3, source="kafka", kinds=KAFKA_KINDS)
    )
    drawn = {k for _ in range(200) for k in run._plan_round()[0]}
    assert drawn == set(KAFKA_KINDS)
    assert expand_kinds("all", "kafka") == KAFKA_KINDS and expand_kinds("all") == ALL_KINDS
    assert expand_kinds("broker", "kafka") == ("tansu_kill", "tansu_freeze")
    with pytest.raises(ValueError, match="master_kill"):
        ChaosOptions(root=tmp_path, source="kafka", kinds=("master_kill",)).validate()
    with pytest.raises(ValueError, match="local landing"):
        ChaosOptions(root=tmp_path, source="kafka", kinds=KAFKA_KINDS, landing="s3").validate()


def test_acks_without_an_offset_go_to_the_ledger_at_minus_one(tmp_path: Path) -> None:
    """A batch Tansu answers with base offset -1 (a retried batch it already had) reaches the
    producer numbered -1, 0, 1, ...: those acks are written at offset -1, whether they come in the
    middle of a partition or at its start; real offsets before and after are kept."""
    ledger = Ledger(tmp_path / "ledger.tsv")
    ledger.start()
    load = KafkaLoad("127.0.0.1:1", "t", 2, batch_records=3, interval=1.0, ledger=ledger)
    reports = [(0, o, s) for s, o in enumerate([0, 1, 2, 3, 4])]  # real
    reports += [(0, o, 5 + i) for i, o in enumerate([-1, 0, 1])]  # retried batch, numbered from -1
    reports += [(0, o, 8 + i) for i, o in enumerate([8, 9])]  # the next real batch
    reports += [(1, o, i) for i, o in enumerate([-1, 0, 1])]  # a partition's first batch, retried
    reports += [(1, o, 3 + i) for i, o in enumerate([3, 4])]
    for partition, offset, seq in reports:
        load._delivered(
            None, Message(topic="t", partition=partition, offset=offset, value=record_value(partition, seq))
        )
    ledger.close()
    got = read_ledger(ledger.path)
    assert got.column("offset").to_pylist() == [0, 1, 2, 3, 4, -1, -1, -1, 8, 9, -1, -1, -1, 3, 4]
    assert load.acked_without_offset == 6 and load.acked_end == {0: 10, 1: 5}


def test_an_offsetless_ack_is_expected_at_any_offset_of_its_partition() -> None:
    """An ack at offset -1 landed at offset 7 of its partition is neither lost nor moved."""
    res = check_payloads(_table([(0, -1, 0)]), _copy([(0, 7, 0)]))
    assert res.ok and res.lost == res.moved == 0


def test_a_destroyed_logs_unlanded_tail_is_gone_and_a_hole_is_lost() -> None:
    """Partition 0's generation 0 was destroyed (lossy): ten acks, offsets 0..9. What landed of it
    must be a prefix: landed 0..5 leaves 4 gone with the source and none lost; a landing missing
    offset 3 below the last landed one (5) is one loss. Without ``lossy`` every unlanded ack is lost."""
    ledger = _table([(0, i, i) for i in range(10)])
    prefix = _copy([(0, i, i) for i in range(6)])
    res = check_payloads(ledger, prefix, {(0, 0)})
    assert res.ok and res.gone_with_source == 4 and res.lost == 0
    holed = _copy([(0, i, i) for i in (0, 1, 2, 4, 5)])
    res = check_payloads(ledger, holed, {(0, 0)})
    assert not res.ok and res.lost == 1 and res.gone_with_source == 4
    assert check_payloads(ledger, prefix).lost == 4


def test_a_destroyed_log_gets_a_new_producer(tmp_path: Path) -> None:
    """A memory-storage restart forgets every producer id with the log: new_generation numbers later
    acks as a new generation and has the next produce round start a new producer (the old one went
    on retrying into UNKNOWN_PRODUCER_ID for a round's whole deadline: seed 908583)."""
    ledger = Ledger(tmp_path / "ledger.tsv")
    load = KafkaLoad("127.0.0.1:1", "t", 2, batch_records=3, interval=1.0, ledger=ledger)
    load.acked_end = {0: 7, 1: 9}
    assert not load._fatal
    load.new_generation()
    assert load._fatal and load.generation == {0: 1, 1: 1} and load.acked_end == {0: 0, 1: 0}
