"""Incremental fetch sessions (KIP-227) through the whole consumer engine against the scripted
broker speaking Fetch v7 sessions as Kafka's broker keeps them (tests/support/fake_kafka.py; Tansu
grants no session: it answers session id 0, so the source stays with full requests there)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.consumer import new_consumer
from support.fake_kafka import TP0, TP1, FakeKafka, T, drain, kafka_config, values

from mqd.consumer import TopicPartition
from mqd.waiting import wait_until

TP2 = TopicPartition(T, 2)


@pytest.fixture
async def fake() -> AsyncIterator[FakeKafka]:
    broker = await FakeKafka(T, 3, sessions=True).start()
    try:
        yield broker
    finally:
        await broker.stop()


async def test_full_then_incremental_requests_list_only_what_changed(fake: FakeKafka, tmp_path: Path) -> None:
    """The first request is full (id 0, epoch 0, all three partitions); then the session's requests
    carry its id and epochs 1, 2, 3... and list only partition 0, whose position moved (Kafka's
    broker keeps the offset last sent, not the one it answered up to); the idle partitions 1 and 2
    are not listed again, yet still answered (caught up). Every record arrives
    once, in order."""
    fake.logs[0] = [values(0, b"a", b"b")]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        await drain(c, lambda g: len(g.get(TP0, [])) == 2)
        fake.logs[0].append(values(2, b"c"))
        await drain(c, lambda g: g.get(TP0) == [b"c"])
        fake.logs[0].append(values(3, b"d", b"e"))
        await drain(c, lambda g: g.get(TP0) == [b"d", b"e"])
        await wait_until(lambda: len(fake.session_requests) >= 6, 10, "a few more long polls")
        assert c.positions() == {TP0: 5, TP1: 0, TP2: 0}
    # the log-end lookups (a sessionless Fetch confirming ListOffsets) are not part of the session
    first, *rest = [r for r in fake.session_requests if r[:2] != (0, -1)]
    assert first[:2] == (0, 0) and sorted(first[2]) == [0, 1, 2]
    sid = rest[0][0]
    assert sid != 0 and [r[0] for r in rest] == [sid] * len(rest)
    assert [r[1] for r in rest] == list(range(1, len(rest) + 1))
    assert all(set(r[2]) <= {0} for r in rest), rest
    assert sum(1 for r in rest if r[2] == [0]) >= 3  # partition 0 sent again after each move


async def test_pause_forgets_a_partition_and_resume_adds_it(fake: FakeKafka, tmp_path: Path) -> None:
    """A paused partition leaves the session (forgotten_topics_data) and comes back listed on
    resume; its records arrive once, after the resume."""
    fake.logs[1] = [values(0, b"x")]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        await drain(c, lambda g: g.get(TP1) == [b"x"])
        c.pause([TP1])
        await wait_until(lambda: any(1 in r[3] for r in fake.session_requests), 10, "partition 1 forgotten")
        fake.logs[1].append(values(1, b"y"))
        n = len(fake.session_requests)
        await wait_until(lambda: len(fake.session_requests) >= n + 2, 10, "two more requests")
        c.resume([TP1])
        got = await drain(c, lambda g: g.get(TP1) == [b"y"])
        assert got[TP1] == [b"y"]
    forgot = next(i for i, r in enumerate(fake.session_requests) if 1 in r[3])
    assert any(1 in r[2] for r in fake.session_requests[forgot + 1 :]), "partition 1 never listed again"


async def test_a_lost_session_is_reset_with_a_full_request(fake: FakeKafka, tmp_path: Path) -> None:
    """The broker forgets the session (FETCH_SESSION_ID_NOT_FOUND): the source starts over with a
    full request (id 0, epoch 0) listing every partition, and records keep flowing exactly once."""
    fake.logs[2] = [values(0, b"p")]
    async with new_consumer(kafka_config(fake, tmp_path)) as c:
        await drain(c, lambda g: g.get(TP2) == [b"p"])
        await wait_until(lambda: len(fake.session_requests) >= 3, 10, "incremental requests")
        fake.sessions_dropped()
        n = len(fake.session_requests)
        await wait_until(
            lambda: any(r[:2] == (0, 0) for r in fake.session_requests[n:]), 10, "a full request again"
        )
        fake.logs[2].append(values(1, b"q"))
        got = await drain(c, lambda g: g.get(TP2) == [b"q"])
        assert got[TP2] == [b"q"] and c.positions()[TP2] == 2
    again = next(r for r in fake.session_requests[n:] if r[:2] == (0, 0))
    assert sorted(again[2]) == [0, 1, 2]


async def test_sessions_off_sends_full_requests_without_a_session(fake: FakeKafka, tmp_path: Path) -> None:
    """consumer.kafka.fetch_sessions = false: every request is full and asks for no session
    (id 0, epoch -1)."""
    fake.logs[0] = [values(0, b"a")]
    async with new_consumer(kafka_config(fake, tmp_path, kafka={"fetch_sessions": False})) as c:
        await drain(c, lambda g: g.get(TP0) == [b"a"])
        await wait_until(lambda: len(fake.session_requests) >= 3, 10, "a few requests")
    assert all(r[:2] == (0, -1) and sorted(r[2]) == [0, 1, 2] for r in fake.session_requests)
