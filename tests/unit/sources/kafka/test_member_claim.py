"""A Kafka group member's subscription user data (``MemberClaim``, mqd/sources/kafka/group.py).

Proves that name, generation and owned partitions survive the round trip, that an older mqd's bare
name still decodes as a name owning nothing, and that malformed data decodes to a claim of nothing
rather than failing the leader's assignment.
"""

from __future__ import annotations

from mqd.sources.kafka.group import MemberClaim
from mqd.topic_partition import TopicPartition


def test_round_trip() -> None:
    claim = MemberClaim("zeta", 7, frozenset({TopicPartition("a", 1), TopicPartition("b", 0)}))
    assert MemberClaim.decode(claim.encode()) == claim
    empty = MemberClaim("", None, frozenset())
    assert MemberClaim.decode(empty.encode()) == empty


def test_an_older_members_bare_name() -> None:
    assert MemberClaim.decode(b"zeta") == MemberClaim("zeta", None, frozenset())
    assert MemberClaim.decode(None) == MemberClaim("", None, frozenset())


def test_malformed_data_claims_nothing() -> None:
    assert MemberClaim.decode(b"{not json") == MemberClaim("{not json", None, frozenset())
    odd = b'{"name": 3, "generation": "x", "owned": {"t": [1, "2", null, 3.5], "u": 4}}'
    assert MemberClaim.decode(odd) == MemberClaim("3", None, frozenset({TopicPartition("t", 1)}))
