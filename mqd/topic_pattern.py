"""Topic subscriptions by name or by pattern (``consumer.topics = ["orders", "re:^events-.*"]``).

A ``re:`` entry is a Python regular expression matched against the whole topic name (Kafka's
``subscribe(Pattern)`` and Spark's ``subscribePattern`` match whole names too). Topics whose
names start with ``__`` (Kafka's internal ``__consumer_offsets``) match no pattern, as with
Kafka's ``exclude.internal.topics``; name them to consume them. The consumer resolves the
subscription against every metadata refresh (mqd/consumer/rebalance.py), so a topic created later
that matches is picked up by the next refresh and rebalanced; a pattern matching nothing is a
warning (log and status), an invalid pattern a config error. Everything downstream (membership,
landing, status) sees concrete topic names only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from mqd.topic_name import check_topic_name

PATTERN_PREFIX = "re:"


def is_pattern(entry: str) -> bool:
    return entry.startswith(PATTERN_PREFIX)


def check_topic_entry(entry: str) -> str:
    """A topic name (mqd.topic_name's rule) or ``re:<regex>``; raises ValueError saying why not."""
    if not is_pattern(entry):
        return check_topic_name(entry)
    body = entry[len(PATTERN_PREFIX) :]
    if not body:
        raise ValueError("a topic pattern needs a regular expression after 're:' (e.g. 're:^events-.*')")
    try:
        re.compile(body)
    except re.error as exc:
        raise ValueError(f"invalid topic pattern {body!r}: {exc}") from None
    return entry


class TopicSubscription:
    """The subscribed names and patterns of one ``consumer.topics`` list."""

    def __init__(self, entries: Iterable[str]) -> None:
        entries = list(entries)
        self.names = tuple(sorted({e for e in entries if not is_pattern(e)}))
        self.patterns = tuple(e for e in dict.fromkeys(entries) if is_pattern(e))
        self._compiled = [(p, re.compile(p[len(PATTERN_PREFIX) :])) for p in self.patterns]

    def matches(self, topic: str) -> bool:
        return not topic.startswith("__") and any(rx.fullmatch(topic) for _, rx in self._compiled)

    def resolve(self, available: Iterable[str]) -> tuple[str, ...]:
        """The concrete topics: every name (known or not: a missing one is reported elsewhere),
        and every available topic a pattern matches; sorted."""
        found = set(self.names)
        found.update(t for t in available if self.matches(t))
        return tuple(sorted(found))

    def unmatched(self, available: Iterable[str]) -> tuple[str, ...]:
        """The patterns that match none of ``available``."""
        topics = [t for t in available if not t.startswith("__")]
        return tuple(p for p, rx in self._compiled if not any(rx.fullmatch(t) for t in topics))


@lru_cache(maxsize=16)
def subscription(entries: tuple[str, ...]) -> TopicSubscription:
    """One compiled subscription per distinct ``consumer.topics`` (config reloads build new ones)."""
    return TopicSubscription(entries)
