"""mqd.testing.maven without network or java: coordinates, the classpath cache and its keys, Ivy's
input files, and the one-line errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mqd.testing import maven
from mqd.testing.kafka_cluster import default_settings, new_cluster_id, properties


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MQD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_dir_follows_mqd_cache_dir_then_xdg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$MQD_CACHE_DIR wins; without it $XDG_CACHE_HOME/mqd; without both ~/.cache/mqd."""
    assert maven.maven_dir() == tmp_path / "cache" / "maven"
    monkeypatch.delenv("MQD_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert maven.maven_dir() == tmp_path / "xdg" / "mqd" / "maven"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert maven.maven_dir() == tmp_path / "home" / ".cache" / "mqd" / "maven"


def test_coordinates_parse_and_refuse_with_the_text() -> None:
    """group:artifact:version and nothing else; the error quotes what was given."""
    c = maven.Coordinate.parse("org.apache.kafka:kafka_2.13:4.4.0")
    assert (c.group, c.artifact, c.version) == ("org.apache.kafka", "kafka_2.13", "4.4.0")
    assert (
        c.url("https://r.example/m2/")
        == "https://r.example/m2/org/apache/kafka/kafka_2.13/4.4.0/kafka_2.13-4.4.0.jar"
    )
    for bad in ("org.apache.kafka:kafka_2.13", "a:b:c:d", "a::1", "a:b/c:1", " a :b:1"):
        with pytest.raises(maven.MavenError, match="not a Maven coordinate"):
            maven.Coordinate.parse(bad)


def test_a_coordinate_set_has_one_key_in_any_order() -> None:
    """The classpath file of a set does not depend on order or repeats; another set or repository
    has another key."""
    a = maven.coordinates(["x:y:1", "a:b:2", "x:y:1"])
    b = maven.coordinates(["a:b:2", "x:y:1"])
    assert a == b and len(a) == 2
    assert maven.classpath_key(a) == maven.classpath_key(b)
    assert maven.classpath_key(a) != maven.classpath_key(maven.coordinates(["a:b:2"]))
    assert maven.classpath_key(a) != maven.classpath_key(a, "https://mirror.example/maven2")


def test_ivy_files_name_each_dependency_escaped() -> None:
    """The module lists every coordinate with its runtime dependencies; the settings keep Ivy's
    cache where mqd says and resolve from the one repository."""
    module = maven.ivy_module_xml(maven.coordinates(["g:a&b:1", "h:c:2"]), "resolve-k")
    assert 'name="a&amp;b"' in module and 'org="h" name="c" rev="2"' in module
    assert module.count('conf="default->default"') == 2
    settings = maven.ivy_settings_xml(Path("/c/ivy-cache"), "https://r.example/m2")
    assert 'defaultCacheDir="/c/ivy-cache"' in settings and 'root="https://r.example/m2/"' in settings


def _write_jars(cache: Path, names: list[str]) -> list[Path]:
    jars = [cache / "ivy-cache" / n for n in names]
    for j in jars:
        j.parent.mkdir(parents=True, exist_ok=True)
        j.write_bytes(b"PK")
    return jars


def test_a_cached_classpath_runs_no_java(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolved once, the same set (in another order) is answered from its classpath file: Ivy is not
    run again and nothing is downloaded."""
    jars = _write_jars(cache, ["a.jar", "b.jar"])
    runs: list[list[str]] = []

    def fake_ivy(
        coords: list[maven.Coordinate], key: str, repository: str | None, timeout: float
    ) -> list[Path]:
        runs.append([str(c) for c in coords])
        return jars

    monkeypatch.setattr(maven, "_run_ivy", fake_ivy)
    assert maven.resolve(["x:y:1", "a:b:2"]) == jars
    assert runs == [["a:b:2", "x:y:1"]]

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached classpath must not start a process")

    monkeypatch.setattr(maven, "_run_ivy", fake_ivy)
    monkeypatch.setattr(subprocess, "run", no_process)
    assert maven.classpath(["a:b:2", "x:y:1"]) == f"{jars[0]}:{jars[1]}"
    assert len(runs) == 1
    record = json.loads(next((cache / "maven" / "classpaths").glob("*.json")).read_text())
    assert record["coordinates"] == ["a:b:2", "x:y:1"] and record["jars"] == [str(j) for j in jars]


def test_a_classpath_with_a_missing_jar_is_resolved_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleaned Ivy cache (a listed jar gone) or a damaged classpath file means: resolve again."""
    jars = _write_jars(cache, ["a.jar", "b.jar"])
    runs: list[str] = []

    def fake_ivy(
        coords: list[maven.Coordinate], key: str, repository: str | None, timeout: float
    ) -> list[Path]:
        runs.append(key)
        _write_jars(cache, ["a.jar", "b.jar"])
        return jars

    monkeypatch.setattr(maven, "_run_ivy", fake_ivy)
    maven.resolve(["a:b:1"])
    jars[1].unlink()
    assert maven.resolve(["a:b:1"]) == jars and len(runs) == 2
    cp_file = next((cache / "maven" / "classpaths").glob("*.json"))
    cp_file.write_text("{not json")
    assert maven.read_classpath(cp_file) is None
    maven.resolve(["a:b:1"])
    assert len(runs) == 3


def test_no_java_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without $JAVA_HOME and java on PATH, the command says so in one line and exits 1, before
    downloading anything."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert maven.main(["a:b:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: java not found") and err.count("\n") == 1
    assert not (maven.maven_dir() / f"ivy-{maven.IVY_VERSION}.jar").exists()


def test_no_network_names_maven_central_and_the_offline_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A repository that cannot be reached: one line saying the first use needs it."""
    assert maven.main(["--repository", "http://127.0.0.1:9/maven2", "--timeout", "5", "a:b:1"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9/maven2" in err
    assert "first use needs network to Maven Central (or $MQD_MAVEN_REPOSITORY)" in err
    assert "later uses are offline" in err
    assert err.count("\n") == 1


def test_unresolved_lines_are_read_from_ivys_report() -> None:
    """Ivy's "UNRESOLVED DEPENDENCIES" block becomes the error's list."""
    output = (
        "\t\t::::::::::::::::::::::::::::::::::::::::::::::\n"
        "\t\t::          UNRESOLVED DEPENDENCIES         ::\n"
        "\t\t::::::::::::::::::::::::::::::::::::::::::::::\n"
        "\t\t:: org.apache.kafka#kafka_2.13;9.9.9: not found\n"
        "\t\t::::::::::::::::::::::::::::::::::::::::::::::\n"
    )
    assert maven._unresolved(output) == ["org.apache.kafka#kafka_2.13;9.9.9: not found"]


def test_kafka_cluster_settings_fit_the_cluster_size() -> None:
    """One broker: internal topics with one replica; three: three replicas, two in sync. Cluster ids
    never start with "-" (the format tool would read one as an option)."""
    one, three = default_settings(1), default_settings(3)
    assert one["offsets.topic.replication.factor"] == "1" and one["transaction.state.log.min.isr"] == "1"
    assert three["transaction.state.log.replication.factor"] == "3"
    assert three["transaction.state.log.min.isr"] == "2"
    assert one["group.initial.rebalance.delay.ms"] == "0"
    assert properties({"a.b": "x\\y", "c": "1"}) == "a.b=x\\\\y\nc=1\n"
    ids = {new_cluster_id() for _ in range(300)}
    assert len(ids) == 300 and all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_kafkas_log_binding_matches_its_log4j_and_slf4j(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned release names its two coordinates without resolving anything (the set `make
    install` fetches); another release's binding is read off its resolved jars: slf4j 1.x gets
    log4j-slf4j-impl, 2.x log4j-slf4j2-impl, at the log4j-core version Kafka brings."""
    from mqd.testing import kafka_cluster

    def no_resolve(specs: object, **kwargs: object) -> list[Path]:
        raise AssertionError("the pinned release must not resolve")

    monkeypatch.setattr(maven, "resolve", no_resolve)
    assert kafka_cluster.kafka_coordinates() == [
        f"org.apache.kafka:kafka_2.13:{kafka_cluster.KAFKA_VERSION}",
        kafka_cluster.LOG_BINDINGS[kafka_cluster.KAFKA_VERSION],
    ]
    for slf4j, binding in (("1.7.36", "log4j-slf4j-impl"), ("2.0.17", "log4j-slf4j2-impl")):
        jars = [
            Path(f"/c/{n}")
            for n in ("kafka_2.13-9.1.0.jar", "log4j-core-2.30.1.jar", f"slf4j-api-{slf4j}.jar")
        ]
        monkeypatch.setattr(maven, "resolve", lambda specs, _jars=jars, **kwargs: _jars)
        assert kafka_cluster.kafka_coordinates("9.1.0") == [
            "org.apache.kafka:kafka_2.13:9.1.0",
            f"org.apache.logging.log4j:{binding}:2.30.1",
        ]
