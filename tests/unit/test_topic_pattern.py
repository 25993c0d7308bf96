"""Topic subscriptions by name or ``re:`` pattern (mqd/topic_pattern.py) and their config check."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqd.config import ConfigError, load_daemon_config
from mqd.topic_pattern import TopicSubscription, check_topic_entry


def test_patterns_match_whole_names_and_skip_internal_topics() -> None:
    """Whole-name matching (Kafka's and Spark's), names kept even when unknown, __ topics skipped."""
    sub = TopicSubscription(["orders", "re:events-.*", "re:^clicks$"])
    available = ["events-1", "events-2", "my-events-3", "clicks", "clicks-old", "__consumer_offsets"]
    assert sub.resolve(available) == ("clicks", "events-1", "events-2", "orders")
    assert TopicSubscription(["re:.*"]).resolve([*available, "orders"]) == tuple(
        sorted(t for t in [*available, "orders"] if not t.startswith("__"))
    )
    assert sub.unmatched(["orders"]) == ("re:events-.*", "re:^clicks$")
    assert sub.unmatched(available) == ()


def test_entries_are_names_or_valid_patterns() -> None:
    """A name follows the topic-name rule; a pattern must compile and not be empty."""
    assert check_topic_entry("re:^a.*") == "re:^a.*"
    for bad, why in (
        ("re:(", "invalid topic pattern"),
        ("re:", "needs a regular expression"),
        ("a/b", "topic"),
    ):
        with pytest.raises(ValueError, match=why):
            check_topic_entry(bad)


def test_an_invalid_pattern_is_a_config_error(tmp_path: Path) -> None:
    """`mqd config check` refuses an invalid regex with the key and the file."""
    path = tmp_path / "mqd.toml"
    path.write_text('[consumer]\ntopics = ["events", "re:events-(["]\n')
    with pytest.raises(ConfigError, match=r"consumer\.topics\.1: invalid topic pattern"):
        load_daemon_config(path, environ={})
    path.write_text('[consumer]\ntopics = ["re:^events-.*"]\n')
    assert load_daemon_config(path, environ={}).consumer.topics == ["re:^events-.*"]
