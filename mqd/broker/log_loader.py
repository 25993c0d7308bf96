"""Opening a partition log: its segments recovered from the files, its incarnation history loaded.

Kafka's way (``LogLoader`` apart from ``UnifiedLog``): :class:`LogLoader` does the blocking work of
an open once, before the log takes any call, and hands the log (storage.py) a :class:`LoadedLog`.

Recovery keeps intact data (issue 12). A closed segment's index is trusted when it is consistent with
its file (:meth:`mqd.broker.segment.Segment.load_indexes`); otherwise, and always for the active
(last) segment, the segment is scanned with CRC checks. A damaged batch with intact batches after
it is fenced (a hole), a closed segment cut short leaves its missing offsets fenced up to the next
segment's base, and ``fenced.json`` (fenced_ranges.py) is brought up to date. Only a torn tail of the
active segment is cut, and that cut begins a new incarnation at the cut offset. Segments that
overlap, and empty ones before others or after a gap (a crash inside a roll or a reset), are removed.

The history (:mod:`mqd.broker.incarnation`): a log created empty or recreated begins an incarnation
at 0, a log written before incarnations one at its first offset; an unreadable history is set aside
and the log begins a new one. After a crash (``after_crash``: no clean shutdown and appends not each
fsynced) the log begins a new incarnation at its end unless recovery began one already, and so does a
log whose files end before its current incarnation began (cut outside mqd).
"""

from __future__ import annotations

import dataclasses
import os

import structlog

from mqd.broker.fenced_ranges import FencedRanges
from mqd.broker.incarnation import IncarnationHistory
from mqd.broker.log_dir import REPAIR_SUFFIX, LogDir
from mqd.broker.segment import LOG_SUFFIX, Segment, segment_name
from mqd.wire.incarnation import IncarnationEntry, IncarnationError

log = structlog.get_logger("mqd.broker.storage")  # the log's lines, wherever they are written


def begin_incarnation(
    log_dir: LogDir,
    history: IncarnationHistory,
    base: int,
    why: str,
    entries: list[IncarnationEntry] | None = None,
    *,
    cut: bool = True,
) -> None:
    """Start a new incarnation of ``history`` at ``base`` (or adopt a master's ``entries``) before a
    cut; ``cut`` False for a log created or upgraded (nothing served is affected: an info line)."""
    if entries is not None and entries == history.entries:
        return  # already the master's: nothing to write or say
    before = history.current if history.entries else None
    try:
        if entries is None:
            history.begin_new(base)
        else:
            history.adopt(entries)
    except OSError as exc:
        raise log_dir.disk_error(exc, "history write") from exc
    (log.warning if cut else log.info)(
        "new log incarnation" if entries is None else "adopted the master's incarnation history",
        topic=log_dir.topic,
        partition=log_dir.partition,
        incarnation=history.current,
        base=history.current_base,
        previous=before,
        why=why,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class LoadedLog:
    """What :meth:`LogLoader.load` found: the segments in offset order (the last one takes appends),
    how many closed segments' indexes were trusted and how many segments were scanned (start-up cost
    grows with the scanned ones only), and whether files were created or removed in the folder
    since its last fsync."""

    segments: list[Segment]
    trusted: int
    scanned: int
    dir_dirty: bool


class LogLoader:
    """Opens the log in ``log_dir`` once (:meth:`load`): fills ``history`` and ``fenced``."""

    def __init__(self, log_dir: LogDir, history: IncarnationHistory, fenced: FencedRanges) -> None:
        self._dir = log_dir
        self._history = history
        self._fenced = fenced
        self._segments: list[Segment] = []
        self._trusted = 0
        self._scanned = 0
        self._dir_dirty = False

    def load(self, *, after_crash: bool = False) -> LoadedLog:
        """Create or recover the log (blocking); on an error every segment file it opened is closed
        again. ``after_crash``: the node did not close cleanly and appends were not each fsynced, so
        the tail may have lost records that were served (a file reverted to its last synced size
        shows no torn bytes): unless recovery cut something already, the log begins a new
        incarnation at its end."""
        self._dir.path.mkdir(parents=True, exist_ok=True)
        bases: list[int] = []
        for p in self._dir.path.iterdir():
            if p.name.startswith(".") and p.suffix == REPAIR_SUFFIX:
                p.unlink()  # a repair that did not finish: the segment it was to replace is intact
                continue
            if p.suffix != LOG_SUFFIX:
                continue
            try:
                bases.append(int(p.stem))
            except ValueError:
                log.warning("ignoring unexpected file in log directory", path=str(p))
        bases.sort()
        try:
            loaded = self._load_history()
            if not bases:
                # created empty, or recreated: whatever a history says named records that are gone
                self._begin(0, "log created" if not loaded else "log files gone", cut=loaded)
            elif not loaded:
                # a log written before incarnations: every offset it holds stays valid under one id
                self._begin(bases[0], "log written before incarnations", cut=False)
            recorded = self._fenced.load_record()
            history_before = self._history.entries
            self._recover(bases, recorded)
            if not self._segments:
                self._segments.append(self._dir.create_segment(0, 0))
                self._dir_dirty = True
            active = self._segments[-1]
            for first, last in recorded:
                if first == active.next_offset and first >= 0:
                    # a fenced range copied from a master at the log end: no bytes to find it by
                    active.add_hole(first, last, active.size, active.size)
            self._fenced.refresh(self._segments, recorded)
            end = active.next_offset
            if end < self._history.current_base:
                # the files end before the current incarnation began: they were cut outside mqd
                self._begin(end, "log shorter than its current incarnation")
            elif after_crash and bases and self._history.entries == history_before:
                self._begin(end, "unclean shutdown: unflushed records may be lost")
        except BaseException:
            for seg in self._segments:
                try:
                    os.close(seg.fd)
                except OSError:
                    pass
            raise
        return LoadedLog(self._segments, self._trusted, self._scanned, self._dir_dirty)

    def _begin(self, base: int, why: str, *, cut: bool = True) -> None:
        begin_incarnation(self._dir, self._history, base, why, cut=cut)

    def _load_history(self) -> bool:
        """Load the incarnation history; an unreadable one is set aside (kept for people) and the
        log gets a new incarnation: consumers then land what they read again, counted, instead of
        trusting offsets nothing vouches for, and the node still starts."""
        try:
            return self._history.load()
        except IncarnationError as exc:
            aside = self._history.path.with_name(self._history.path.name + ".damaged")
            log.error(
                "incarnation history unreadable: set aside, the log begins a new incarnation",
                topic=self._dir.topic,
                partition=self._dir.partition,
                error=str(exc),
                kept_as=str(aside),
            )
            os.replace(self._history.path, aside)
            return False

    def _recover(self, bases: list[int], recorded: list[tuple[int, int]]) -> None:
        topic, partition = self._dir.topic, self._dir.partition
        segments = self._segments
        bases = self._drop_empty_closed_segments(bases)
        start_byte = 0
        for i, base in enumerate(bases):
            path = self._dir.segment_path(base)
            last = i == len(bases) - 1
            next_base = None if last else bases[i + 1]
            if segments and base < segments[-1].next_offset:
                log.warning(
                    "overlapping segments: deleting the later segments",
                    topic=topic,
                    partition=partition,
                    expected=segments[-1].next_offset,
                    found=base,
                    deleted=[segment_name(b) for b in bases[i:]],
                )
                self._begin(segments[-1].next_offset, "recovery cut")
                for b in bases[i:]:
                    self._dir.unlink_segment_files(self._dir.segment_path(b))
                self._dir_dirty = True
                return
            if segments and base > segments[-1].next_offset and last and path.stat().st_size == 0:
                # an empty last segment after a gap (a crash inside a reset): it holds nothing
                log.warning(
                    "dropping an empty segment after a gap",
                    topic=topic,
                    partition=partition,
                    segment=path.name,
                    log_end=segments[-1].next_offset,
                )
                self._dir.unlink_segment_files(path)
                self._dir_dirty = True
                return
            # a gap before this segment (a segment file lost) is fenced by FencedRanges.refresh
            seg = self._dir.open_segment(path, base, start_byte)
            if not last and seg.load_indexes():
                seg.trusted = True  # its middle batches are checked by the scrub (scrub.py)
                self._trusted += 1
                segments.append(seg)
                start_byte += seg.size
                continue
            self._scanned += 1
            valid = seg.scan(next_base, recorded)
            if valid < seg.size and last:
                log.warning(
                    "truncating torn or corrupt log tail",
                    topic=topic,
                    partition=partition,
                    segment=path.name,
                    bytes=seg.size - valid,
                    at=valid,
                    offset=seg.next_offset,
                )
                # before the cut: a crash in between leaves a new id, never the old one over a gap
                self._begin(seg.next_offset, "recovery cut")
                os.ftruncate(seg.fd, valid)
                os.fsync(seg.fd)
                seg.size = valid
            elif next_base is not None and seg.next_offset < next_base:
                # a closed segment damaged or cut short up to its end: fence the rest of its offsets
                seg.add_hole(seg.next_offset, next_base - 1, valid, seg.size)
            elif valid < seg.size:
                # bytes after the last batch of a closed segment that stand for no offset
                log.warning(
                    "cutting bytes after the last batch of a closed segment",
                    topic=topic,
                    partition=partition,
                    segment=path.name,
                    bytes=seg.size - valid,
                    at=valid,
                )
                os.ftruncate(seg.fd, valid)
                os.fsync(seg.fd)
                seg.size = valid
            for hole in seg.holes:
                log.error(
                    "damaged range in a log segment: fenced",
                    topic=topic,
                    partition=partition,
                    segment=path.name,
                    first_offset=hole.first,
                    last_offset=hole.last,
                    byte_start=hole.start,
                    byte_end=hole.end,
                )
            if not last:
                seg.write_indexes()
            segments.append(seg)
            start_byte += seg.size

    def _drop_empty_closed_segments(self, bases: list[int]) -> list[int]:
        """An empty segment before others carries nothing (a crash inside a roll or a reset, or a
        file cut to nothing, whose offsets then show as a gap): drop it."""
        kept = []
        for i, base in enumerate(bases):
            path = self._dir.segment_path(base)
            if i < len(bases) - 1 and path.stat().st_size == 0:
                self._dir.unlink_segment_files(path)
                self._dir_dirty = True
                continue
            kept.append(base)
        return kept
