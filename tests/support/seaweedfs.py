"""The object-store test fixtures: one SeaweedFS (mqd.testing.seaweedfs) for the whole session with
two S3 gateways on one filer ("two machines"), and object stores on fresh prefixes of its bucket so
tests never see each other's objects. tests/conftest.py re-exports the ``seaweedfs`` fixture."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from mqd.landing.s3_objects import S3Objects
from mqd.landing.store import LandingStore
from mqd.testing.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A started SeaweedFS with a second gateway (``endpoints[1]``); stopped after the session."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
        server.add_gateway()
        yield server
    except BaseException:
        print(server.dump_logs())
        raise
    finally:
        server.stop()


@pytest.fixture(scope="module")
def signing_gateway(seaweedfs: SeaweedFS, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A gateway that authenticates, as S3 does: S3A signs its uploads chunk by chunk, which a
    SeaweedFS gateway without identities refuses ("Signed request requires setting up SeaweedFS S3
    authentication"). Its endpoint URL."""
    identities = tmp_path_factory.mktemp("s3-identities") / "s3.json"
    admin = {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}
    actions = ["Admin", "Read", "List", "Write", "Tagging"]
    identities.write_text(
        json.dumps({"identities": [{"name": "admin", "credentials": [admin], "actions": actions}]})
    )
    return seaweedfs.add_gateway(f"-config={identities}")


def fresh_uri(server: SeaweedFS) -> str:
    """``s3://<bucket>/<new prefix>``: a landing no other test uses."""
    return f"s3://{server.bucket}/t-{secrets.token_hex(6)}"


def s3_objects(server: SeaweedFS, uri: str, gateway: int = 0) -> S3Objects:
    """Objects at ``uri`` through one of the server's gateways."""
    return S3Objects(uri, client=server.client(server.endpoints[gateway]))


def object_store(server: SeaweedFS, uri: str | None = None, gateway: int = 0) -> LandingStore:
    """An opened object store at ``uri`` (a fresh landing by default)."""
    store = LandingStore(s3_objects(server, uri or fresh_uri(server), gateway))
    store.open()
    return store
