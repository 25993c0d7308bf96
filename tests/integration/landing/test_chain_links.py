"""Claim-chain links (issue 31 item 2), on both stores (a directory and SeaweedFS): a claim
deleted, overwritten by an older valid claim, or overwritten by junk is found by every reader (the
chain reader and the Spark source's driver over it), by a publisher that saw the head before (it
re-reads it: it used to write past the break from its cached copy) and by one that starts fresh,
each naming the object and reading or writing nothing past it; ``mqd landing check`` lists every
broken link and exits 1, 0 on a whole landing, 2 on bad usage."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.chain_tamper import HOW, claim_key, publish_files, tamper
from support.cli import mqd
from support.seaweedfs import fresh_uri, object_store

from mqd.landing import Publisher
from mqd.landing.chain_reader import ChainReader
from mqd.landing.errors import ChainBroken
from mqd.landing.local_store import LocalStore
from mqd.landing.objects import Objects
from mqd.landing.store import LandingStore
from mqd.testing.seaweedfs import SeaweedFS

PER_FILE = 160  # the reproduction lost or doubled one file of 160 records


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    """A factory of opened stores on one fresh landing (each call: a new process's store)."""
    if request.param == "local":
        root = tmp_path / "landing"

        def local() -> LandingStore:
            s = LocalStore(root)
            s.open()
            return s

        yield local
    else:
        server: SeaweedFS = request.getfixturevalue("seaweedfs")
        uri = fresh_uri(server)
        yield lambda: object_store(server, uri)


@pytest.mark.parametrize("how", HOW)
def test_readers_stop_at_a_broken_claim_naming_it(make_store: object, how: str) -> None:
    """Claim 2 of 5 broken: the chain reader and the Spark source's planning raise ChainBroken
    naming claim 2; the old reader skipped a deleted claim's file (160 records missing from the
    table) and read an older claim's file twice (160 duplicated, 160 missing)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from mqd.spark.landing_source import LandingStreamReader

    store = make_store()  # type: ignore[operator]
    publish_files(Publisher(store), "events", 0, 5, PER_FILE)
    key = tamper(store.objects, "events", 0, 2, how)

    with pytest.raises(ChainBroken) as err:
        ChainReader(store.objects).refresh()
    assert err.value.key == key and key in str(err.value)

    source = LandingStreamReader({"uri": store.location}, objects=store.objects)
    with pytest.raises(ChainBroken, match=key):
        source.latestOffset({}, ReadAllAvailable())


@pytest.mark.parametrize("how", HOW)
def test_an_incremental_reader_stops_at_a_claim_broken_since_its_last_pass(
    make_store: object, how: str
) -> None:
    """A reader that consumed claims 0-1 meets claim 2 broken (a later claim exists): it raises,
    and its view stays where it was (nothing read past the break), pass after pass."""
    store = make_store()  # type: ignore[operator]
    pub = Publisher(store)
    publish_files(pub, "events", 0, 2, PER_FILE)
    reader = ChainReader(store.objects)
    assert len(reader.refresh()[("events", 0)].files) == 2
    publish_files(pub, "events", 0, 3, PER_FILE, start_file=2)
    key = tamper(store.objects, "events", 0, 2, how)
    for _ in range(2):
        with pytest.raises(ChainBroken, match=key):
            reader.refresh()
    assert reader._views[("events", 0)].seq == 1 and len(reader._views[("events", 0)].files) == 2


@pytest.mark.parametrize("how", HOW)
def test_a_publisher_never_writes_past_a_broken_head(make_store: object, how: str) -> None:
    """The head claim (2) broken under a publisher that saw it: its next commit raises ChainBroken
    naming claim 2 and claim 3 is never written (the old publisher trusted its cached head and wrote
    claim 3 past the break); a fresh publisher (a restart: the daemon's resume) refuses too, naming
    claim 2, or for a deleted head the visible file its range would take again."""
    store = make_store()  # type: ignore[operator]
    pub = Publisher(store)
    publish_files(pub, "events", 0, 3, PER_FILE)
    key = tamper(store.objects, "events", 0, 2, how)
    with pytest.raises(ChainBroken, match=key):
        publish_files(pub, "events", 0, 1, PER_FILE, start_file=3)
    assert store.objects.get(claim_key("events", 0, 3)) is None

    fresh = make_store()  # type: ignore[operator]
    if how == "deleted":
        # the chain ends at claim 1 now; claim 2's file stays visible: landing its range again
        # would publish those records twice, so the name refuses it
        assert fresh.head("events", 0).last_offset == 2 * PER_FILE - 1
        with pytest.raises(ChainBroken, match=r"part-00000-.*00000000000000000320\.parquet"):
            publish_files(Publisher(fresh), "events", 0, 1, PER_FILE, start_file=2)
    else:
        with pytest.raises(ChainBroken, match=key):
            fresh.head("events", 0)
    assert store.objects.get(claim_key("events", 0, 3)) is None


def landing_check(store: LandingStore, server: SeaweedFS | None, *extra: str) -> tuple[int, str, str]:
    args = ["landing", "check", "--dir", store.location, *extra]
    env = {}
    if server is not None:
        args += ["--endpoint-url", server.endpoint, "--region", "us-east-1"]
        env = server.env()
    res = mqd(*args, env=env)
    return res.returncode, res.stdout, res.stderr


@pytest.mark.parametrize("how", HOW)
def test_landing_check_lists_every_broken_link(
    make_store: object, how: str, request: pytest.FixtureRequest
) -> None:
    """``mqd landing check`` on a whole landing exits 0; with claim 2 of partition 0 and the head
    of partition 1 broken it exits 1 listing both objects (a deleted head, which leaves no hole,
    shows as the visible file no claim names), in text and JSON."""
    server = request.getfixturevalue("seaweedfs") if "s3" in request.node.callspec.id else None
    store = make_store()  # type: ignore[operator]
    pub = Publisher(store)
    publish_files(pub, "events", 0, 4, PER_FILE)
    publish_files(pub, "events", 1, 3, PER_FILE)
    code, out, err = landing_check(store, server)
    assert code == 0, (out, err)
    assert "0 broken" in out

    k0 = tamper(store.objects, "events", 0, 2, how)
    k1 = tamper(store.objects, "events", 1, 2, how)
    code, out, err = landing_check(store, server)
    assert code == 1, (out, err)
    assert f"{store.location}/{k0}" in out
    if how == "deleted":
        assert "part-00001-" in out and "no claim names" in out
    else:
        assert f"{store.location}/{k1}" in out
    code, out, _ = landing_check(store, server, "--json")
    assert code == 1
    broken = {b["object"] for b in json.loads(out)["broken"]}
    assert k0 in broken and (how == "deleted" or k1 in broken)


def test_landing_check_bad_usage_exits_2() -> None:
    """No such directory, a directory that is no landing, an unknown option: exit 2."""
    with tempfile.TemporaryDirectory() as empty:
        assert mqd("landing", "check", "--dir", f"{empty}/nope").returncode == 2
        res = mqd("landing", "check", "--dir", empty)
        assert res.returncode == 2 and "not a landing" in res.stderr
    assert mqd("landing", "check", "--bogus").returncode == 2


class TamperAfterClaim:
    """Objects that break claim ``seq - 1`` right after claim ``seq`` is created: the break lands
    between the publisher's head read and its promotion, the window an S3 chaos run drew (seed
    385922: a junk claim 29 while claim 30 was in flight)."""

    def __init__(self, objects: Objects, seq: int, how: str) -> None:
        self._objects = objects
        self._key = claim_key("events", 0, seq)
        self._seq, self._how = seq, how
        self.tampered: str | None = None

    def put(self, key: str, data: bytes, **kw: Any) -> Any:
        got = self._objects.put(key, data, **kw)
        if key == self._key and self.tampered is None:
            self.tampered = tamper(self._objects, "events", 0, self._seq - 1, self._how)
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self._objects, name)


@pytest.mark.parametrize("how", HOW)
def test_a_head_broken_while_the_next_claim_is_written_stops_the_publisher(
    make_store: object, how: str
) -> None:
    """Claim 2 broken after the publisher read it and while it created claim 3: the commit raises
    ChainBroken naming claim 2 and claim 3's file never becomes visible (the publisher used to
    promote claim 3 and, its hint at 3, go on publishing past the break); once claim 2 is put back,
    a fresh publisher resolves claim 3 and the chain is whole, each record once."""
    store = make_store()  # type: ignore[operator]
    publish_files(Publisher(store), "events", 0, 3, PER_FILE)
    original = store.objects.get(claim_key("events", 0, 2))
    assert original is not None
    faulty = TamperAfterClaim(store.objects, 3, how)
    with pytest.raises(ChainBroken, match=claim_key("events", 0, 2)):
        publish_files(Publisher(LandingStore(faulty)), "events", 0, 1, PER_FILE, start_file=3)
    assert faulty.tampered == claim_key("events", 0, 2)
    got = store.objects.get(claim_key("events", 0, 3))
    assert got is not None
    assert store.objects.head(json.loads(got[0])["range"]["path"]) is None, "claim 3 was promoted"

    store.objects.put(claim_key("events", 0, 2), original[0])
    fresh = make_store()  # type: ignore[operator]
    assert fresh.head("events", 0).last_offset == 4 * PER_FILE - 1
    ranges = ChainReader(fresh.objects).refresh()[("events", 0)].files
    assert [(r.first_offset, r.last_offset) for r in ranges] == [
        (f * PER_FILE, (f + 1) * PER_FILE - 1) for f in range(4)
    ]
