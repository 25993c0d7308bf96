"""The read-only, incremental view of a landing's claim chains: what readers (the Spark driver's s3
source, the lifecycle's cleaner) use instead of ``LandingStore.manifest()``.

``manifest()`` resolves each chain's head first, as every writer's head read does (it may copy a
staged object or write a void record), so it needs write access, and it reads every claim above the
floor on every call. A reader needs neither:

- *Only what is claimed and visible.* Claim ``k + 1`` is written only by someone who saw claim
  ``k``'s file visible, or it is the void record of ``k``; a claim whose file is visible is never
  voided. So a file claim below the newest is live iff the next claim does not void it (no request
  needed), and only the newest claim's file is checked (one HEAD). When that file is not visible
  yet, the claim is *pending*: not shown, not fixed (the publisher, or the next writer reading the
  head, completes or voids it), and read again next pass. A reader never writes.
- *Incremental.* Each chain remembers the last claim it consumed; a pass reads the floor (one GET),
  lists the claims after that seq (ListObjectsV2 ``StartAfter``; the local store the same) and
  reads only those (one GET each), so a pass costs O(chains + new claims), not O(claims).
  Claims archived since the last pass (the floor moved past it: compaction overtook this reader)
  come from the archive objects, of which only those above the last seq are read.

- *Every link checked.* Each claim read is checked against the one before it (or the floor) by
  ``claim_chain.link_problem``: no hole in the numbering above the floor, the claim's own ``seq``, its
  ``prev`` state, its range after the previous end (or in another incarnation: a new log or a
  replay). A broken link raises ``ChainBroken`` naming the object, and the view does not move: nothing
  is read past it (a reader that skipped a deleted claim used to lose its file silently).

The files are the manifest's (``LandingStore.manifest``) minus a pending head, in the same order, so
counts taken here are the same stable positions the s3 source's offsets and the lifecycle's records
use. Not thread-safe: one reader per thread (the Spark driver and the cleaner each own one).

- *Side by side.* A pass reads CHAINS_AT_ONCE chains at once, and each chain's claims up to
  CLAIMS_AHEAD ahead (read_ahead.py), since a request at a time costs a round trip each: 2,000 claims
  were ~5 s on SeaweedFS on 127.0.0.1 and would be minutes on a remote store. The links are still
  checked in chain order, and a pass returns (or raises) only once every chain's reading stopped.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from mqd.landing.claim_chain import (
    CLAIM_GETS,
    ChainState,
    Claim,
    PartitionChain,
    archive_prefix,
    log_partitions,
)
from mqd.landing.errors import ChainBroken, LandingCorrupt, ObjectStoreError
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects
from mqd.landing.read_ahead import SharedPool, read_ahead
from mqd.topic_name import check_topic_name

log = structlog.get_logger("mqd.landing")

_ATTEMPTS = 8  # bounded retries of a pass that met compaction between its floor read and listing
# requests in flight: chains read side by side, each with its claims read ahead (claim_chain
# CLAIMS_AHEAD) on one pool of GETs; together within an S3 client's 16 connections (s3_objects.py)
CHAINS_AT_ONCE = 4
CHAIN_READS = SharedPool(CHAINS_AT_ONCE, "mqd-chain-read")
_ARCHIVE = re.compile(r"^(\d{20})-(\d{20})\.jsonl$")


@dataclass(slots=True)
class ChainView:
    """What a reader knows of one chain: its visible files in chain order, and where it stopped."""

    topic: str
    partition: int
    files: list[FileRange] = field(default_factory=list)
    seq: int = -1  # the last claim consumed (its file shown, or known void/voided)
    floor: int = -1  # the floor seen at the last pass
    top: int = -1  # the highest claim listed at the last pass (pending or not)
    pending: FileRange | None = None  # the newest claim's range while its file is not visible
    state: ChainState = field(default_factory=ChainState)  # the chain's state after ``seq``
    claim: Claim | None = None  # the claim at ``seq`` (None: at the floor, or not read)

    @property
    def claims_above_floor(self) -> int:
        """Claims kept above the floor at the last pass (what compaction would shrink)."""
        return max(self.top - self.floor, 0)


class ChainReader:
    """The visible files of every chain under ``objects``, read without writing (module docstring)."""

    def __init__(self, objects: Objects) -> None:
        self.objects = objects
        self._views: dict[tuple[str, int], ChainView] = {}

    # -- discovery --------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        out = []
        for d in self.objects.list_dirs("_log/"):
            name = d.rstrip("/").rsplit("/", 1)[-1]
            try:
                out.append(check_topic_name(name))
            except ValueError:
                log.warning("landing: a folder under _log/ is not a topic; not read", folder=d)
        return sorted(out)

    def partitions(self, topic: str) -> list[int]:
        return log_partitions(self.objects, topic)

    # -- reading ----------------------------------------------------------------------------------

    def refresh(self, topic: str | None = None) -> dict[tuple[str, int], ChainView]:
        """Bring every chain (of ``topic``) up to date; the views by (topic, partition). The first
        broken chain (in chain order) raises its ChainBroken once the pass is over."""
        keys = [
            (t, p)
            for t in ([check_topic_name(topic)] if topic is not None else self.topics())
            for p in self.partitions(t)
        ]
        out: dict[tuple[str, int], ChainView] = {}
        for key, got in self.refresh_chains(keys):
            if isinstance(got, ChainBroken):
                raise got
            out[key] = got
        return out

    def refresh_chains(
        self, keys: Sequence[tuple[str, int]]
    ) -> list[tuple[tuple[str, int], ChainView | ChainBroken]]:
        """Bring the chains ``keys`` up to date, CHAINS_AT_ONCE side by side: each one's view, or
        its ChainBroken (its view stays where it was). Any other error raises once no chain's
        reading is under way any more: a worker still moving a view would race the next pass."""
        for t, p in keys:
            self._view(t, p)  # made here: the workers only touch their own view

        def one(key: tuple[str, int]) -> ChainView | ChainBroken:
            try:
                return self.refresh_chain(*key)
            except ChainBroken as exc:
                return exc

        got = read_ahead(keys, one, CHAIN_READS.get(), window=CHAINS_AT_ONCE, settle=True)
        with contextlib.closing(got):
            return list(got)

    def files(self, topic: str | None = None) -> dict[tuple[str, int], list[FileRange]]:
        """Every chain's visible files in chain order, after a pass (``refresh``)."""
        return {k: v.files for k, v in self.refresh(topic).items()}

    def _view(self, topic: str, partition: int) -> ChainView:
        view = self._views.get((topic, partition))
        if view is None:
            view = self._views[(topic, partition)] = ChainView(topic, partition)
        return view

    def refresh_chain(self, topic: str, partition: int) -> ChainView:
        view = self._view(topic, partition)
        chain = PartitionChain(self.objects, topic, partition)  # only its read methods are used
        for _ in range(_ATTEMPTS):
            floor, _etag = chain.floor()
            archived: list[FileRange] = []
            base, base_state, base_claim = view.seq, view.state, view.claim
            if floor.seq > view.seq:
                # compaction archived claims this reader had not consumed: their live ranges
                archived = self._archived(topic, partition, view.seq, floor.seq)
                base, base_state, base_claim = floor.seq, floor.state, None
            claims = chain.linked_after(base, base_state, base_claim, floor.seq, CLAIM_GETS.get())
            if claims is None:
                continue  # compaction ran between our floor read and the listing
            self._consume(view, chain, floor.seq, base, base_state, base_claim, archived, claims)
            return view
        raise ObjectStoreError(f"{chain.base}: the chain kept moving under the reader")

    def _consume(
        self,
        view: ChainView,
        chain: PartitionChain,
        floor: int,
        base: int,
        base_state: ChainState,
        base_claim: Claim | None,
        archived: list[FileRange],
        claims: list[Claim],
    ) -> None:
        view.files.extend(archived)
        view.seq, view.floor, view.pending = base, floor, None
        view.state, view.claim = base_state, base_claim
        view.top = max(view.top, base, claims[-1].seq if claims else base)
        for i, c in enumerate(claims):
            if c.range is None:  # a void record: the claim before it is not in the manifest
                view.seq, view.state, view.claim = c.seq, c.state, c
                continue
            if i + 1 < len(claims):
                if claims[i + 1].voids != c.seq:
                    view.files.append(c.range)
                view.seq, view.state, view.claim = c.seq, c.state, c
                continue
            # the newest claim: shown once its file is visible; a reader never promotes or voids
            if self.objects.head(c.range.path) is None:
                view.pending = c.range
                log.debug("landing chain head not visible yet", chain=chain.base, seq=c.seq)
                return
            view.files.append(c.range)
            view.seq, view.state, view.claim = c.seq, c.state, c

    def _archived(self, topic: str, partition: int, after: int, upto: int) -> list[FileRange]:
        """The live ranges archived with seq in (``after``, ``upto``], in seq order."""
        by_seq: dict[int, FileRange] = {}
        for info in self.objects.list_objects(archive_prefix(topic, partition)):
            m = _ARCHIVE.match(info.key.rsplit("/", 1)[-1])
            if m is not None and int(m.group(2)) <= after:
                continue  # wholly consumed already
            got = self.objects.get(info.key)
            for raw in (got[0] if got else b"").splitlines():
                try:
                    d = json.loads(raw)
                    seq, rng = int(d["seq"]), FileRange.from_json(d["range"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise LandingCorrupt(f"{self.objects.location}/{info.key}: unreadable ({exc})") from None
                if after < seq <= upto:
                    by_seq[seq] = rng
        return [by_seq[s] for s in sorted(by_seq)]
