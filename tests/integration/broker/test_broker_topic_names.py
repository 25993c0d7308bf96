"""The one topic-name rule at the broker and the producer, against a real node: a heartbeat listing
'..' or '../../etc' is a 400 naming the rule, and the producer refuses such a name before it asks
the cluster anything (issue 13, point 5)."""

from __future__ import annotations

import json
from collections.abc import Callable

import aiohttp
import pyarrow as pa
import pytest
from support.harness import Cluster

from mqd.topic_name import InvalidTopicName
from mqd.wire.client import BrokerClient
from mqd.wire.producer import Producer

BAD = ["..", "../../etc", ".", "a/b", "x" * 250, "", "é"]


@pytest.fixture(scope="module")
def node(module_cluster_factory: Callable[..., Cluster]) -> Cluster:
    return module_cluster_factory(topics={"events": 1})


async def test_heartbeat_topics_follow_the_topic_rule(
    node: Cluster, client: BrokerClient, http: aiohttp.ClientSession
) -> None:
    """Before, any non-empty string was stored as a member's subscription."""
    url = node.url(node.master(0))
    await client.heartbeat(url, "g", "c1", ["events", "a.b-c_9"], 5000)
    for topic in BAD:
        body = json.dumps({"client_id": "c2", "topics": ["events", topic]})
        async with http.post(
            f"{url}/v1/groups/g/heartbeat", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            answer = await resp.json()
        assert resp.status == 400, (topic, answer)
        assert answer["error"] == "bad_request" and "topics[1]" in answer["reason"], answer
    # the refused member never joined
    members = await client.heartbeat(url, "g", "c1", ["events"], 5000)
    assert "c2" not in json.dumps(members)


async def test_producer_refuses_invalid_topic_names(node: Cluster) -> None:
    """Every send path raises InvalidTopicName (not retriable), not a broker round trip's 404."""
    async with Producer(node.bootstrap) as producer:
        for topic in BAD:
            calls = [
                producer.send_batch(topic, 0, [b"x"]),
                producer.send(topic, [b"x"]),
                producer.send_encoded(topic, 0, b""),
                producer.produce_table(topic, 0, pa.table({"value": pa.array([b"x"])})),
            ]
            for call in calls:
                with pytest.raises(InvalidTopicName) as info:
                    await call
                assert info.value.retriable is False
            with pytest.raises(InvalidTopicName):
                producer.partitions_for(topic)
        assert (await producer.send_batch("events", 0, [b"ok"])).count == 1
