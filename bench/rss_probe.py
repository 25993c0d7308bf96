"""Where a daemon's memory is: ``python -m bench.rss_probe <mqd arguments>`` runs ``mqd`` (the same
``mqd.operator.cli.main``) with a thread beside it that samples, every ``RSSPROBE_INTERVAL`` seconds (0.05):

- the RSS (``/proc/self/status`` VmRSS) and its high-water mark (VmHWM);
- glibc's ``mallinfo2``: bytes in use (``uordblks``), free but kept inside the heaps (``fordblks``),
  mmapped chunks (``hblkhd``), the heaps' size over every arena (``arena``);
- Arrow's pool: bytes allocated now and its peak (``pa.total_allocated_bytes``, ``max_memory``), once
  pyarrow is imported;
- with ``RSSPROBE_TRACEMALLOC=1``, Python's own allocations (tracemalloc current and peak).

It writes one JSON line per sample to ``RSSPROBE_OUT`` and, at exit, the sample at the RSS peak
and each figure's maximum; ``RSSPROBE_MALLOC_INFO=1`` also writes glibc's ``malloc_info`` (every
arena's heap, free chunks by size) at each new RSS peak, ``RSSPROBE_TRACEMALLOC=1`` the
tracemalloc top 25 by line there (numpy's allocations are traced too), ``RSSPROBE_SMAPS=1`` the
process's mappings there (``/proc/self/smaps``: resident MiB per file, per anonymous mapping size,
and the largest anonymous mappings).

Experiments without a code change, each patched in here before mqd runs (bench/kafka_rss.py sets
them per variant; glibc's own ``MALLOC_*`` and ``ARROW_DEFAULT_MEMORY_POOL`` go through the
environment as they are):

- ``RSSPROBE_WORKERS``: landing worker threads; ``RSSPROBE_ROW_GROUP_BYTES``: the row-group cut;
- ``RSSPROBE_TRIM=1``: ``malloc_trim(0)`` after every publication, on its landing thread;
- ``RSSPROBE_PARQUET_POOL``: the landing's Parquet writers on that Arrow pool (jemalloc, ...) alone;
- ``RSSPROBE_READEXACTLY=1``: asyncio's ``readexactly`` without its intermediate copy of an answer;
- ``RSSPROBE_ARENA_MMAP=1``: the Kafka decoder's arenas from their own anonymous mapping;
- ``RSSPROBE_JE_CONF``: Arrow's jemalloc options (``JE_ARROW_MALLOC_CONF``), ``;`` between them.

Measurement only: the daemon itself is unchanged.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import sys
import threading
import time
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc_mallinfo2() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    return fn


def _malloc_info_writer(path: str) -> Any:
    """A function writing glibc's ``malloc_info`` XML (every arena's heap, free chunks by size) to
    ``path``, replacing what it wrote before."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]

    def write() -> None:
        fp = libc.fopen(path.encode(), b"w")
        if fp:
            libc.malloc_info(0, fp)
            libc.fclose(fp)

    return write


def _status_mb() -> dict[str, float]:
    out: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:", "Threads:")):
                key, value = line.split(":", 1)
                n = float(value.split()[0])
                out[key] = n if key == "Threads" else round(n / 1024, 1)
    return out


def _smaps_writer(path: str) -> Any:
    """A function writing where the resident pages are, from ``/proc/self/smaps``: per file, per
    anonymous mapping size (rounded up to a power of two MiB), and the 12 largest anonymous
    mappings with their address and size (jemalloc's extents, glibc's thread heaps, stacks and
    Python's 1 MiB arenas have telling sizes)."""

    def write() -> None:
        by_file: dict[str, float] = {}
        by_size: dict[str, list[float]] = {}
        anon: list[tuple[float, str, float]] = []
        name, size = "", 0.0
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and not head[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    size = (hi - lo) / 2**20
                    name = head[5] if len(head) > 5 else ""
                    addr = head[0]
                elif head[0] == "Rss:":
                    rss = int(head[1]) / 1024
                    if not rss:
                        continue
                    if name and not name.startswith("[anon"):
                        by_file[name] = by_file.get(name, 0.0) + rss
                    else:
                        bucket = 1 << max(0, (int(size) - 1).bit_length()) if size >= 1 else 0
                        b = by_size.setdefault(f"<={bucket}MiB" if bucket else "<1MiB", [0, 0.0])
                        b[0] += 1
                        b[1] += rss
                        anon.append((rss, addr, size))
        out = {
            "files": {k: round(v, 1) for k, v in sorted(by_file.items(), key=lambda kv: -kv[1]) if v >= 0.5},
            "anon_by_size": {k: [v[0], round(v[1], 1)] for k, v in sorted(by_size.items())},
            "anon_largest": [[round(r, 1), a, round(z, 1)] for r, a, z in sorted(anon, reverse=True)[:12]],
        }
        with open(path, "w") as f:
            json.dump(out, f, indent=1)

    return write


def sample(mallinfo2: Any, trace: bool) -> dict[str, Any]:
    s: dict[str, Any] = {"t": round(time.monotonic(), 3), **_status_mb()}
    if mallinfo2 is not None:
        m = mallinfo2()
        mib = 2**20
        s.update(
            heap_used=round(m.uordblks / mib, 1),
            heap_free=round(m.fordblks / mib, 1),
            mmapped=round(m.hblkhd / mib, 1),
            heap_total=round(m.arena / mib, 1),
        )
    for budget in _BUDGETS:  # the daemon's ByteBudget: what it charges, against the RSS
        s.update(
            pinned=round(budget.pinned / 2**20, 1),
            reserved=round(budget.reserved / 2**20, 1),
            buffered=round(budget.buffered / 2**20, 1),
        )
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        try:
            pool = pa.default_memory_pool()
            s.update(
                arrow=round(pa.total_allocated_bytes() / 2**20, 1),
                arrow_max=round(pool.max_memory() / 2**20, 1),
                arrow_pool=pool.backend_name,
            )
        except Exception:  # not initialised yet
            pass
    if trace:
        import tracemalloc

        cur, peak = tracemalloc.get_traced_memory()
        s.update(py=round(cur / 2**20, 1), py_peak=round(peak / 2**20, 1))
    return s


def start_probe(out: str, interval: float) -> None:
    trace = os.environ.get("RSSPROBE_TRACEMALLOC") == "1"
    if trace:
        import tracemalloc

        tracemalloc.start()
    mallinfo2 = _libc_mallinfo2()
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    f = open(out, "w")  # closed at exit

    info = _malloc_info_writer(out + ".malloc_info.xml") if os.environ.get("RSSPROBE_MALLOC_INFO") else None
    smaps = _smaps_writer(out + ".smaps.json") if os.environ.get("RSSPROBE_SMAPS") else None
    top = 0.0
    snap: list[Any] = [None]

    def run() -> None:
        nonlocal top
        while not stop.wait(interval):
            s = sample(mallinfo2, trace)
            samples.append(s)
            f.write(json.dumps(s) + "\n")
            if s.get("VmRSS", 0) > top + 2:
                top = s["VmRSS"]
                if info is not None:
                    info()  # glibc's per-arena picture at the newest RSS peak
                if smaps is not None:
                    smaps()
                if trace:
                    import tracemalloc

                    snap[0] = tracemalloc.take_snapshot()  # what Python and numpy hold at it

    def summary() -> None:
        stop.set()
        if samples:
            peak = max(samples, key=lambda s: s.get("VmRSS", 0))
            maxima = {
                k: max(s[k] for s in samples if k in s)
                for k in samples[-1]
                if isinstance(samples[-1][k], (int, float))
            }
            f.write(json.dumps({"at_peak": peak, "max": maxima}) + "\n")
        f.close()
        if snap[0] is not None:
            with open(out + ".tracemalloc.txt", "w") as t:
                for stat in snap[0].statistics("lineno")[:25]:
                    t.write(f"{stat}\n")

    atexit.register(summary)
    threading.Thread(target=run, name="rss-probe", daemon=True).start()


def _patch_readexactly() -> None:
    """asyncio's ``StreamReader.readexactly`` (which the Kafka connection reads answers with)
    without its intermediate copy: ``bytes(buffer[:n])`` makes a bytearray of n bytes, then bytes."""
    import asyncio

    orig = asyncio.StreamReader.readexactly

    async def readexactly(self: Any, n: int) -> bytes:
        if n < 65536:
            return await orig(self, n)
        if self._exception is not None:
            raise self._exception
        while len(self._buffer) < n:
            if self._eof:
                incomplete = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(incomplete, n)
            await self._wait_for_data("readexactly")
        if len(self._buffer) == n:
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            with memoryview(self._buffer) as view:
                data = bytes(view[:n])
            del self._buffer[:n]
        self._maybe_resume_transport()
        return data

    asyncio.StreamReader.readexactly = readexactly  # type: ignore[method-assign]


def _patch_decode_arena() -> None:
    """The Kafka decoder's one allocation per decode (``np.empty`` in records_kernel) from its own
    anonymous mapping when it is 1 MiB or more: returned to the kernel when its last view dies,
    never a hole in glibc's heap."""
    import mmap

    import numpy

    from mqd.sources.kafka import records_kernel

    class Shim:
        def __getattr__(self, name: str) -> Any:
            return getattr(numpy, name)

        def empty(self, shape: Any, dtype: Any = float) -> Any:
            if isinstance(shape, int):
                n = shape * numpy.dtype(dtype).itemsize
                if n >= 1 << 20:
                    return numpy.frombuffer(mmap.mmap(-1, n), dtype=dtype)
            return numpy.empty(shape, dtype)

    records_kernel.np = Shim()  # type: ignore[assignment,attr-defined]


def _patch_parquet_pool(name: str) -> None:
    """The landing's Parquet writers allocate from Arrow's ``name`` pool (jemalloc, mimalloc,
    system), the rest of the process from its default pool."""
    import functools

    import pyarrow as pa
    import pyarrow.parquet as real

    from mqd.landing import stage_writer

    pool = getattr(pa, f"{name}_memory_pool")()

    class Shim:
        ParquetWriter = functools.partial(real.ParquetWriter, memory_pool=pool)

        def __getattr__(self, attr: str) -> Any:
            return getattr(real, attr)

    stage_writer.pq = Shim()  # type: ignore[attr-defined]


_BUDGETS: list[Any] = []


def _watch_budget() -> None:
    from mqd.consumer import budget

    init = budget.ByteBudget.__init__

    def watched(self: Any, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        _BUDGETS[:] = [self]

    budget.ByteBudget.__init__ = watched  # type: ignore[method-assign]


def apply_experiments() -> None:
    _watch_budget()
    je = os.environ.get("RSSPROBE_JE_CONF")
    if je:  # Arrow's jemalloc options (``;`` for ``,``, which separates a variant's items)
        os.environ["JE_ARROW_MALLOC_CONF"] = je.replace(";", ",")
    workers = os.environ.get("RSSPROBE_WORKERS")
    if workers:
        from mqd.landing import sink

        init = sink.LandingSink.__init__
        n = int(workers)

        def patched(self: Any, *args: Any, **kw: Any) -> None:
            kw["workers"] = n
            init(self, *args, **kw)

        sink.LandingSink.__init__ = patched  # type: ignore[method-assign]
    if os.environ.get("RSSPROBE_TRIM") == "1":
        from mqd.landing import publisher

        trim = ctypes.CDLL("libc.so.6").malloc_trim
        stream = publisher.Publisher.stream

        def trimmed(self: Any, *args: Any, **kw: Any) -> Any:
            try:
                return stream(self, *args, **kw)
            finally:
                trim(0)

        publisher.Publisher.stream = trimmed  # type: ignore[method-assign]
    if os.environ.get("RSSPROBE_READEXACTLY") == "1":
        _patch_readexactly()
    if os.environ.get("RSSPROBE_ARENA_MMAP") == "1":
        _patch_decode_arena()
    pool = os.environ.get("RSSPROBE_PARQUET_POOL")
    if pool:
        _patch_parquet_pool(pool)
    rg = os.environ.get("RSSPROBE_ROW_GROUP_BYTES")
    if rg:
        from mqd.landing import micro_batches

        micro_batches.ROW_GROUP_BYTES = int(rg)


def main() -> None:
    out = os.environ.get("RSSPROBE_OUT")
    if out:
        start_probe(out, float(os.environ.get("RSSPROBE_INTERVAL", "0.05")))
    apply_experiments()
    from mqd.operator.cli import main as mqd_main

    sys.argv = ["mqd", *sys.argv[1:]]
    mqd_main()


if __name__ == "__main__":
    main()
