"""``mqd landing check``: every broken link of every claim chain of a landing, read-only.

A reader (the Spark source, the cleaner) and a publisher stop at the first broken link of a chain
(``errors.ChainBroken``): that is the safe thing for them, but an operator repairing a landing wants
the whole list at once. This walks each chain above its floor (``claim_chain.check_chain``: holes in
the numbering, unreadable claims, a claim whose ``seq`` is not its key's, links that do not start
where the claim before ended), reads the archive lines below each floor, and lists the visible data
files that no claim or archive line names: the trace of a claim deleted at the head of its chain,
which leaves no hole behind it (the next publisher would refuse the file's name; a reader would
never see the file).

Same code on a directory and on ``s3://``: only the Objects primitives' reads (get, list) are used,
so read-only credentials suffice.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from mqd.landing import layout
from mqd.landing.chain_reader import CHAIN_READS, CHAINS_AT_ONCE
from mqd.landing.claim_chain import BrokenLink, archive_prefix, check_chain
from mqd.landing.errors import LandingCorrupt
from mqd.landing.layout import FileRange
from mqd.landing.objects import Objects
from mqd.landing.read_ahead import read_ahead
from mqd.topic_name import check_topic_name


@dataclass(slots=True)
class LandingCheck:
    """What ``check_landing`` found."""

    location: str
    chains: int = 0
    claims: int = 0  # file claims above the floors, each checked as a link
    archived: int = 0  # archive lines read below the floors
    visible: int = 0  # visible data files compared with what the chains name
    broken: list[BrokenLink] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "location": self.location,
            "chains": self.chains,
            "claims": self.claims,
            "archived": self.archived,
            "visible_files": self.visible,
            "broken": [{"object": b.key, "problem": b.problem} for b in self.broken],
        }


def is_landing(objects: Objects) -> bool:
    """Whether ``objects`` holds a landing (a format marker or a claim chain) at all."""
    return objects.head(layout.FORMAT_FILE) is not None or bool(objects.list_dirs("_log/"))


def check_landing(objects: Objects) -> LandingCheck:
    """Every broken link of every chain under ``objects``, and every visible data file no chain
    names (module docstring)."""
    out = LandingCheck(objects.location)
    named: set[str] = set()
    keys = [(t, p) for t in _topics(objects, out) for p in _partitions(objects, t, out)]

    def one(key: tuple[str, int]) -> tuple[list[BrokenLink], list[FileRange], list[FileRange]]:
        links, ranges = check_chain(objects, *key)
        archived = _archived(objects, *key, links)
        return links, ranges, archived

    # chains side by side, their findings in chain order (decision 077)
    checked = read_ahead(keys, one, CHAIN_READS.get(), window=CHAINS_AT_ONCE, settle=True)
    with contextlib.closing(checked):
        for _key, (links, ranges, archived) in checked:
            out.chains += 1
            out.broken.extend(links)
            out.claims += len(ranges)
            named.update(r.path for r in ranges)
            out.archived += len(archived)
            named.update(r.path for r in archived)
    for key in _visible_data_files(objects):
        out.visible += 1
        if key not in named:
            out.broken.append(BrokenLink(key, "a visible data file that no claim names (its claim deleted?)"))
    return out


def _topics(objects: Objects, out: LandingCheck) -> list[str]:
    topics = []
    for d in objects.list_dirs("_log/"):
        name = d.rstrip("/").rsplit("/", 1)[-1]
        try:
            topics.append(check_topic_name(name))
        except ValueError:
            out.broken.append(BrokenLink(d, "a folder under _log/ that is not a topic's chains"))
    return sorted(topics)


def _partitions(objects: Objects, topic: str, out: LandingCheck) -> list[int]:
    parts = []
    for d in objects.list_dirs(f"_log/{topic}/"):
        name = d.rstrip("/").rsplit("/", 1)[-1]
        if len(name) == 5 and name.isdigit():
            parts.append(int(name))
        else:
            out.broken.append(BrokenLink(d, "a folder under the topic's chains that is not a partition's"))
    return sorted(parts)


def _archived(objects: Objects, topic: str, partition: int, broken: list[BrokenLink]) -> list[FileRange]:
    """The archive lines' ranges of one chain; an unreadable line goes to ``broken``."""
    ranges: list[FileRange] = []
    for info in objects.list_objects(archive_prefix(topic, partition)):
        got = objects.get(info.key)
        for n, raw in enumerate((got[0] if got else b"").splitlines(), 1):
            try:
                ranges.append(FileRange.from_json(json.loads(raw)["range"]))
            except (ValueError, KeyError, TypeError, LandingCorrupt) as exc:
                broken.append(BrokenLink(info.key, f"archive line {n} unreadable ({exc})"))
    return ranges


def _visible_data_files(objects: Objects) -> list[str]:
    """Data files a reader of the landing sees (``topic=...`` folders, no ``_``/``.`` part)."""
    out = []
    for top in objects.list_dirs(""):
        if not top.startswith("topic="):
            continue
        for info in objects.list_objects(top):
            parts = info.key.split("/")
            if info.key.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in parts):
                out.append(info.key)
    return sorted(out)
