"""The claim chain: exactly-once publication on object primitives (objects.py), no lock, no clock.

One chain per (topic, partition), under ``_log/<topic>/<partition:05d>/``::

    claims/<seq:020d>.json   one small single-part object per publication, created only if absent
    floor.json               the retention floor: claims at or below it were archived and deleted

A claim is the commit point and the manifest line. It holds a nonce, the file range, where the
staged bytes are, and the partition's state before and after it (last offset, incarnation, files,
watermark), so the head's state is one object. Claim ``k + 1`` is only ever written by someone who
saw claim ``k`` resolved (its file visible) and the head's last offset equal to what they expect,
which makes the chain linear: the create-only condition on one key per slot picks one winner.

Publishing a staged object (``commit``):

1. head check: read the floor and the highest claim, resolve it (below), and require its last
   offset to be the caller's ``expected_last`` and the new range to start after it;
   PublishConflict otherwise. A publisher with a stale belief cannot fork the chain this way: its
   expected end is not the head's. The file's visible name must be free too (a taken name is a
   race lost since the head read, or, for names without an incarnation, reused offsets).
2. claim: create ``claims/<head + 1>`` with ``If-None-Match: *``. On 412 or on a lost response,
   read the key back: our nonce means we won (our first attempt landed), another means we lost.
3. floor check: a claim at or below the floor landed on a key that retention had deleted (a
   publisher that slept through compaction): it is not in the chain; delete it, PublishConflict.
4. link check: the claim before ours, read again, is still what step 1 read; ChainBroken otherwise
   (ours stays unpromoted: a claim broken while ours was being written, decision 076).
5. promote: server-side copy of the staged object to the file's visible name, then delete the
   staged object. A crash anywhere after 2 is completed by whoever resolves the head next.

Resolving the head claim (every reader of the head does it): its visible file exists -> done;
else copy the staged object to it -> done; else, when the staged object is gone or condemned by the
janitor, and the visible file is still missing, the claim is *voided*: a void record becomes claim
``k + 1`` with the state before ``k``, so the head goes back and the range is fetched again from
the source. Never skipped: the void is logged and counted.

The janitor (``reap``) may delete a staged object older than some age. It first creates a
``.reap`` marker ``pending`` next to it, then reads the head claim: if the head claim uses the
object, the marker becomes ``keep``; otherwise it becomes ``delete`` (both by ``If-Match`` on the
marker) and the object is deleted. Anyone about to copy a staged object first reads its marker and
turns ``pending`` into ``keep``; ``delete`` means do not copy. So no copy is ever in flight while
its source is deleted, and a void never meets a late copy: the age decides cost, never correctness.

Every reader checks the links it reads (``link_problem``): claims numbered without a hole above the
floor, each claim's own ``seq`` that of its key, its ``prev`` the state after the claim before (the
floor's for the first), its state what its range makes of it, and its range after the previous end
in the same incarnation or anywhere in another known one (the commit condition ``follows``: a new
log incarnation or a deliberate replay id restarts offsets; a gap inside one incarnation is a
source's own, e.g. a forward reset or Kafka's compaction). A publisher re-reads the head claim it
last saw before each commit, so it never writes past a claim deleted or overwritten since (it used
to trust its cached copy), and once more after its claim landed and before promoting it, so a claim
broken while the next one was being written is found too (decision 076). A broken link raises
``ChainBroken`` naming the object: nothing of the partition is read or published past it.
``check_chain`` lists every broken link (``mqd landing check``).

``unsafe_skip`` (tests only) removes one step of the protocol, so the race test can show that each
step is needed: ``head_check``, ``claim_condition`` (claims overwrite), ``readback`` (a lost
response to the claim counts as a win, a 412 as a loss).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import structlog

from mqd.landing import layout, watermark
from mqd.landing.errors import (
    ChainBroken,
    LandingCorrupt,
    ObjectStoreError,
    PreconditionFailed,
    PublishConflict,
)
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects
from mqd.landing.read_ahead import SharedPool, read_ahead
from mqd.topic_name import check_topic_name

log = structlog.get_logger("mqd.landing")

CLAIM_VERSION = 1
UNSAFE_STEPS = frozenset({"head_check", "claim_condition", "readback"})
_ATTEMPTS = 8  # bounded retries of a read-modify cycle that lost a race (each loss means progress)
_SEQ = re.compile(r"^(\d{20})\.json$")
CLAIMS_AHEAD = 8  # a reader's claim GETs in flight per chain (linked_after, check_chain)
CLAIM_GETS = SharedPool(CLAIMS_AHEAD, "mqd-claim-get")  # the readers' claim GETs, every chain's
REAP_SUFFIX = ".reap"


@dataclass(frozen=True, slots=True)
class ChainState:
    """A partition's landed state after some claim (or at the floor)."""

    last_offset: int | None = None
    incarnation: str | None = None
    files: int = 0
    watermark_ms: int | None = None
    leader_epoch: int | None = None  # the last file's FileRange.leader_epoch (None: none, or older)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "last_offset": self.last_offset,
            "incarnation": self.incarnation,
            "files": self.files,
            "watermark_ms": self.watermark_ms,
        }
        if self.leader_epoch is not None:  # written only where the source has epochs
            d["leader_epoch"] = self.leader_epoch
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChainState:
        return cls(
            last_offset=None if d.get("last_offset") is None else int(d["last_offset"]),
            incarnation=layout.check_incarnation(d.get("incarnation")),
            files=int(d.get("files", 0)),
            watermark_ms=None if d.get("watermark_ms") is None else int(d["watermark_ms"]),
            leader_epoch=None if d.get("leader_epoch") is None else int(d["leader_epoch"]),
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """One slot of the chain: a file (``range`` set) or a void record of the claim before it."""

    seq: int
    nonce: str
    prev: ChainState  # the head this claim was written on
    state: ChainState  # the head after it
    range: FileRange | None = None
    staged: str | None = None  # key of the staged object (file claims)
    voids: int | None = None  # the claim this record voids
    created: str = ""

    def to_bytes(self) -> bytes:
        d = {
            "version": CLAIM_VERSION,
            "seq": self.seq,
            "nonce": self.nonce,
            "prev": self.prev.to_json(),
            "state": self.state.to_json(),
            "range": self.range.to_json() if self.range else None,
            "staged": self.staged,
            "voids": self.voids,
            "created": self.created,
        }
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Claim:
        try:
            d = json.loads(data)
            if d.get("version") != CLAIM_VERSION:
                raise ValueError(f"unknown claim version {d.get('version')!r}")
            return cls(
                seq=int(d["seq"]),
                nonce=str(d["nonce"]),
                prev=ChainState.from_json(d["prev"]),
                state=ChainState.from_json(d["state"]),
                range=FileRange.from_json(d["range"]) if d.get("range") else None,
                staged=None if d.get("staged") is None else str(d["staged"]),
                voids=None if d.get("voids") is None else int(d["voids"]),
                created=str(d.get("created", "")),
            )
        except (ValueError, KeyError, TypeError, LandingCorrupt) as exc:
            raise LandingCorrupt(f"{where}: unreadable claim ({exc})") from None


@dataclass(frozen=True, slots=True)
class Floor:
    seq: int = -1  # claims <= seq are archived (and may be deleted)
    state: ChainState = field(default_factory=ChainState)

    def to_bytes(self) -> bytes:
        return json.dumps({"version": CLAIM_VERSION, "seq": self.seq, "state": self.state.to_json()}).encode()


def chain_prefix(topic: str, partition: int) -> str:
    return f"_log/{check_topic_name(topic)}/{partition:05d}/"


def claim_key(chain: str, seq: int) -> str:
    """Claim ``seq``'s key in the chain at prefix ``chain`` (``chain_prefix``)."""
    return f"{chain}claims/{seq:020d}.json"


def staging_prefix(topic: str, partition: int) -> str:
    return f"_staging/{check_topic_name(topic)}/{partition:05d}/"


def log_partitions(objects: Objects, topic: str) -> list[int]:
    """The partitions of ``topic`` that have a chain folder under ``_log/``, in order (a folder
    whose name is not a partition number is not one)."""
    out: list[int] = []
    for d in objects.list_dirs(f"_log/{check_topic_name(topic)}/"):
        try:
            out.append(int(d.rstrip("/").rsplit("/", 1)[1]))
        except ValueError:
            continue
    return sorted(out)


def archive_prefix(topic: str, partition: int) -> str:
    return f"{layout.topic_manifest_dir(topic)}/{partition:05d}/"


class PartitionChain:
    """The chain of one partition. Holds only hints (the last seq seen, the claims known to be
    resolved); every decision is made on what the store answers. Thread-compatible."""

    def __init__(
        self,
        objects: Objects,
        topic: str,
        partition: int,
        *,
        unsafe_skip: Iterable[str] = (),
        on_void: Callable[[Claim], None] | None = None,
        max_event_ahead_ms: int = watermark.DEFAULT_MAX_EVENT_AHEAD_MS,
    ) -> None:
        self.objects = objects
        self.topic = topic
        self.partition = partition
        self.base = chain_prefix(topic, partition)
        self.unsafe_skip = frozenset(unsafe_skip)
        if not self.unsafe_skip <= UNSAFE_STEPS:
            raise ValueError(f"unknown protocol steps {sorted(self.unsafe_skip - UNSAFE_STEPS)}")
        self.on_void = on_void
        self.max_event_ahead_ms = max_event_ahead_ms  # the watermark's trust in event times
        self._hint = -1  # a seq known to exist (above the floor when it was read)
        self._hint_claim: Claim | None = None  # the claim at the hint
        self._resolved: set[int] = set()  # claims whose visible file is known to exist

    # -- reading ----------------------------------------------------------------------------------

    def claim_key(self, seq: int) -> str:
        return claim_key(self.base, seq)

    def claims_ahead(
        self, seqs: list[int], pool: Executor | None
    ) -> Generator[tuple[int, tuple[bytes, str] | None], None, None]:
        """Each claim slot of ``seqs`` with what a GET of its key returned, in order, up to
        CLAIMS_AHEAD read ahead on ``pool`` (None: one at a time); parsed by ``_claim_from``."""
        return read_ahead(seqs, lambda s: self.objects.get(self.claim_key(s)), pool, window=CLAIMS_AHEAD)

    def read_claim(self, seq: int) -> Claim | None:
        """Claim ``seq`` (None: no such key, or one compaction has since put below the floor);
        ChainBroken when the object is not that claim."""
        return self._claim_from(seq, self.objects.get(self.claim_key(seq)))

    def _claim_from(self, seq: int, got: tuple[bytes, str] | None) -> Claim | None:
        """``read_claim`` of what a GET of claim ``seq``'s key returned."""
        key = self.claim_key(seq)
        if got is None:
            return None
        try:
            claim = Claim.from_bytes(got[0], key)
        except LandingCorrupt as exc:
            if self._compacted(seq):
                return None
            raise self.broken(key, str(exc).removeprefix(f"{key}: ")) from None
        if claim.seq != seq:
            if self._compacted(seq):
                return None
            raise self.broken(key, f"the claim says it is claim {claim.seq} (a copy of another claim?)")
        return claim

    def _compacted(self, seq: int) -> bool:
        """Whether slot ``seq`` is at or below the floor now: what it holds is no claim of the
        chain any more (a stale publisher may re-create a deleted key there, then delete it), so a
        problem with it is compaction's doing, not a break."""
        return self.floor()[0].seq >= seq

    def broken(self, key: str, problem: str) -> ChainBroken:
        return ChainBroken(self.objects.location, key, problem)

    def _linked(self, seq: int, claim: Claim, before_state: ChainState, before: Claim | None) -> bool:
        """Whether ``claim`` links to the slot before it; False when compaction moved the floor past
        it meanwhile (read again); ChainBroken otherwise."""
        problem = link_problem(self.topic, self.partition, seq, claim, before_state, before)
        if problem is None:
            return True
        if self._compacted(seq):
            return False
        raise self.broken(self.claim_key(seq), problem)

    def _gap(self, missing: int, floor_seq: int) -> bool:
        """Whether claim ``missing`` (not found) is a hole in the chain rather than compaction's
        doing: compaction writes the floor before it deletes, so a claim missing above a floor read
        afterwards was deleted by someone else."""
        return missing > self.floor()[0].seq and missing > floor_seq

    def floor(self) -> tuple[Floor, str | None]:
        """The floor and its etag (None: no floor written yet)."""
        key = f"{self.base}floor.json"
        got = self.objects.get(key)
        if got is None:
            return Floor(), None
        try:
            d = json.loads(got[0])
            return Floor(int(d["seq"]), ChainState.from_json(d["state"])), got[1]
        except (ValueError, KeyError, TypeError) as exc:
            raise LandingCorrupt(f"{key}: unreadable floor ({exc})") from None

    def _listed_seqs(self, after: int) -> list[int]:
        out: list[int] = []
        for info in self.objects.list_objects(f"{self.base}claims/", start_after=self.claim_key(after)):
            m = _SEQ.match(info.key.rsplit("/", 1)[-1])
            if m:
                out.append(int(m.group(1)))
        return out

    def latest(self) -> tuple[Floor, Claim | None]:
        """The floor and the highest claim above it (None: nothing above the floor), unresolved.
        ChainBroken when a link up to it does not hold: the claim last seen here is re-read (one
        GET), so a head deleted or overwritten since is found before anything is written after it."""
        for _ in range(_ATTEMPTS):
            floor, _etag = self.floor()
            claim: Claim | None
            cached = self._hint_claim  # one read: the janitor's thread may move the hint meanwhile
            if cached is not None and cached.seq > floor.seq:
                seq, claim = cached.seq, self.read_claim(cached.seq)
                if claim is None:
                    if self._gap(seq, floor.seq):
                        why = "the claim this publisher last saw as the head is gone (deleted?)"
                        raise self.broken(self.claim_key(seq), why)
                    self._hint, self._hint_claim = (
                        -1,
                        None,
                    )  # compaction moved the floor past the hint meanwhile: read again
                    continue
                if claim != cached:
                    if not self._compacted(seq):
                        why = "the claim changed since it was read (overwritten?)"
                        raise self.broken(self.claim_key(seq), why)
                    self._hint, self._hint_claim = -1, None
                    continue
            else:
                listed = self._listed_seqs(floor.seq)
                hole = next((floor.seq + 1 + i for i, s in enumerate(listed) if s != floor.seq + 1 + i), None)
                if hole is not None:
                    if self._gap(hole, floor.seq):
                        raise self.broken(self.claim_key(hole), f"missing, but claim {listed[-1]} exists")
                    continue  # compaction ran between our floor read and the listing
                seq = listed[-1] if listed else floor.seq
                claim = self.read_claim(seq) if seq > floor.seq else None
                if seq > floor.seq and claim is None:
                    continue  # deleted by compaction meanwhile
                if claim is not None:  # a first read: its link to the claim (or floor) before it
                    before = self.read_claim(seq - 1) if seq - 1 > floor.seq else None
                    if before is None and seq - 1 > floor.seq:
                        if self._gap(seq - 1, floor.seq):
                            raise self.broken(self.claim_key(seq - 1), f"missing, but claim {seq} exists")
                        continue
                    if not self._linked(seq, claim, floor.state if before is None else before.state, before):
                        continue
            whole = True
            while True:  # the chain has no holes above the floor: walk to its end
                nxt = self.read_claim(seq + 1)
                if nxt is None:
                    break
                whole = self._linked(seq + 1, nxt, floor.state if claim is None else claim.state, claim)
                if not whole:
                    break
                seq, claim = seq + 1, nxt
            if not whole:
                self._hint, self._hint_claim = -1, None
                continue
            self._hint, self._hint_claim = seq, claim
            return floor, claim
        raise ObjectStoreError(f"{self.base}: the chain kept moving under the reader")

    def head(self) -> tuple[int, ChainState]:
        """(seq, state) of the resolved head: its file is visible, or it was voided and the head
        went back (the void record is the head then)."""
        seq, st, _claim = self._head()
        return seq, st

    def _head(self) -> tuple[int, ChainState, Claim | None]:
        """``head`` and the claim at it (None: the floor is the head)."""
        for _ in range(_ATTEMPTS):
            floor, claim = self.latest()
            if claim is None:
                return floor.seq, floor.state, None
            if claim.range is None or self.resolve(claim):
                return claim.seq, claim.state, claim
        raise ObjectStoreError(f"{self.base}: the head kept moving under the reader")

    # -- resolving a claim ------------------------------------------------------------------------

    def resolve(self, claim: Claim) -> bool:
        """Make a file claim's file visible; False when it had to be voided (a void record now
        follows it). Idempotent; any process may run it."""
        assert claim.range is not None and claim.staged is not None
        if claim.seq in self._resolved:
            return True
        final = claim.range.path
        if self.objects.head(final) is not None or self._copy_staged(claim.staged, final):
            self._done(claim)
            return True
        # the staged bytes are gone (or condemned, so no copy of them can be in flight): unless
        # the file became visible meanwhile, nobody can ever promote this claim
        if self.objects.head(final) is not None:
            self._done(claim)
            return True
        self._void(claim)
        return False

    def _done(self, claim: Claim) -> None:
        self._resolved.add(claim.seq)
        if len(self._resolved) > 64:
            # list() copies under the GIL: a reader thread may add to the set meanwhile
            self._resolved = {s for s in list(self._resolved) if s >= claim.seq - 8}
        if claim.staged is not None:
            self.objects.delete(claim.staged)  # a reap marker left beside it goes with the janitor

    def _copy_staged(self, staged: str, final: str) -> bool:
        """Copy unless the janitor condemned the staged object; False when it is gone or condemned."""
        marker = staged + REAP_SUFFIX
        for _ in range(_ATTEMPTS):
            got = self.objects.get(marker)
            if got is None:
                break
            state = _reap_state(got[0])
            if state == "delete":
                return False
            if state == "keep":
                break
            try:  # pending: the janitor must not delete what a claim is about to copy
                self.objects.put(marker, _reap_body("keep"), if_match=got[1])
                break
            except PreconditionFailed:
                continue  # the janitor decided first: read its decision
        else:
            raise ObjectStoreError(f"{marker}: reap marker kept changing")
        return self.objects.copy(staged, final)

    def _void(self, claim: Claim) -> None:
        void = Claim(
            seq=claim.seq + 1,
            nonce=secrets.token_hex(8),
            prev=claim.state,
            state=claim.prev,
            voids=claim.seq,
            created=layout.iso_now(),
        )
        try:
            self.objects.put(self.claim_key(void.seq), void.to_bytes(), if_absent=True)
        except PreconditionFailed:
            return  # another resolver voided it first (nobody else may write this slot)
        assert claim.range is not None
        log.warning(
            "landing claim voided: its staged file is gone; the range will be fetched again",
            topic=self.topic,
            partition=self.partition,
            seq=claim.seq,
            first_offset=claim.range.first_offset,
            last_offset=claim.range.last_offset,
            staged=claim.staged,
        )
        if self.on_void is not None:
            self.on_void(claim)

    # -- publishing -------------------------------------------------------------------------------

    def commit(
        self,
        rng: FileRange,
        staged: str,
        expected_last: int | None,
        *,
        incarnation: str | None = None,
        expected_incarnation: str | None = None,
    ) -> FileRange:
        """Publish the staged object ``staged`` as ``rng`` (of log ``incarnation``) if the head is
        (``expected_incarnation``, ``expected_last``); see the module docstring."""
        seq, st, before = self._head()
        if "head_check" not in self.unsafe_skip:
            self._check_head(rng, incarnation, st, expected_last, expected_incarnation)
        wm = watermark.watermark_after(st.watermark_ms, rng, self.max_event_ahead_ms)
        claim = Claim(
            seq=seq + 1,
            nonce=secrets.token_hex(16),
            prev=st,
            state=ChainState(rng.last_offset, incarnation, st.files + 1, wm, rng.leader_epoch),
            range=rng,
            staged=staged,
            created=layout.iso_now(),
        )
        if not self._put_claim(claim):
            _seq, now = self.head()
            raise self._conflict(expected_last, now)
        floor, _etag = self.floor()
        if floor.seq >= claim.seq:
            # our key had been archived and deleted: what we wrote is outside the chain
            self.objects.delete(self.claim_key(claim.seq))
            raise self._conflict(expected_last, self.head()[1])
        if before is not None:
            self._check_unchanged(before)
        if claim.seq > self._hint:
            self._hint, self._hint_claim = claim.seq, claim
        if not self.resolve(claim):
            raise self._conflict(expected_last, claim.prev)
        return rng

    def _check_unchanged(self, before: Claim) -> None:
        """Claim ``before``, which our new claim links to, read again once ours is in its slot:
        broken between our head read and our claim's creation, it would stay behind every later
        head read of ours (each re-reads only the newest claim), so we would write past the break
        (decision 076). ChainBroken then, and our claim is never promoted: its file stays staged,
        for whoever resolves the head once the chain is repaired."""
        now = self.read_claim(before.seq)  # ChainBroken when it is no claim, or another slot's
        if now == before or self._compacted(before.seq):
            return
        why = "gone" if now is None else "changed"
        raise self.broken(
            self.claim_key(before.seq), f"the claim was {why} while the claim after it was being written"
        )

    def _check_head(
        self,
        rng: FileRange,
        incarnation: str | None,
        st: ChainState,
        expected_last: int | None,
        expected_incarnation: str | None,
    ) -> None:
        """The publisher's belief must be the chain's end, the range must follow it, and the
        file's name must be free."""
        if not follows(st, rng.first_offset, incarnation, expected_last, expected_incarnation):
            raise self._conflict(expected_last, st)
        if self.objects.head(rng.path) is not None:
            _seq, now = self.head()
            if now.last_offset != st.last_offset:  # another owner landed it since our head read
                raise self._conflict(expected_last, now)
            # a claim of the chain deleted (its file stays), offsets reused by a new incarnation
            # under names without one (format 1), or a file not ours: never published twice
            raise self.broken(
                rng.path, "a file already has this name, but the chain's head is before it (a claim deleted?)"
            )

    def _conflict(self, expected_last: int | None, landed: ChainState) -> PublishConflict:
        """The answer to a publisher that must resume after the landed head."""
        return PublishConflict(
            self.topic, self.partition, expected_last, landed.last_offset, incarnation=landed.incarnation
        )

    def _put_claim(self, claim: Claim) -> bool:
        """Create the claim; True when ours is the one in the slot."""
        key = self.claim_key(claim.seq)
        try:
            self.objects.put(key, claim.to_bytes(), if_absent="claim_condition" not in self.unsafe_skip)
            return True
        except PreconditionFailed:
            if "readback" in self.unsafe_skip:
                return False
        except ObjectStoreError:
            if "readback" in self.unsafe_skip:
                return True
            got = self.objects.get(key)
            if got is None:
                raise  # it did not land (yet): the caller retries; a late landing is resolved by anyone
            return Claim.from_bytes(got[0], key).nonce == claim.nonce
        got = self.objects.get(key)  # 412: our own earlier attempt, or another owner's claim
        if got is None:
            return False  # deleted by compaction meanwhile: the slot is below the floor, not ours
        return Claim.from_bytes(got[0], key).nonce == claim.nonce

    # -- manifest and retention -------------------------------------------------------------------

    def claims_above(self, after: int) -> list[Claim]:
        out: list[Claim] = []
        for seq in self._listed_seqs(after):
            c = self.read_claim(seq)
            if c is not None:
                out.append(c)
        return out

    def manifest(self) -> list[FileRange]:
        """Every published file of the partition in chain order: archives up to the floor, then
        the claims above it, without void records and the claims they void."""
        self.head()  # resolve a half-done publication first
        for _ in range(_ATTEMPTS):
            floor, _etag = self.floor()
            by_seq: dict[int, FileRange] = {}
            for info in self.objects.list_objects(archive_prefix(self.topic, self.partition)):
                got = self.objects.get(info.key)
                for raw in (got[0] if got else b"").splitlines():
                    d = json.loads(raw)
                    if int(d["seq"]) <= floor.seq:
                        by_seq[int(d["seq"])] = FileRange.from_json(d["range"])
            claims = self.linked_after(floor.seq, floor.state, None, floor.seq)
            if claims is None:
                continue  # compaction ran between our floor read and the listing
            by_seq.update(_live_ranges(claims))
            return [by_seq[s] for s in sorted(by_seq)]
        raise ObjectStoreError(f"{self.base}: the chain kept moving under the reader")

    def linked_after(
        self,
        base: int,
        base_state: ChainState,
        base_claim: Claim | None,
        floor_seq: int,
        pool: Executor | None = None,
    ) -> list[Claim] | None:
        """The claims after slot ``base`` (whose state is ``base_state``; ``base_claim`` when it is
        a claim, not the floor), each checked as a link of the chain; None when compaction moved
        the floor past them meanwhile (read again); ChainBroken at the first broken link. With a
        ``pool``, up to CLAIMS_AHEAD claims are read ahead on it; the links are checked in order."""
        out: list[Claim] = []
        before_state, before = base_state, base_claim
        get = self.claims_ahead(self._listed_seqs(base), pool)
        with contextlib.closing(get):
            for i, (seq, got) in enumerate(get):
                want = base + 1 + i
                if seq != want:
                    if self._gap(want, floor_seq):
                        raise self.broken(self.claim_key(want), f"missing, but claim {seq} exists")
                    return None
                claim = self._claim_from(seq, got)
                if claim is None:
                    if self._gap(seq, floor_seq):
                        raise self.broken(self.claim_key(seq), "listed, then gone (deleted?)")
                    return None
                if not self._linked(seq, claim, before_state, before):
                    return None
                out.append(claim)
                before_state, before = claim.state, claim
        return out

    def compact(self, keep: int) -> int:
        """Archive and delete all but the newest ``keep`` claims (>= 1); returns how many went.
        The floor is written before any claim is deleted, so a stale publisher that re-creates a
        deleted key finds its claim below the floor (commit step 3)."""
        keep = max(keep, 1)
        floor, etag = self.floor()
        for seq in self._listed_seqs(-1):  # left by a compactor that died after its floor
            if seq > floor.seq:
                break
            self.objects.delete(self.claim_key(seq))
        head_seq, _st = self.head()
        new_floor = head_seq - keep
        if new_floor <= floor.seq:
            return 0
        claims = [c for c in self.claims_above(floor.seq) if c.seq <= new_floor + 1]
        if [c.seq for c in claims] != list(range(floor.seq + 1, new_floor + 2)):
            return 0  # another compactor is at work: leave it to it
        live = _live_ranges(claims)  # the claim above the floor decides whether the top one is void
        lines = b"".join(
            json.dumps({"seq": s, "range": r.to_json()}, separators=(",", ":")).encode() + b"\n"
            for s, r in sorted(live.items())
            if s <= new_floor
        )
        archive = f"{archive_prefix(self.topic, self.partition)}{floor.seq + 1:020d}-{new_floor:020d}.jsonl"
        self.objects.put(archive, lines)
        new = Floor(new_floor, claims[new_floor - floor.seq - 1].state)
        try:
            if etag is None:
                self.objects.put(f"{self.base}floor.json", new.to_bytes(), if_absent=True)
            else:
                self.objects.put(f"{self.base}floor.json", new.to_bytes(), if_match=etag)
        except PreconditionFailed:
            return 0
        for c in claims:
            if c.seq <= new_floor:
                self.objects.delete(self.claim_key(c.seq))
        return new_floor - floor.seq


def follows(
    st: ChainState,
    first_offset: int,
    incarnation: str | None,
    expected_last: int | None,
    expected_incarnation: str | None,
) -> bool:
    """The commit condition (the local store's, with one difference): the head is the one the
    publisher expects, and the range follows it, after it in the same incarnation or anywhere in
    another known one (a new log reuses offsets; its records are new). An unknown landed
    incarnation assumes no reuse. The difference: an empty head accepts only a publisher that
    expects it empty, since a void can take the head back to empty under a publisher's feet."""
    if st.last_offset is None:
        return expected_last is None
    if st.last_offset != expected_last or st.incarnation != expected_incarnation:
        return False
    if first_offset > st.last_offset:
        return True
    return st.incarnation is not None and incarnation is not None and incarnation != st.incarnation


def link_problem(
    topic: str,
    partition: int,
    key_seq: int,
    claim: Claim,
    before_state: ChainState,
    before: Claim | None = None,
) -> str | None:
    """Why ``claim``, read from the key of slot ``key_seq``, is not a link of the chain (None: it
    is). ``before_state``: the state after slot ``key_seq - 1`` (the floor's when that is the
    floor); ``before``: that claim, when read (a void is then checked against what it voids).

    Offsets are checked by the commit condition (``follows``), not for density: a range starts
    after the previous end in the same incarnation, or anywhere in another known incarnation (a new
    log, or the replay id of ``mqd offsets reset``: both restart offsets); within one incarnation a
    source may skip offsets (a forward reset, Kafka's compaction), so only going back is a break."""
    if claim.seq != key_seq:
        return f"the claim says it is claim {claim.seq} (a copy of another claim?)"
    if claim.prev != before_state:
        return (
            f"it starts from {_state_text(claim.prev)}, but the chain before it ends at "
            f"{_state_text(before_state)} (a claim before it deleted or overwritten?)"
        )
    if claim.range is None:
        if claim.voids != key_seq - 1:
            return f"a void record of claim {claim.voids}, not of the claim before it ({key_seq - 1})"
        if before is not None and (before.range is None or claim.state != before.prev):
            return "a void record that does not take the head back to where the voided claim started"
        return None
    rng = claim.range
    if claim.voids is not None:
        return "both a file and a void record"
    if (rng.topic, rng.partition) != (topic, partition):
        return f"it names a file of {rng.topic}/{rng.partition}"
    if rng.first_offset > rng.last_offset:
        return f"its range {rng.first_offset}..{rng.last_offset} is empty"
    st = claim.state
    if (st.last_offset, st.incarnation, st.files) != (rng.last_offset, rng.incarnation, claim.prev.files + 1):
        return f"its state {_state_text(st)} is not what its file {rng.path} makes of the chain"
    prev = claim.prev
    if prev.last_offset is not None and rng.first_offset <= prev.last_offset:
        known = prev.incarnation is not None and rng.incarnation is not None
        if not known or rng.incarnation == prev.incarnation:
            return (
                f"its file {rng.path} starts at offset {rng.first_offset}, at or before the previous "
                f"end {prev.last_offset} of the same log incarnation"
            )
    return None


def _state_text(st: ChainState) -> str:
    inc = "unknown incarnation" if st.incarnation is None else f"incarnation {st.incarnation[:8]}"
    last = "nothing landed" if st.last_offset is None else f"offset {st.last_offset}"
    return f"{last} ({inc}, {st.files} files)"


@dataclass(frozen=True, slots=True)
class BrokenLink:
    """One broken link found by ``check_chain``: the object (relative to the landing root) and why."""

    key: str
    problem: str


def check_chain(objects: Objects, topic: str, partition: int) -> tuple[list[BrokenLink], list[FileRange]]:
    """Every broken link of one chain above its floor (unlike a reader, which stops at the first),
    and the ranges its claims name (a voided claim's too). Read-only."""
    chain = PartitionChain(objects, topic, partition)
    for _ in range(_ATTEMPTS):
        try:
            floor, _etag = chain.floor()
        except LandingCorrupt as exc:
            return [BrokenLink(f"{chain.base}floor.json", str(exc))], []
        found = _check_claims(chain, floor)
        if found is not None:
            return found
    raise ObjectStoreError(f"{chain.base}: the chain kept moving under the check")


def _check_claims(chain: PartitionChain, floor: Floor) -> tuple[list[BrokenLink], list[FileRange]] | None:
    get = chain.claims_ahead(chain._listed_seqs(floor.seq), CLAIM_GETS.get())
    with contextlib.closing(get):
        return _check_links(chain, floor, get)


def _check_links(
    chain: PartitionChain, floor: Floor, got: Iterable[tuple[int, tuple[bytes, str] | None]]
) -> tuple[list[BrokenLink], list[FileRange]] | None:
    out: list[BrokenLink] = []
    ranges: list[FileRange] = []
    before_state, before, known = floor.state, None, True  # known: the slot before was read
    want = floor.seq + 1
    for seq, body in got:
        for missing in range(want, seq):
            if not chain._gap(missing, floor.seq):
                return None  # compaction since the floor read: check again
            out.append(BrokenLink(chain.claim_key(missing), f"missing, but claim {seq} exists"))
            known = False
        want = seq + 1
        try:
            claim = chain._claim_from(seq, body)
        except ChainBroken as exc:
            out.append(BrokenLink(exc.key, exc.problem))
            known = False
            continue
        if claim is None:
            if not chain._gap(seq, floor.seq):
                return None
            out.append(BrokenLink(chain.claim_key(seq), "listed, then gone (deleted?)"))
            known = False
            continue
        if claim.range is not None:
            ranges.append(claim.range)
        if known:
            problem = link_problem(chain.topic, chain.partition, seq, claim, before_state, before)
            if problem is not None and chain._compacted(seq):
                return None
            if problem is not None:
                out.append(BrokenLink(chain.claim_key(seq), problem))
        before_state, before, known = claim.state, claim, True
    return out, ranges


def _live_ranges(claims: list[Claim]) -> dict[int, FileRange]:
    """seq -> range of the file claims that no void record follows."""
    voided = {c.voids for c in claims if c.voids is not None}
    return {c.seq: c.range for c in claims if c.range is not None and c.seq not in voided}


def _reap_body(state: str) -> bytes:
    return json.dumps({"state": state, "at": layout.iso_now()}).encode()


def _reap_state(data: bytes) -> str:
    try:
        return str(json.loads(data)["state"])
    except (ValueError, KeyError, TypeError):
        return "pending"  # a torn marker cannot exist (single PUT); be safe: treat as undecided


def reap(objects: Objects, staged: str, chain: PartitionChain) -> bool:
    """The janitor's deletion of one staged object of ``chain``'s partition (module docstring);
    True when it was deleted. Never deletes what the head claim still needs."""
    marker = staged + REAP_SUFFIX
    for _ in range(_ATTEMPTS):
        try:
            etag = objects.put(marker, _reap_body("pending"), if_absent=True)
        except PreconditionFailed:
            got = objects.get(marker)
            if got is None:
                continue
            state = _reap_state(got[0])
            if state == "keep":
                return False
            if state == "delete":
                objects.delete(staged)
                return True
            etag = got[1]  # a janitor that died half-way: take its decision over
        _floor, head = chain.latest()
        needed = head is not None and head.staged == staged and head.range is not None
        if needed and head is not None and head.range is not None:
            needed = objects.head(head.range.path) is None  # promoted already: the copy is done
        try:
            objects.put(marker, _reap_body("keep" if needed else "delete"), if_match=etag)
        except PreconditionFailed:
            continue  # a promoter marked it keep first
        if needed:
            return False
        objects.delete(staged)
        return True
    return False
