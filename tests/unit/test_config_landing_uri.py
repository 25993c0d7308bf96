"""landing.dir takes an ``s3://bucket/prefix`` URI as well as a path: the URI stays text (a Path
would turn it into ``s3:/bucket/prefix`` under the config folder), a path is still resolved against
the config file, and a bad URI or endpoint is refused naming the key and the file."""

from __future__ import annotations

from pathlib import Path

from support.config import config_error, write_file

from mqd.config import load_daemon_config
from mqd.landing.backends import open_store
from mqd.landing.store import LandingStore


def test_an_s3_uri_stays_a_uri_with_its_endpoint(tmp_path: Path) -> None:
    """dir = "s3://b/p" with [landing.s3] loads as the URI and its settings; open_store picks the
    object store for it (no request is made until open())."""
    path = write_file(
        tmp_path,
        '[landing]\ndir = "s3://lake/mqd/landing"\n'
        '[landing.s3]\nendpoint_url = "http://127.0.0.1:8333"\nregion = "eu-west-1"\n',
    )
    cfg = load_daemon_config(path, {"AWS_ACCESS_KEY_ID": "x"})
    assert cfg.landing.dir == "s3://lake/mqd/landing"
    assert (cfg.landing.s3.endpoint_url, cfg.landing.s3.region) == ("http://127.0.0.1:8333", "eu-west-1")
    store = open_store(
        cfg.landing.dir, endpoint_url=cfg.landing.s3.endpoint_url, region=cfg.landing.s3.region
    )
    assert isinstance(store, LandingStore) and store.location == "s3://lake/mqd/landing"


def test_a_path_is_still_a_path_relative_to_the_file(tmp_path: Path) -> None:
    """A plain value is a folder relative to the config file, as before."""
    cfg = load_daemon_config(write_file(tmp_path, '[landing]\ndir = "land"\n'), {})
    assert cfg.landing.dir == tmp_path / "land"


def test_bad_uris_and_endpoints_are_refused(tmp_path: Path) -> None:
    """Another scheme, an s3:// URI without a bucket, an endpoint that is not an http(s) URL."""
    for value, what in [
        ('dir = "gs://b/p"', "s3://bucket/prefix URI"),
        ('dir = "s3:///p"', "needs a bucket"),
        ('s3 = { endpoint_url = "127.0.0.1:8333" }', "http:// or https:// URL"),
    ]:
        msg = config_error(write_file(tmp_path, f"[landing]\n{value}\n"))
        assert "landing." in msg and what in msg, msg
