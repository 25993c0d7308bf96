"""The pure parts of the schema registry client (mqd/spark/schema_registry.py) and of the test
registry's build (mqd/testing/schema_registry.py): error bodies, headers, cache keys, the settings
Maven gets, how a failed Maven run is told, and the clear errors without Java or network (against a
closed 127.0.0.1 port: nothing leaves the machine)."""

from __future__ import annotations

import base64
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mqd.config import SchemaRegistryConfig
from mqd.errors import MqdError
from mqd.spark.schema_registry import (
    RegisteredSchema,
    ResolvedReference,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
    _error_of,
    _short,
)
from mqd.testing import schema_registry as sr
from mqd.testing.cluster import free_port

POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def config(**settings: object) -> SchemaRegistryConfig:
    return SchemaRegistryConfig.model_validate({"url": "http://127.0.0.1:1/apis/ccompat/v7", **settings})


def test_error_body_confluent_and_otherwise() -> None:
    assert _error_of({"error_code": 40403, "message": "Schema 7 not found"}) == (40403, "Schema 7 not found")
    assert _error_of({"message": "no code"}) == (None, "no code")
    assert _error_of({"other": 1}) == (None, '{"other": 1}')
    assert _error_of("<html>Bad Gateway</html>") == (None, "<html>Bad Gateway</html>")
    assert _error_of("") == (None, "(empty answer)")
    assert len(_short("x" * 1000)) == 300 and _short("a\n  b") == "a b"


def test_error_is_an_mqd_error_with_its_facts() -> None:
    e = SchemaRegistryError("m", url="http://r", schema_id=3, status=404, error_code=40403)
    assert isinstance(e, MqdError) and not e.retriable
    assert (e.url, e.schema_id, e.subject, e.status, e.error_code) == ("http://r", 3, None, 404, 40403)
    assert SchemaRegistryError("m", retriable=True).retriable


def test_authorization_header() -> None:
    basic = SchemaRegistryClient(config(username="alice", password="p:w"))._headers["Authorization"]
    assert basic == "Basic " + base64.b64encode(b"alice:p:w").decode()
    bearer = SchemaRegistryClient(config(bearer_token="tok"))._headers["Authorization"]
    assert bearer == "Bearer tok"
    assert "Authorization" not in SchemaRegistryClient(config())._headers


def test_urls_trailing_slash_and_order() -> None:
    c = SchemaRegistryClient(
        SchemaRegistryConfig.model_validate({"url": ["http://a:1/x/", "https://b:2/y"], "request_timeout": 3})
    )
    assert c.urls == ["http://a:1/x", "https://b:2/y"] and c.timeout == 3.0


def test_reference_texts() -> None:
    ref = ResolvedReference("m.proto", "m", 1, 5, "PROTOBUF", "text-m", ())
    found = RegisteredSchema(6, "PROTOBUF", "main", (SchemaReference("m.proto", "m", 1),), (ref,))
    assert found.reference_texts == {"m.proto": "text-m"}


def test_pom_carries_the_workarounds() -> None:
    """The build's pom names the Apicurio version, Central's everit in place of JitPack's, and the
    config-index pin."""
    root = ET.fromstring(sr.pom_xml())
    props = root.find("m:properties", POM_NS)
    assert (
        props is not None and props.findtext("m:apicurio.version", namespaces=POM_NS) == sr.APICURIO_VERSION
    )
    text = sr.pom_xml().decode()
    assert "<artifactId>org.everit.json.schema</artifactId>" in text  # excluded
    assert "<groupId>com.github.erosb</groupId>" in text
    assert "<version>0.1.10.Final</version>" in text


def test_settings_mirror_everything_to_one_repository() -> None:
    root = ET.fromstring(sr.settings_xml("https://mirror.example/maven2/"))
    assert root.findtext("mirrors/mirror/mirrorOf") == "*"
    assert root.findtext("mirrors/mirror/url") == "https://mirror.example/maven2"


def test_build_key_follows_the_inputs() -> None:
    assert sr.build_key(sr.CENTRAL) == sr.build_key(sr.CENTRAL)
    assert sr.build_key(sr.CENTRAL) != sr.build_key("http://127.0.0.1:1/maven2")
    assert len(sr.build_key()) == 16


def test_maven_failure_told_as_network_or_build(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text(
        "[INFO] Scanning for projects...\n"
        "[ERROR] Plugin x could not be resolved: Could not transfer artifact "
        "io.quarkus:quarkus-maven-plugin:pom:2.16.4.Final from/to mqd-central (http://127.0.0.1:9/): "
        "Connection refused\n[ERROR]\n"
    )
    e = sr._maven_failure(log, "http://127.0.0.1:9/")
    assert e.retriable and "cannot reach http://127.0.0.1:9/ (Connection refused)" in str(e)
    assert "Could not transfer artifact io.quarkus" in str(e) and str(log) in str(e)
    log.write_text("[ERROR] Failed to execute goal io.quarkus:quarkus-maven-plugin:build: boom\n")
    e = sr._maven_failure(log, sr.CENTRAL)
    assert not e.retriable and "Maven failed" in str(e) and "boom" in str(e)


def test_no_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(sr.SchemaRegistryBuildError, match="runs on Java: java not found"):
        sr._java_home()


def test_no_network_for_maven_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Maven's distribution from a repository that does not answer (a closed 127.0.0.1 port)."""
    monkeypatch.setenv("MQD_CACHE_DIR", str(tmp_path))
    dead = f"http://127.0.0.1:{free_port()}/maven2"
    with pytest.raises(sr.SchemaRegistryBuildError) as err:
        sr.maven_distribution(dead, timeout=5)
    assert err.value.retriable and f"cannot reach {dead}/org/apache/maven/apache-maven" in str(err.value)
    assert "-bin.tar.gz" in str(err.value) and "once; later uses are offline" in str(err.value)


def test_prepared_needs_a_complete_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A build folder counts only with its app.json naming a jar that exists."""
    monkeypatch.setenv("MQD_CACHE_DIR", str(tmp_path))
    folder = sr.registry_cache() / sr.build_key()
    assert sr.prepared() is None
    folder.mkdir(parents=True)
    (folder / "app.json").write_text(json.dumps({"runner": "app/quarkus-run.jar"}))
    assert sr.prepared() is None
    (folder / "app").mkdir()
    (folder / "app" / "quarkus-run.jar").write_bytes(b"PK")
    assert sr.prepared() == folder / "app" / "quarkus-run.jar"
