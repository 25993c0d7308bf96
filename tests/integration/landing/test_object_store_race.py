"""The claim chain under races and faults, judged from a reader's view (SeaweedFS, two gateways;
and a local directory shared by two stores, the same protocol on LocalObjects).

Each trial: two publishers (one per gateway, each its own LandingStore as two daemons would have)
land offsets 0..N-1 of one partition in files of random sizes, each resuming from the head and
re-seeking after a conflict as the sink does. Every object operation may lose its response (the
operation took effect, or failed, but the caller gets an error) or crash the publisher (before or
after the operation takes effect; a crashed publisher never runs again). In some trials a janitor
runs beside them with age 0 (every staged object is fair game, as if each publisher slept past the
age threshold) and compacts the chain to one claim, and publishers call it between staging and
claiming. Then a clean publisher finishes from the head, and a reader lists the visible files and
reads their offsets: each of 0..N-1 exactly once, and the manifest names exactly the visible files.

With one protocol step removed (``unsafe_skip``: the head check, the claim's create-only
condition, the nonce read-back after an uncertain claim) the same trials find duplicates or losses.
"""

from __future__ import annotations

import io
import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.landing import stage
from support.seaweedfs import fresh_uri

from mqd.landing import layout
from mqd.landing.errors import (
    LandingCorrupt,
    LandingError,
    ObjectStoreError,
    PreconditionFailed,
    PublishConflict,
)
from mqd.landing.local_objects import LocalObjects
from mqd.landing.objects import ObjectInfo, Objects
from mqd.landing.publisher import file_range
from mqd.landing.s3_objects import S3Objects
from mqd.landing.store import LandingStore
from mqd.testing.seaweedfs import SeaweedFS
from mqd.wire import format as fmt

T0 = 1_767_225_600_000
TOPIC = "race"
N = 12  # offsets per trial
P_LOST = 0.05  # per operation: the response is lost
P_LOST_UNSAFE = 0.15  # more often when a step is removed, so one of 600 trials finds the hole
P_CRASH = 0.003  # per operation, before and after it: the publisher dies
PARALLEL = 12  # trials at once (different partitions of one landing)
JANITOR = 0.4  # share of trials with a janitor
STEPS = 120  # bound on one publisher's publication attempts


class Crash(BaseException):
    """The publisher's process died here (not an Exception: nothing in mqd may catch it)."""


class Faulty:
    """Objects that lose responses and crash at random (seeded), around a real store."""

    def __init__(self, inner: Objects, rnd: random.Random, *, lost: float, crash: float) -> None:
        self.inner = inner
        self.rnd = rnd
        self.lost = lost
        self.crash = crash

    @property
    def location(self) -> str:
        return self.inner.location

    def _run(self, mutates: bool, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.rnd.random() < self.crash:
            raise Crash("before")
        outcome: Any = None
        failed: BaseException | None = None
        try:
            outcome = fn(*args, **kwargs)
        except PreconditionFailed as exc:
            failed = exc
        if self.rnd.random() < self.crash:
            raise Crash("after")
        if self.rnd.random() < (self.lost if mutates else self.lost / 4):
            raise ObjectStoreError("injected: the response was lost")
        if failed is not None:
            raise failed
        return outcome

    def put(self, key: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str:
        return str(self._run(True, self.inner.put, key, data, if_absent=if_absent, if_match=if_match))

    def upload(self, key: str, path: Path) -> None:
        self._run(True, self.inner.upload, key, path)

    def get(self, key: str) -> tuple[bytes, str] | None:
        got: tuple[bytes, str] | None = self._run(False, self.inner.get, key)
        return got

    def head(self, key: str) -> ObjectInfo | None:
        info: ObjectInfo | None = self._run(False, self.inner.head, key)
        return info

    def copy(self, src: str, dst: str) -> bool:
        return bool(self._run(True, self.inner.copy, src, dst))

    def list_objects(self, prefix: str, start_after: str = "") -> Any:
        return iter(self._run(False, lambda: list(self.inner.list_objects(prefix, start_after))))

    def list_dirs(self, prefix: str) -> list[str]:
        dirs: list[str] = self._run(False, self.inner.list_dirs, prefix)
        return dirs

    def delete(self, key: str) -> None:
        self._run(True, self.inner.delete, key)


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def objects_at(server: SeaweedFS, uri: str, gateway: int) -> S3Objects:
    """Objects at ``uri`` through one gateway; one boto3 client per gateway for all trials
    (clients are thread-safe and take ~20 ms to build)."""
    endpoint = server.endpoints[gateway]
    with _clients_lock:
        if endpoint not in _clients:
            _clients[endpoint] = server.client(endpoint)
        return S3Objects(uri, client=_clients[endpoint])


def records(first: int, count: int) -> pa.Table:
    raw = fmt.encode_batch(
        [f"v{first + i}".encode() for i in range(count)],
        timestamps=np.full(count, T0, dtype=np.int64),
        base_offset=first,
    )
    return pa.Table.from_batches([fmt.to_arrow(raw, fmt.scan(raw)[0])])


@dataclass
class Verdict:
    partition: int
    duplicates: list[int] = field(default_factory=list)
    losses: list[int] = field(default_factory=list)
    manifest_mismatch: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def bad(self) -> bool:
        return bool(self.duplicates or self.losses or self.manifest_mismatch or self.errors)


def publish(
    store: LandingStore,
    partition: int,
    rnd: random.Random,
    janitor: LandingStore | None,
    errors: list[str],
) -> None:
    """Land offsets 0..N-1 as the sink would: resume from the head, re-seek after a conflict,
    re-read the head after an error. Returns at N, on a crash, or after STEPS attempts; anything
    else (LandingCorrupt, a bug) goes to ``errors``."""
    expected: int | None = None
    known = False
    for _ in range(STEPS):
        try:
            if not known:
                expected = store.head(TOPIC, partition).last_offset
                known = True
            pos = 0 if expected is None else expected + 1
            if pos >= N:
                return
            table = records(pos, min(rnd.randint(1, 5), N - pos))
            rng = file_range(TOPIC, partition, table)
            staged = stage(store, layout.landing_table(TOPIC, partition, table), rng, "none")
            try:
                if janitor is not None and rnd.random() < 0.2:
                    janitor.remove_stale(0.0)  # this publisher slept past the janitor's age
                expected = store.commit(staged, expected).last_offset
            finally:
                store.discard(staged)
        except PublishConflict as conflict:
            expected = conflict.last_offset
        except LandingError:
            known = False
        except Crash:
            return
        except Exception as exc:
            errors.append(repr(exc))
            return


def janitor_loop(store: LandingStore, partition: int, stop: threading.Event) -> None:
    while not stop.wait(0.01):  # paced, not a busy loop: it shares two cores with the publishers
        try:
            store.remove_stale(0.0)
            store.compact(TOPIC, partition, keep=1)
        except LandingError:
            pass
        except LandingCorrupt:
            return  # a publisher without a protocol step broke the chain; the verdict reports it


def read_offsets(store: LandingStore, keys: list[str]) -> list[int]:
    out: list[int] = []
    for key in keys:
        got = store.objects.get(key)
        assert got is not None, key
        out.extend(pq.read_table(io.BytesIO(got[0]), columns=["offset"]).column("offset").to_pylist())
    return out


Landing = Callable[[int], Objects]  # one landing: its objects as seen through gateway 0 or 1


def s3_landings(server: SeaweedFS) -> Callable[[], Landing]:
    """A fresh landing per trial on SeaweedFS (the janitor's listing stays short), two gateways."""

    def new() -> Landing:
        uri = fresh_uri(server)
        return lambda gw: objects_at(server, uri, gw)

    return new


def local_landings(base: Path) -> Callable[[], Landing]:
    """A fresh local directory per trial; each "gateway" its own LocalObjects on it (two daemons
    sharing a POSIX directory)."""
    count = itertools.count()

    def new() -> Landing:
        root = base / f"landing-{next(count)}"
        return lambda _gw: LocalObjects(root)

    return new


def trial(landing: Landing, partition: int, seed: int, skip: frozenset[str], lost: float) -> Verdict:
    verdict = Verdict(partition)
    rnd = random.Random(seed)
    with_janitor = rnd.random() < JANITOR
    pubs = [
        LandingStore(
            Faulty(landing(gw), random.Random(rnd.random()), lost=lost, crash=P_CRASH),
            unsafe_skip=skip,
        )
        for gw in (0, 1)
    ]
    janitor = LandingStore(landing(1)) if with_janitor else None
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=publish, args=(pub, partition, random.Random(rnd.random()), janitor, verdict.errors)
        )
        for pub in pubs
    ]
    if janitor is not None:
        threads.append(threading.Thread(target=janitor_loop, args=(janitor, partition, stop)))
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(timeout=120)
    stop.set()
    threads[-1].join(timeout=60)
    clean = LandingStore(landing(0))
    try:
        publish(clean, partition, random.Random(seed), None, verdict.errors)  # no faults: it finishes
        prefix = f"{layout.topic_dir(TOPIC)}/"
        mine = f"part-{partition:05d}-"
        visible = [
            k for k in clean.visible_files() if k.startswith(prefix) and k.rsplit("/", 1)[1].startswith(mine)
        ]
        seen = Counter(read_offsets(clean, visible))
        verdict.duplicates = sorted(o for o, c in seen.items() if c > 1)
        verdict.losses = sorted(set(range(N)) - set(seen))
        listed = sorted(r.path for r in clean.chain(TOPIC, partition).manifest())
        verdict.manifest_mismatch = listed != sorted(visible)
    except (LandingError, LandingCorrupt, AssertionError) as exc:
        verdict.errors.append(repr(exc))
    return verdict


def run_trials(
    landings: Callable[[], Landing], trials: int, skip: frozenset[str], *, lost: float, stop_at_first: bool
) -> list[Verdict]:
    bad: list[Verdict] = []
    with ThreadPoolExecutor(PARALLEL) as pool:
        for start in range(0, trials, PARALLEL):
            batch = range(start, min(start + PARALLEL, trials))
            for v in pool.map(lambda i: trial(landings(), i, 1000 + i, skip, lost), batch):
                if v.bad:
                    bad.append(v)
            if stop_at_first and any(v.duplicates or v.losses for v in bad):
                break
    return bad


@pytest.mark.slow
# ~100 store requests a trial, each ~3 ms of boto3's Python under one GIL: on the 2.0 GHz Xeon a
# trial costs ~1 s alone (600 took 564 s, 641 s in make test; 300 took 299 s). At this fault
# rate each step's hole shows within: head check and claim condition 12 trials (5-6 of them), the
# read-back 108 (1 of ~100 trials meets it). Without the read-back 17 of 600 local trials found
# its hole: the 1,000 local trials below meet that race ~28 times
@pytest.mark.timeout(1200)
def test_two_publishers_with_crashes_and_lost_responses_land_exactly_once(seaweedfs: SeaweedFS) -> None:
    """300 trials (see the module docstring): no duplicate, no loss, the manifest matches. On
    SeaweedFS they prove S3's conditional writes as the protocol uses them; the protocol's rarest
    race (an uncertain claim read back) gets its numbers from the local-directory variant's 1,000
    trials."""
    bad = run_trials(s3_landings(seaweedfs), 300, frozenset(), lost=P_LOST, stop_at_first=False)
    assert bad == []


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("skip", ["head_check", "claim_condition", "readback"])
def test_each_protocol_step_is_needed(seaweedfs: SeaweedFS, skip: str) -> None:
    """The same trials with one step removed find duplicates or losses in the reader's view
    (stops at the first; other trials may end in LandingCorrupt: a name already taken)."""
    bad = run_trials(s3_landings(seaweedfs), 600, frozenset({skip}), lost=P_LOST_UNSAFE, stop_at_first=True)
    assert any(v.duplicates or v.losses for v in bad), f"no anomaly without {skip}"


# The same protocol on a local directory (LocalObjects: link for create-only, a bounded swap
# lock for If-Match, link for copy): the same trials, the same reader's check.


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~1 min alone on two cores
def test_two_publishers_on_a_local_directory_land_exactly_once(tmp_path: Path) -> None:
    """1,000 trials on a local directory: no duplicate, no loss, the manifest matches."""
    bad = run_trials(local_landings(tmp_path), 1000, frozenset(), lost=P_LOST, stop_at_first=False)
    assert bad == []


@pytest.mark.timeout(300)
def test_two_publishers_on_a_local_directory_smoke(tmp_path: Path) -> None:
    """120 of those trials, in the default run."""
    bad = run_trials(local_landings(tmp_path), 120, frozenset(), lost=P_LOST, stop_at_first=False)
    assert bad == []


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("skip", ["head_check", "claim_condition", "readback"])
def test_each_protocol_step_is_needed_on_a_local_directory(tmp_path: Path, skip: str) -> None:
    """On a local directory too, removing one step finds duplicates or losses."""
    bad = run_trials(local_landings(tmp_path), 600, frozenset({skip}), lost=P_LOST_UNSAFE, stop_at_first=True)
    assert any(v.duplicates or v.losses for v in bad), f"no anomaly without {skip}"
