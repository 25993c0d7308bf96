"""The byte budget charges whole fetch answers until the last slice of them is gone (issue 6).

Batches are zero-copy slices of a fetch answer that spans several partitions, so an answer stays in
memory until every batch cut from it is dropped. With ``budget_held`` (the daemon) the consumer's
``max_buffered_bytes`` bounds those answers (``pinned_bytes``) plus the fetches in flight
(``reserved_bytes``), also after the batches were drained and while the landing sink holds them.
The checks read the consumer's own counters at every answer, not wall-clock figures.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from pathlib import Path
from typing import Any

from support.consumer import config, count_records, new_consumer, produce_numbered, records
from support.daemon import assert_exactly_once, committed, daemon_config
from support.daemon import produce_numbered as produce_daemon
from support.harness import records_of

from mqd.consumer import ByteBudget, TopicPartition
from mqd.process.daemon import Daemon
from mqd.waiting import wait_until
from mqd.wire import format
from mqd.wire.client import BrokerClient, FetchBody


def watch_answers(bb: ByteBudget) -> list[tuple[int, int, int]]:
    """(pinned, reserved, buffered) right after every answer is charged and handled."""
    seen: list[tuple[int, int, int]] = []
    pin = bb.pin

    def checked_pin(body: object, nbytes: int) -> bool:
        tracked = pin(body, nbytes)
        assert tracked, "a fetch answer could not be tracked"
        # the answer is handled in the same callback, right after it is charged
        asyncio.get_running_loop().call_soon(lambda: seen.append((bb.pinned, bb.reserved, bb.buffered)))
        seen.append((bb.pinned, bb.reserved, bb.buffered))
        return tracked

    bb.pin = checked_pin  # type: ignore[method-assign]
    return seen


def batch_len(per_batch: int, width: int = 8) -> int:
    return len(format.encode_batch([b"x" * width] * per_batch))


async def test_fetch_answer_body_is_one_trackable_buffer(cluster_factory: Any) -> None:
    """The client reads a fetch answer into one buffer of its Content-Length that takes weak
    references; it is freed once the last slice of it is dropped."""
    cluster = cluster_factory(topics={"events": 2}, groups=1)
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, range(2), 50, per_batch=10)
        url = cluster.url(cluster.master(0))
        answer = await client.fetch(
            url, [{"topic": "events", "partition": p, "offset": 0, "max_bytes": 1 << 20} for p in (0, 1)]
        )
        body = answer.buffer
        assert isinstance(body, FetchBody)
        ref = weakref.ref(body)
        view = answer.partitions[1].data
        assert [o for o, _ in records_of(view)] == list(range(50))
        del answer, body
        gc.collect()
        assert ref() is not None  # one partition's slice keeps the whole answer
        del view
        gc.collect()
        assert ref() is None


async def test_held_batches_keep_their_answers_charged_until_dropped(cluster_factory: Any) -> None:
    """A consumer with budget_held: drained batches the caller keeps stay charged, so fetching stops
    near the budget (never above it plus one batch); dropping them releases the budget, and every
    record arrives exactly once."""
    cluster = cluster_factory(topics={"events": 4}, groups=1)
    per_batch, count = 10, 400
    budget = 8 * 1024
    slack = batch_len(per_batch) + 1024  # a broker answers at least one whole batch (one node)
    async with BrokerClient(request_timeout=5) as client:
        await produce_numbered(client, cluster, range(4), count, per_batch=per_batch)
        cfg = config(cluster, max_buffered_bytes=budget, partition_max_bytes=1024, fetch_max_wait_ms=100)
        async with new_consumer(cfg, client=client, budget_held=True) as consumer:
            bb = consumer._budget
            seen = watch_answers(bb)
            held: list[Any] = []

            def drain() -> bool:
                held.extend(consumer.fetched_batches())
                return consumer.memory_bound()

            await wait_until(drain, 20, "fetching held back by the budget")
            assert count_records(held) < 4 * count
            assert bb.pinned >= bb.buffered
            got: dict[TopicPartition, list[tuple[int, bytes]]] = {}

            def take(batches: list[Any]) -> int:
                for tp, rows in records(batches).items():
                    got.setdefault(tp, []).extend(rows)
                return sum(len(rows) for rows in got.values())

            take(held)
            held.clear()  # the caller drops its batches: their answers are freed
            deadline = time.monotonic() + 30
            while take(consumer.fetched_batches()) < 4 * count:
                assert time.monotonic() < deadline, "fetching did not resume after the drop"
                await consumer.wait_for_data(0.2)
            for p in range(4):
                assert got[TopicPartition("events", p)] == [(i, f"{p}:{i}".encode()) for i in range(count)]
            assert seen and max(p + r for p, r, _ in seen) <= budget + slack
            assert max(p for p, _, _ in seen) > budget // 2  # the budget was pressed
            gc.collect()
            await wait_until(lambda: bb.pinned == 0, 5, "every answer released")


async def test_daemon_tiny_budget_bounds_answers_held_by_the_sink(
    cluster_factory: Any, tmp_path: Path
) -> None:
    """A daemon whose budget is a small fraction of the backlog and whose sink would wait for a
    long max_age and a large max_bytes: answers pinned by the sink's buffers press the budget, the
    daemon cuts its buffers instead of waiting, the charged bytes never exceed the budget (plus one
    batch per node), and every record lands exactly once with its offset committed."""
    cluster = cluster_factory(topics={"events": 4}, groups=2)
    per_batch, count = 100, 3000
    budget = 64 * 1024
    # a broker answers at least one whole batch: each node's fetch may overshoot its share by one
    # batch and its head, and both nodes' fetches can be in flight at once
    slack = 2 * (batch_len(per_batch) + 1024)
    async with BrokerClient(request_timeout=10) as client:
        await produce_daemon(client, cluster, 4, count, per_batch=per_batch)
        cfg = daemon_config(
            cluster,
            tmp_path,
            consumer={
                "max_buffered_bytes": budget,
                "partition_max_bytes": 8 * 1024,
                "fetch_max_bytes": 16 * 1024,
            },
            max_bytes=16 * 1024 * 1024,
            max_age=120.0,
            max_records=1_000_000,
        )
        d = Daemon(cfg, burst=True)
        await d.start()
        bb = d.consumer._budget
        seen = watch_answers(bb)
        await asyncio.wait_for(d.run(), 60)  # a sink waiting for max_age would time out here
        assert d.state == "stopped" and d.stats["records_published"] == 4 * count
        assert_exactly_once(tmp_path / "landing", 4, count)
        assert await committed(client, cluster, "landing") == {p: count for p in range(4)}
        assert seen and max(p + r for p, r, _ in seen) <= budget + slack
        assert max(p for p, _, _ in seen) > budget // 2
        assert all(p >= b for p, _, b in seen)  # buffered batches are slices of charged answers
        gc.collect()
        await wait_until(lambda: bb.pinned == 0, 5, "every answer released")
