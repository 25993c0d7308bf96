"""A publisher stopped half-way through the claim chain's commit (mqd/landing/claim_chain.py): its
claim is written, its staged file not promoted to the visible name, for tests of readers and
resolvers of a chain's head."""

from __future__ import annotations

import secrets

import numpy as np
import pyarrow as pa

from mqd.landing import layout
from mqd.landing.claim_chain import ChainState, Claim
from mqd.landing.layout import FileRange
from mqd.landing.publisher import file_range
from mqd.landing.store import LandingStore
from mqd.wire import format as fmt
from support.landing import stage

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def claim_unpromoted(
    store: LandingStore, topic: str, partition: int, n: int = 3, *, lose_staged: bool = False
) -> tuple[FileRange, str]:
    """Stage ``n`` records after the head and claim them without promoting (``lose_staged``: the
    janitor then took the staged bytes, so the claim can only be voided). Returns the claimed
    range and the staged key."""
    last = store.head(topic, partition).last_offset
    first = 0 if last is None else last + 1
    raw = fmt.encode_batch([b"half"] * n, timestamps=np.full(n, T0, dtype=np.int64), base_offset=first)
    records = pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])
    rng = file_range(topic, partition, records, None)
    staged = stage(store, layout.landing_table(topic, partition, records, None), rng, "snappy")
    chain = store.chain(topic, partition)
    seq, st = chain.head()
    claim = Claim(
        seq=seq + 1,
        nonce=secrets.token_hex(16),
        prev=st,
        state=ChainState(rng.last_offset, None, st.files + 1, st.watermark_ms),
        range=staged.range,
        staged=staged.location,
        created=layout.iso_now(),
    )
    store.objects.put(chain.claim_key(claim.seq), claim.to_bytes(), if_absent=True)
    if lose_staged:
        store.objects.delete(staged.location)
    return staged.range, staged.location
