"""Breaking a claim chain by hand, as an operator's slip or a buggy tool would (issue 31): a claim
deleted, overwritten by an older valid claim of the same chain, or overwritten by junk."""

from __future__ import annotations

import pyarrow as pa

from mqd.landing import Publisher
from mqd.landing.claim_chain import chain_prefix
from mqd.landing.objects import Objects
from mqd.wire import format as fmt

HOW = ("deleted", "older", "junk")
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def claim_key(topic: str, partition: int, seq: int) -> str:
    return f"{chain_prefix(topic, partition)}claims/{seq:020d}.json"


def tamper(objects: Objects, topic: str, partition: int, seq: int, how: str) -> str:
    """Break claim ``seq`` of the chain ``how`` (``HOW``); returns its key. ``older`` copies claim
    ``seq - 1`` over it (a valid claim, of the wrong slot)."""
    key = claim_key(topic, partition, seq)
    assert objects.get(key) is not None, f"no claim {key} to tamper with"
    if how == "deleted":
        objects.delete(key)
    elif how == "older":
        got = objects.get(claim_key(topic, partition, seq - 1))
        assert got is not None, "an older claim is needed"
        objects.put(key, got[0])
    elif how == "junk":
        objects.put(key, b"{not a claim")
    else:
        raise ValueError(f"how is one of {HOW}, not {how!r}")
    return key


def publish_files(
    pub: Publisher, topic: str, partition: int, files: int, per_file: int, *, start_file: int = 0
) -> None:
    """``files`` files of ``per_file`` records each, offsets dense from file ``start_file`` on,
    through ``pub``'s store (each after the head it reads)."""
    for f in range(start_file, start_file + files):
        first = f * per_file
        raw = fmt.encode_batch(
            [b"%d:%d" % (partition, i) for i in range(first, first + per_file)],
            timestamps=[T0] * per_file,
            base_offset=first,
        )
        rb = fmt.to_arrow(raw, fmt.scan(raw)[0])
        last = pub.store.head(topic, partition).last_offset
        pub.publish(topic, partition, pa.Table.from_batches([rb]), last)
