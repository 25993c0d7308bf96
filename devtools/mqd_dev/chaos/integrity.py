"""Two integrity faults of issue 31, each ended by the operator's repair so that the run's end check
still judges every record (0 lost and 0 duplicated in the landing and the table, or a failure):

- ``claim_tamper``: the head claim of one partition's chain deleted, overwritten by the claim before
  it (an older valid claim), or overwritten by junk, under the running daemons. The owner must stop
  that partition naming the object (``landing claim chain broken``) and publish nothing after it;
  ``check_landing`` must list it; then the claim is put back as it was and the daemons that
  reported it restart (a broken partition stays stopped until then).
- ``checkpoint_delete``: the streaming ``mqd spark``'s checkpoint copied (the job held by SIGSTOP
  for the copy, so it is one consistent state) and deleted under the running job; the restarted job
  must refuse (exit 2, ``spark_checkpoint_mismatch`` naming the checkpoint); the recovery its
  message names first, restoring the checkpoint, is done by copying the copy back over what the job
  wrote meanwhile (its later batches stay), and the job goes on. Restoring keeps the table and so
  the end check meaningful; a new output and checkpoint would start the table again.
"""

from __future__ import annotations

import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from mqd.landing.chain_check import check_landing
from mqd.landing.claim_chain import Claim, chain_prefix, claim_key
from mqd.landing.errors import LandingCorrupt, PreconditionFailed
from mqd.landing.objects import Objects
from mqd.testing import ManagedProcess

HOWS = ("deleted", "older", "junk")
BROKEN_EVENT = b"landing claim chain broken"
MISMATCH_EVENT = b"spark_checkpoint_mismatch"
_SEQ = re.compile(r"(\d{20})\.json$")


@dataclass
class Tamper:
    partition: int
    how: str
    seq: int
    key: str
    original: bytes
    written: bytes | None  # what the tamper put there (None: deleted)
    raced: list[int]  # claims after it seen right after the tamper (published meanwhile: not the head)


def claim_seqs(objects: Objects, topic: str, partition: int) -> list[int]:
    out = []
    for info in objects.list_objects(f"{chain_prefix(topic, partition)}claims/"):
        m = _SEQ.search(info.key)
        if m:
            out.append(int(m.group(1)))
    return out


def tamper_head(objects: Objects, topic: str, partition: int, how: str) -> Tamper | None:
    """Break the head claim of the chain ``how`` (``HOWS``); None when the chain is too short."""
    seqs = claim_seqs(objects, topic, partition)
    if not seqs or (how == "older" and len(seqs) < 2):
        return None
    seq = seqs[-1]
    key = claim_key(chain_prefix(topic, partition), seq)
    got = objects.get(key)
    if got is None:
        return None
    written: bytes | None
    if how == "deleted":
        objects.delete(key)
        written = None
    elif how == "older":
        older = objects.get(claim_key(chain_prefix(topic, partition), seqs[-2]))
        if older is None:
            return None
        written = older[0]
        objects.put(key, written)
    else:
        written = b"{chaos: not a claim"
        objects.put(key, written)
    raced = [s for s in claim_seqs(objects, topic, partition) if s > seq]
    return Tamper(partition, how, seq, key, got[0], written, raced)


def published_past(objects: Objects, topic: str, t: Tamper) -> list[int]:
    """Claims after the tampered one that were not there right after the tamper, but the one an
    owner had in flight and never promoted: it finds the break once its claim is in the slot
    (claim_chain's link check, decision 076), so that claim may exist, its file not visible."""
    past = [s for s in claim_seqs(objects, topic, t.partition) if s > t.seq and s not in t.raced]
    if past[:1] == [t.seq + 1] and not _promoted(
        objects, claim_key(chain_prefix(topic, t.partition), t.seq + 1)
    ):
        past = past[1:]
    return past


def _promoted(objects: Objects, key: str) -> bool:
    """Whether the claim at ``key`` names a file that is visible (a void or an unreadable
    claim counts as promoted: it is no in-flight file claim)."""
    got = objects.get(key)
    if got is None:
        return False
    try:
        claim = Claim.from_bytes(got[0], key)
    except LandingCorrupt:
        return True
    return claim.range is None or objects.head(claim.range.path) is not None


def restore(objects: Objects, t: Tamper) -> str | None:
    """Put the claim back as it was; what went wrong, if anything."""
    if t.written is None:
        try:
            objects.put(t.key, t.original, if_absent=True)
        except PreconditionFailed:
            return f"{t.key} was taken by another claim while it was missing"
        return None
    got = objects.get(t.key)
    if got is None or got[0] != t.written:
        return f"{t.key} changed again while it was broken"
    objects.put(t.key, t.original, if_match=got[1])
    return None


def landing_check_names(objects: Objects, t: Tamper) -> bool:
    """``mqd landing check``'s function lists the break (a deleted head: its orphaned file)."""
    broken = check_landing(objects).broken
    if t.written is None:
        return any(f"part-{t.partition:05d}-" in b.key for b in broken) or any(b.key == t.key for b in broken)
    return any(b.key == t.key for b in broken)


def reported(log_path: Path, start: int, t: Tamper) -> bool:
    """The daemon whose log this is reported the break of ``t``'s partition since ``start``."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(start)
            text = fh.read()
    except OSError:
        return False
    tp = f"/{t.partition}".encode()
    return any(
        BROKEN_EVENT in line
        and (t.key.encode() in line or f"part-{t.partition:05d}-".encode() in line or tp in line)
        for line in text.splitlines()
    )


def reported_by_spark(log_path: Path, start: int, t: Tamper) -> bool:
    """The streaming job's log names the tampered claim since ``start`` (its refusal)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(start)
            return t.key.encode() in fh.read()
    except OSError:
        return False


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def copy_checkpoint(job: ManagedProcess, checkpoint: Path, copy: Path) -> None:
    """A consistent copy of a running job's checkpoint: the job is held still while it is taken."""
    frozen = job.running
    if frozen:
        job.send_signal(signal.SIGSTOP)
    try:
        shutil.copytree(checkpoint, copy)
    finally:
        if frozen and job.running:
            job.send_signal(signal.SIGCONT)


def restore_checkpoint(copy: Path, checkpoint: Path) -> None:
    """The copy back in place, over what the job wrote after the deletion (its later batches)."""
    shutil.copytree(copy, checkpoint, dirs_exist_ok=True)


def refused_naming(log_path: Path, start: int, checkpoint: Path) -> bool:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(start)
            text = fh.read()
    except OSError:
        return False
    return any(MISMATCH_EVENT in line and str(checkpoint).encode() in line for line in text.splitlines())
