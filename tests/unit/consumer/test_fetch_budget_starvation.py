"""No node waits for the byte budget for good (mqd/consumer/budget.py ``queue``, the fetcher's
``_round``): nodes that found it short are served first come, first served, and a long poll over
caught-up partitions reserves one partition's share.

Before: a node whose partitions were all at their log end long-polled with a request as big as what
the budget had left. When that poll ended, its own fetcher was woken first and reserved it all
again, so a node with a backlog that had found the budget short waited for good: a burst of the
``wide`` bench shape stopped at 1,752,000 of 2,000,000 records, one node's partitions never fetched
again. The fetchers run for real on the loop; the source records each request and answers it only
when the test says so."""

from __future__ import annotations

from typing import Any

from support.held_source import HeldSource

from mqd import metrics
from mqd.config import ConsumerConfig
from mqd.consumer import ByteBudget, FlowLimits, SubscriptionState, TopicPartition
from mqd.consumer.fetcher import FetchManager
from mqd.waiting import wait_until

CAUGHT_UP = TopicPartition("events", 0)  # on node a, at its log end
BEHIND = TopicPartition("events", 1)  # on node b, 1,000 records behind
LIMIT = 1 << 20


def _group(name: str, node: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "nodes": [{"id": node, "url": f"http://127.0.0.1:{port}", "role": "master", "alive": True}],
    }


LAYOUT = {
    "groups": [_group("broker-a", "a", 1), _group("broker-b", "b", 2)],
    "topics": [
        {
            "name": "events",
            "partitions": [
                {"partition": p, "group": f"broker-{'ab'[p % 2]}", "master": "ab"[p % 2], "replicas": []}
                for p in range(6)
            ],
        }
    ],
}


def _fetching(budget: ByteBudget) -> tuple[HeldSource, FetchManager]:
    config = ConsumerConfig(bootstrap=["http://127.0.0.1:1"], max_buffered_bytes=LIMIT)
    source = HeldSource(config, LAYOUT)
    state = SubscriptionState(FlowLimits(max_queued_records=10**6, max_offset_span=10**6), budget)
    return source, FetchManager(config=config, source=source, state=state, jitter=0.0)


def _budget_waits() -> float:
    """Rounds that found the budget short, so far (each fetcher's round counts one)."""
    return metrics.REGISTRY.get_sample_value("mqd_flow_control_events_total", {"reason": "budget"}) or 0.0


async def test_a_node_that_found_the_budget_short_goes_before_the_node_whose_request_ended() -> None:
    """Node a's partition is caught up, node b's is behind. a's long poll takes what the budget has
    (1 MiB, less than one partition's 4 MiB share), so b finds it short and waits. When a's poll
    ends, a is woken first: it waits behind b, and b sends; when b's request ends, a's turn. Before,
    a took it all again at the end of every poll, and b never sent."""
    budget = ByteBudget(LIMIT)
    source, manager = _fetching(budget)
    manager.state.assign(CAUGHT_UP, 500, "a").log_end = 500
    manager.state.assign(BEHIND, 0, "b").log_end = 1000
    budget.add_buffered(LIMIT)  # an answer's batches, not drained yet: nothing may be fetched
    waits = _budget_waits()
    manager.start()
    try:
        await wait_until(lambda: _budget_waits() >= waits + 2, 5, "both nodes waiting for the budget")
        waits = _budget_waits()
        budget.take_buffered(LIMIT)
        budget.freed()  # the drain: every fetcher is woken, a first
        await wait_until(lambda: _budget_waits() > waits, 5, "b finding the budget short")
        assert source.sent == [("a", LIMIT)] and list(source.pending) == ["a"]
        for _ in range(3):  # the budget goes by turns: each request's end lets the other send
            source.answer_caught_up("a", CAUGHT_UP, 500)
            await wait_until(lambda: source.pending, 5, "the next fetch")
            assert list(source.pending) == ["b"]
            source.pending.pop("b").cancel()  # b's request ends: a's turn
            await wait_until(lambda: source.pending, 5, "the next fetch")
            assert list(source.pending) == ["a"]
        assert [node for node, _ in source.sent] == ["a", "b", "a", "b", "a", "b", "a"]
    finally:
        await manager.stop()
    assert budget.queue == []


async def test_a_long_poll_over_caught_up_partitions_reserves_one_share() -> None:
    """With every partition caught up (three per node), each node's long poll asks for one
    partition's share (4 MiB), not one per partition (12 MiB): records that arrive meanwhile are
    usually few, more show a backlog that the next request fetches in full, and the other nodes
    keep room to poll."""
    budget = ByteBudget(64 * LIMIT)
    source, manager = _fetching(budget)
    for p in range(6):
        manager.state.assign(TopicPartition("events", p), 500, "ab"[p % 2]).log_end = 500
    manager.start()
    try:
        await wait_until(lambda: len(source.sent) == 2, 5, "both long polls")
        share = manager.config.partition_max_bytes
        assert sorted(source.sent) == [("a", share), ("b", share)]
        assert budget.reserved == 2 * share
        assert budget.queue == []
    finally:
        await manager.stop()
