"""Hotspots from py-spy's collapsed stacks (``py-spy record --format raw [--threads]``).

Prints, per thread and over all threads: the functions with the most *self* samples (where the CPU
is), and the ones with the most *inclusive* samples (what the time is spent under), in % of samples.

    python bench/profile/collapse.py bench/profile/out/base.pyspy.txt --limit 30
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")  # "fn (path/file.py:123)" -> fn, path


def _name(frame: str) -> str:
    """``fn (…/mqd/landing/layout.py:12)`` -> ``layout.py:fn`` (line numbers merged)."""
    m = _FRAME.match(frame)
    if not m:
        return frame
    fn, path = m.groups()
    return f"{Path(path).name}:{fn}"


def load(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line.strip())
        if m:
            stacks.append((m.group(1).split(";"), int(m.group(2))))
    return stacks


def _thread_of(frames: list[str]) -> tuple[str, list[str]]:
    if frames and frames[0].startswith(("thread ", "process ")):
        i = 0
        while i < len(frames) and frames[i].startswith(("thread ", "process ")):
            i += 1
        return frames[i - 1], frames[i:]
    return "all", frames


def _classify(thread: str, frames: list[str]) -> str:
    """Name a thread by what runs in it (py-spy only gives its id)."""
    text = ";".join(frames)
    if "concurrent/futures/thread.py" in text:
        return "worker (mqd-landing executor)"
    if "asyncio" in text or "uvloop" in text or "run_until_complete" in text:
        return "event loop"
    return thread


# where a sample's time goes: the first pattern found walking its stack from the leaf to the root
CATEGORIES: list[tuple[str, str]] = [
    ("parquet encode (pq.write_table)", "ParquetWriter"),
    ("fsync (data, dir, state, manifest)", "fsync"),
    ("landing state/manifest files", "write_atomic"),
    ("landing state/manifest files", "append_line"),
    ("landing state/manifest files", "_read_state"),
    ("landing state/manifest files", "local_store.py:"),
    ("landing prep (landing_table, hour_runs, concat)", "layout.py:"),
    ("fetch body read (aiohttp StreamReader, data_received)", "streams.py:"),
    ("fetch body read (aiohttp StreamReader, data_received)", "client_proto.py:"),
    ("fetch body read (aiohttp StreamReader, data_received)", "client_reqrep.py:"),
    ("batch CRC (format.check_crc)", "check_crc"),
    ("decode to Arrow (format.to_arrow, _layout)", "format.py:"),
    ("fetch request/answer framing", "protocol.py:"),
    ("fetch request/answer framing", "client.py:"),
    ("aiohttp request machinery", "aiohttp"),
    ("consumer bookkeeping (fetcher, state)", "fetcher.py:"),
    ("consumer bookkeeping (fetcher, state)", "state.py:"),
    ("consumer bookkeeping (fetcher, state)", "consumer.py:"),
    ("sink buffering (add, due, flush)", "sink.py:"),
    ("sink buffering (add, due, flush)", "micro_batches.py:"),
    ("daemon loop", "daemon.py:"),
    ("probe overhead (sampler)", "probe.py:run_daemon.<locals>.sample"),
    ("probe overhead (sampler)", "_thread_cpu"),
    ("interpreter exit (gc at shutdown)", "gc_collect_main"),
    ("event loop itself (uvloop, epoll, callbacks)", "loop.c:"),
    ("event loop itself (uvloop, epoll, callbacks)", "runners.py:"),
]


def categorize(stacks: list[tuple[list[str], int]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for frames, n in stacks:
        label = "other"
        for frame in reversed(frames):
            hit = next((lab for lab, pat in CATEGORIES if pat in frame or pat in _name(frame)), None)
            if hit is not None:
                label = hit
                break
        out[label] += n
    return out


def report(path: Path, limit: int = 25, *, skip_imports: bool = True) -> str:
    stacks = load(path)
    skipped = 0
    if skip_imports:
        # interpreter start-up (imports) is not the daemon's steady state
        kept = [(f, n) for f, n in stacks if not any("_find_and_load" in x for x in f)]
        skipped = sum(n for _, n in stacks) - sum(n for _, n in kept)
        stacks = kept
    total = sum(n for _, n in stacks)
    if not total:
        return f"{path}: no samples\n"
    per_thread: Counter[str] = Counter()
    kinds: dict[str, str] = {}
    self_all: Counter[str] = Counter()
    incl_all: Counter[str] = Counter()
    self_by: dict[str, Counter[str]] = {}
    for frames, n in stacks:
        thread, rest = _thread_of(frames)
        kinds.setdefault(thread, _classify(thread, rest))
        kind = kinds[thread] if kinds[thread] != thread else _classify(thread, rest)
        per_thread[kind] += n
        names = [_name(f) for f in rest]
        if names:
            self_all[names[-1]] += n
            self_by.setdefault(kind, Counter())[names[-1]] += n
        for name in set(names):
            incl_all[name] += n
    out = [f"{path.name}: {total} samples ({skipped} samples of imports left out)"]
    out.append(
        "samples per thread: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in per_thread.most_common())
    )
    out.append("\nwhere the samples go (categories, % of all samples):")
    out += [f"  {100 * n / total:5.1f}%  {lab}" for lab, n in categorize(stacks).most_common()]
    out.append(f"\nself time, all threads (top {limit}):")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in self_all.most_common(limit)]
    out.append(f"\ninclusive time, all threads (top {limit}):")
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in incl_all.most_common(limit)]
    for kind, counter in sorted(self_by.items(), key=lambda kv: -per_thread[kv[0]]):
        out.append(f"\nself time in {kind} (% of all samples, top {min(limit, 15)}):")
        out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in counter.most_common(min(limit, 15))]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stacks", type=Path)
    ap.add_argument("--limit", type=int, default=25)
    args = ap.parse_args()
    print(report(args.stacks, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
