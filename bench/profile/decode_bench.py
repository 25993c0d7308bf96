"""The consumer's per-answer CPU without a network: what the event loop spends per 1M records.

Builds fetch-answer-sized bodies of wire batches (the bench workload: ``--batch`` records of
``--size`` bytes per batch) and times, per step, what ``FetchManager._decode`` does with them:
header scan, CRC (zlib as today, ISA-L's crc32 as a drop-in if installed), ``format.to_arrow``
(incl. ``_layout``'s offset checks), and the copy that aiohttp's ``read()`` makes when it joins the
received chunks (64 KiB chunks joined into one body).

    python bench/profile/decode_bench.py --records 1000000
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]

import common  # noqa: E402,F401
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from common import Workload  # noqa: E402

from mqd import format as fmt  # noqa: E402


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--answer-mib", type=int, default=4, help="body size, like partition_max_bytes")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    work = Workload(args.records, args.size, 1, args.batch)
    wire = [fmt.encode_batch(v, timestamps=np.full(len(v), 0, dtype=np.int64)) for _, v in work.chunks()]
    bodies: list[bytes] = []
    cur: list[bytes] = []
    for w in wire:
        cur.append(w)
        if sum(map(len, cur)) >= args.answer_mib * 2**20:
            bodies.append(b"".join(cur))
            cur = []
    if cur:
        bodies.append(b"".join(cur))
    total = sum(map(len, bodies))
    infos = [fmt.scan(b, crc=False) for b in bodies]
    per = 1e6 / args.records  # seconds per 1M records

    def scan() -> None:
        for b in bodies:
            fmt.scan(b, crc=False)

    def crc_zlib() -> None:
        for b, inf in zip(bodies, infos, strict=True):
            mv = memoryview(b)
            for i in inf:
                zlib.crc32(mv[i.position + fmt.CRC_FROM : i.position + i.length])

    def to_arrow() -> None:
        for b, inf in zip(bodies, infos, strict=True):
            pbuf = pa.py_buffer(memoryview(b))
            for i in inf:
                fmt.to_arrow(pbuf, i)

    def join_copy() -> None:
        for b in bodies:
            chunks = [b[i : i + 65536] for i in range(0, len(b), 65536)]  # data_received's copies
            b"".join(chunks)  # ClientResponse.read()'s copy

    rows: list[tuple[str, float]] = [
        ("header scan (read_header per batch)", best_of(scan, args.repeat)),
        ("CRC zlib.crc32 (today)", best_of(crc_zlib, args.repeat)),
    ]
    try:
        from isal import isal_zlib

        def crc_isal() -> None:
            for b, inf in zip(bodies, infos, strict=True):
                mv = memoryview(b)
                for i in inf:
                    isal_zlib.crc32(mv[i.position + fmt.CRC_FROM : i.position + i.length])

        rows.append(("CRC isal_zlib.crc32 (same CRC-32)", best_of(crc_isal, args.repeat)))
    except ImportError:
        rows.append(("CRC isal_zlib.crc32: isal not installed", float("nan")))
    rows.append(("format.to_arrow per batch (incl. _layout checks)", best_of(to_arrow, args.repeat)))
    rows.append(("aiohttp-like chunk copies + join of the body", best_of(join_copy, args.repeat)))
    print(
        f"{args.records:,} records of {args.size} B in batches of {args.batch}: {len(wire)} batches, "
        f"{len(bodies)} bodies, {total / 2**20:.0f} MiB"
    )
    for name, s in rows:
        print(f"  {s * per * 1000:8.1f} ms per 1M records  ({s * 1e6 / len(wire):6.1f} us per batch)  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
