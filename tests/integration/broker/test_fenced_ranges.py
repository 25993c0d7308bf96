"""Fenced ranges of mqd/broker/storage.py (issue 12 case 3), on real segment files, and on the wire.

Proves: one damaged batch in an old closed segment (a flipped byte), a closed segment cut short, a
closed segment cut to nothing and a lost segment file each fence exactly the offsets that are gone,
keep every record before and after readable (counted one by one), survive a restart, keep the
incarnation (no offset changes meaning) and are recorded in fenced.json; a read never returns a
hole's bytes; truncation and retention drop fences they pass; a slave can continue its log with
its master's hole (append_fenced), kept over a restart; a fenced range is repaired from a
replica's batches, in a segment and between segments. On a real broker: a fetch inside the hole
answers DATA_LOST with the range and the offset after it, health turns degraded naming the
partition and the offsets, /v1/stats counts them.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.harness import Cluster
from support.storage_node import StorageNode, flip_byte

from mqd.broker.storage import FENCED_FILE, PartitionLog
from mqd.wire import format as fmt
from mqd.wire.client import BrokerClient

TOPIC = "events"
PER_BATCH = 2


def _batch(i: int) -> bytes:
    return fmt.encode_batch([bytes([i % 256]) * 100] * PER_BATCH, timestamps=[1_000 + i] * PER_BATCH)


def _fill(plog: PartitionLog, batches: int) -> dict[int, bytes]:
    """Append ``batches`` batches; their record values by offset."""
    values = {}
    for i in range(batches):
        batch = _batch(i)
        first, last = plog.append(batch, fmt.validate(batch))
        for off in range(first, last + 1):
            values[off] = bytes([i % 256]) * 100
    return values


def _records(plog: PartitionLog) -> dict[int, bytes]:
    """Every record the log serves, reading on after each fenced range like a consumer."""
    out: dict[int, bytes] = {}
    offset = plog.min_offset
    while offset < plog.max_offset:
        fenced = plog.fenced_at(offset)
        if fenced is not None:
            offset = fenced[1] + 1
            continue
        data = plog.read(offset, 10**9)
        assert data, offset
        for info in fmt.scan(data):  # whole, intact batches only: a hole's bytes never come out
            table = fmt.to_arrow(data, info)
            for i, value in enumerate(table.column("value").to_pylist()):
                out[info.base_offset + i] = value
            offset = info.next_offset
    return out


def _batch_positions(path: Path) -> list[fmt.BatchInfo]:
    return fmt.scan(path.read_bytes())


def test_flipped_byte_in_an_old_closed_segment_keeps_everything_else(storage_node: StorageNode) -> None:
    """A flipped byte in a middle batch of the second (closed, trusted-index) segment: exactly that
    batch's offsets are fenced, every other record of every segment reads back, the log end and the
    incarnation stay, and a restart finds the same fence."""
    plog = storage_node.open()
    values = _fill(plog, 60)
    incarnation, end, segments = plog.incarnation, plog.max_offset, plog.segment_count
    assert segments >= 5
    storage_node.close()
    second = storage_node.segments()[1]
    infos = _batch_positions(second)
    victim = infos[3]
    second.with_suffix(".index").unlink()  # the index would be trusted: its first and last batch are fine
    flip_byte(second, victim.position + victim.length - 9)
    plog = storage_node.open()
    lost = (victim.base_offset, victim.base_offset + PER_BATCH - 1)
    assert plog.fenced_ranges() == [lost]
    assert plog.fenced_at(lost[0]) == lost and plog.fenced_at(lost[0] - 1) is None
    assert plog.segment_count == segments and plog.max_offset == end
    assert plog.incarnation == incarnation
    got = _records(plog)
    assert len(got) == len(values) - PER_BATCH
    assert got == {o: v for o, v in values.items() if not lost[0] <= o <= lost[1]}
    # a read from before the hole stops at it
    before = plog.read(lost[0] - PER_BATCH, 10**9)
    assert fmt.scan(before)[-1].next_offset == lost[0]
    recorded = json.loads((storage_node.folder / FENCED_FILE).read_text())
    assert recorded["fenced"] == [{"first": lost[0], "last": lost[1]}]
    plog = storage_node.open()
    assert plog.fenced_ranges() == [lost] and _records(plog) == got
    # appends go on at the old end
    batch = _batch(99)
    assert plog.append(batch, fmt.validate(batch))[0] == end


@pytest.mark.parametrize("how", ["cut_mid_batch", "cut_at_batch", "cut_to_nothing", "file_lost"])
def test_closed_segment_cut_short_or_lost_is_fenced(storage_node: StorageNode, how: str) -> None:
    """A closed segment cut short (mid-batch, at a batch boundary, to 0 bytes) or deleted: the
    offsets it no longer holds are fenced up to the next segment's base, nothing else is lost."""
    plog = storage_node.open()
    values = _fill(plog, 60)
    end = plog.max_offset
    storage_node.close()
    segs = storage_node.segments()
    third, fourth_base = segs[2], int(segs[3].stem)
    infos = _batch_positions(third)
    if how == "cut_mid_batch":
        keep = infos[2].position + 20
        lost_first = infos[2].base_offset
    elif how == "cut_at_batch":
        keep = infos[2].position
        lost_first = infos[2].base_offset
    else:
        keep = 0
        lost_first = int(third.stem)
    if how == "file_lost":
        third.unlink()
    else:
        with open(third, "r+b") as fh:
            fh.truncate(keep)
    plog = storage_node.open()
    lost = (lost_first, fourth_base - 1)
    assert plog.fenced_ranges() == [lost]
    assert plog.max_offset == end
    assert _records(plog) == {o: v for o, v in values.items() if not lost[0] <= o <= lost[1]}
    assert storage_node.open().fenced_ranges() == [lost]


def test_truncation_and_retention_drop_the_fences_they_pass(tmp_path: Path) -> None:
    """A truncation into a fenced range ends the log at its first offset and the fence goes; size
    retention deleting the damaged segment drops its fence (and the record says so)."""
    n = StorageNode(tmp_path, retention_bytes=4 * 4096)
    try:
        plog = n.open()
        _fill(plog, 60)
        n.close()
        second = n.segments()[1]
        victim = _batch_positions(second)[2]
        second.with_suffix(".index").unlink()
        flip_byte(second, victim.position + 60)
        plog = n.open()
        assert plog.fenced_ranges() == [(victim.base_offset, victim.base_offset + 1)]
        _fill(plog, 40)
        plog.apply_retention(now_ms=10**15)
        assert plog.min_offset > victim.base_offset
        assert plog.fenced_ranges() == []
        assert json.loads((n.folder / FENCED_FILE).read_text())["fenced"] == []
    finally:
        n.close()


def test_truncate_into_a_hole(storage_node: StorageNode) -> None:
    """truncate_to an offset inside a fenced range cuts at the range's first offset; no fence stays."""
    plog = storage_node.open()
    _fill(plog, 60)
    storage_node.close()
    second = storage_node.segments()[1]
    victim = _batch_positions(second)[2]
    second.with_suffix(".index").unlink()
    flip_byte(second, victim.position + 60)
    plog = storage_node.open()
    before = plog.incarnation
    plog.truncate_to(victim.base_offset + 1)
    assert plog.max_offset == victim.base_offset and plog.fenced_ranges() == []
    assert plog.incarnation != before and plog.diverged_at(before) == victim.base_offset
    assert storage_node.open().max_offset == victim.base_offset


def test_slave_continues_with_its_masters_hole(storage_node: StorageNode) -> None:
    """append_fenced continues the log with a fenced range and no bytes; appends go on after it;
    it survives restarts, at the log end and once batches follow it, also after a roll."""
    plog = storage_node.open()
    values = _fill(plog, 3)
    plog.append_fenced(6, 9)
    assert plog.max_offset == 10 and plog.fenced_ranges() == [(6, 9)]
    plog = storage_node.open()
    assert plog.max_offset == 10 and plog.fenced_ranges() == [(6, 9)]
    more = _batch(7)
    infos = fmt.validate(more)
    buf = bytearray(more)
    fmt.set_base_offset(buf, 0, 10)
    plog.append_replica(bytes(buf), [fmt.read_header(buf)])
    assert infos[0].count == PER_BATCH
    for _ in range(40):  # roll into later segments
        _fill(plog, 1)
    plog = storage_node.open()
    assert plog.fenced_ranges() == [(6, 9)]
    got = _records(plog)
    assert all(got[o] == v for o, v in values.items()) and 10 in got and 6 not in got


def test_repair_a_hole_in_a_segment_and_a_gap(storage_node: StorageNode) -> None:
    """repair_fenced with the replica's intact batches rewrites the damaged segment or fills the
    lost segment's gap: every record reads back, nothing is fenced, also after a restart."""
    plog = storage_node.open()
    values = _fill(plog, 60)
    good = plog.read(0, 10**9)
    storage_node.close()
    segs = storage_node.segments()
    second, lost_file = segs[1], segs[3]
    victim = _batch_positions(second)[2]
    gap = (int(lost_file.stem), int(segs[4].stem) - 1)
    second.with_suffix(".index").unlink()
    flip_byte(second, victim.position + 60)
    lost_file.unlink()
    plog = storage_node.open()
    hole = (victim.base_offset, victim.base_offset + 1)
    assert plog.fenced_ranges() == [hole, gap]
    replica = {info.base_offset: good[info.position : info.position + info.length] for info in fmt.scan(good)}

    def batches_for(first: int, last: int) -> tuple[bytes, list[fmt.BatchInfo]]:
        data = b"".join(b for base, b in sorted(replica.items()) if first <= base <= last)
        return data, fmt.validate(data)

    with pytest.raises(Exception, match="do not cover exactly"):
        plog.repair_fenced(*batches_for(gap[0], gap[0]))
    plog.repair_fenced(*batches_for(*hole))
    assert plog.fenced_ranges() == [gap]
    plog.repair_fenced(*batches_for(*gap))
    assert plog.fenced_ranges() == []
    assert _records(plog) == values
    assert plog.read(0, 10**9) == good
    plog = storage_node.open()
    assert plog.fenced_ranges() == [] and _records(plog) == values


# -- on the wire --------------------------------------------------------------------------------


def _get(url: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + path, timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


async def test_broker_answers_data_lost_and_reports_the_hole(cluster_factory: Callable[..., Cluster]) -> None:
    """A node restarted over a flipped byte in an old segment: a fetch in the hole answers DATA_LOST
    with lost_first/lost_last and next_offset after it, a fetch before it stops at it, later
    records are served; /v1/health is degraded naming the partition and offsets; /v1/stats counts
    the fenced offsets."""
    cluster = cluster_factory(topics={TOPIC: 1}, node_settings={"storage": {"segment_bytes": 4096}})
    node_id = cluster.master(0)
    url = cluster.url(node_id)
    client = BrokerClient(request_timeout=10.0)
    await client.start()
    try:
        for i in range(60):
            await client.produce(url, TOPIC, 0, _batch(i))
    finally:
        await client.close()
    assert _get(url, "/v1/health")["status"] == "ok"
    cluster.stop_node(node_id)
    folder = cluster.nodes[node_id].data_dir / "logs" / f"{TOPIC}-0"
    second = sorted(folder.glob("*.log"))[1]
    victim = _batch_positions(second)[1]
    second.with_suffix(".index").unlink()
    flip_byte(second, victim.position + 60)
    cluster.start_node(node_id)
    lost = (victim.base_offset, victim.base_offset + PER_BATCH - 1)
    client = BrokerClient(request_timeout=10.0)
    await client.start()
    try:
        answer = await client.fetch(
            url,
            [
                {"topic": TOPIC, "partition": 0, "offset": lost[0] + 1},
                {"topic": TOPIC, "partition": 0, "offset": lost[0] - PER_BATCH},
                {"topic": TOPIC, "partition": 0, "offset": lost[1] + 1},
            ],
            max_wait_ms=0,
        )
    finally:
        await client.close()
    in_hole, before, after = answer.partitions
    assert in_hole.status == "DATA_LOST" and len(in_hole.data) == 0
    assert (in_hole.lost_first, in_hole.lost_last, in_hole.next_offset) == (*lost, lost[1] + 1)
    assert before.status == "FOUND" and before.next_offset == lost[0]
    assert after.status == "FOUND" and fmt.scan(bytes(after.data))[0].base_offset == lost[1] + 1
    health = _get(url, "/v1/health")
    assert health["status"] == "degraded"
    assert any(f"{TOPIC}-0: offsets {lost[0]}..{lost[1]} fenced" in r for r in health["reasons"]), health
    stats = _get(url, "/v1/stats")
    assert stats["fenced_offsets"] == PER_BATCH
    assert stats["fenced"] == [{"topic": TOPIC, "partition": 0, "first": lost[0], "last": lost[1]}]


def test_damage_inside_the_active_segment_with_intact_batches_after_is_fenced(
    storage_node: StorageNode,
) -> None:
    """A flipped byte in a middle batch of the active segment, intact batches after it: not a torn
    tail, so nothing is cut (no new incarnation); the batch is fenced and the rest is served."""
    plog = storage_node.open()
    values = _fill(plog, 8)
    assert plog.segment_count == 1
    incarnation, end = plog.incarnation, plog.max_offset
    storage_node.close()
    active = storage_node.segments()[-1]
    victim = _batch_positions(active)[3]
    flip_byte(active, victim.position + 60)
    plog = storage_node.open()
    lost = (victim.base_offset, victim.base_offset + PER_BATCH - 1)
    assert plog.fenced_ranges() == [lost] and plog.max_offset == end
    assert plog.incarnation == incarnation and len(plog.history) == 1
    assert _records(plog) == {o: v for o, v in values.items() if not lost[0] <= o <= lost[1]}


def test_flipped_bit_in_a_base_offset_does_not_renumber_records(storage_node: StorageNode) -> None:
    """The CRC does not cover a batch's base offset: a flipped high bit there makes the batch look
    like it sits far ahead. It is treated as damage (fenced), not as a jump that would renumber
    its records and everything after, nor as a torn tail that would cut the rest."""
    plog = storage_node.open()
    values = _fill(plog, 8)
    end = plog.max_offset
    storage_node.close()
    active = storage_node.segments()[-1]
    victim = _batch_positions(active)[3]
    with open(active, "r+b") as fh:
        fh.seek(victim.position + 8 + 5)  # byte 5 of the little-endian base offset: + 2**40
        b = fh.read(1)
        fh.seek(victim.position + 8 + 5)
        fh.write(bytes([b[0] ^ 1]))
    plog = storage_node.open()
    lost = (victim.base_offset, victim.base_offset + PER_BATCH - 1)
    assert plog.fenced_ranges() == [lost] and plog.max_offset == end
    assert _records(plog) == {o: v for o, v in values.items() if not lost[0] <= o <= lost[1]}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_flipped_byte_loses_exactly_its_batch(
    tmp_path_factory: pytest.TempPathFactory, data: Any
) -> None:
    """For a byte flipped anywhere in any batch of any segment (header fields included, index
    removed so the segment is scanned): exactly that batch's offsets are gone and every other
    record reads back. In a closed segment or mid-active-segment the batch is fenced and the log
    end stays; as the last batch of the active segment it is a torn tail, cut, with a new
    incarnation at its base."""
    storage_node = StorageNode(tmp_path_factory.mktemp("flip"))
    try:
        plog = storage_node.open()
        values = _fill(plog, data.draw(st.integers(min_value=2, max_value=40), label="batches"))
        end, before = plog.max_offset, plog.incarnation
        storage_node.close()
        segs = storage_node.segments()
        si = data.draw(st.integers(min_value=0, max_value=len(segs) - 1), label="segment")
        infos = _batch_positions(segs[si])
        bi = data.draw(st.integers(min_value=0, max_value=len(infos) - 1), label="batch")
        victim = infos[bi]
        at = data.draw(st.integers(min_value=0, max_value=victim.length - 1), label="byte")
        segs[si].with_suffix(".index").unlink(missing_ok=True)
        with open(segs[si], "r+b") as fh:
            fh.seek(victim.position + at)
            b = fh.read(1)
            fh.seek(victim.position + at)
            fh.write(bytes([b[0] ^ data.draw(st.integers(min_value=1, max_value=255), label="xor")]))
        plog = storage_node.open()
        lost = (victim.base_offset, victim.next_offset - 1)
        torn_tail = si == len(segs) - 1 and bi == len(infos) - 1
        if torn_tail:
            assert plog.fenced_ranges() == [] and plog.max_offset == victim.base_offset
            assert plog.diverged_at(before) == victim.base_offset
        else:
            assert plog.fenced_ranges() == [lost] and plog.max_offset == end
            assert plog.incarnation == before
        assert _records(plog) == {o: v for o, v in values.items() if not lost[0] <= o <= lost[1]}
    finally:
        storage_node.close()
