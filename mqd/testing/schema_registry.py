"""A real schema registry on 127.0.0.1 for tests: Apicurio Registry, speaking Confluent's REST API.

:class:`SchemaRegistry` starts Apicurio Registry 2.4.2.Final (in-memory storage, Confluent's API at
``/apis/ccompat/v7``, global compatibility NONE) on a free 127.0.0.1 port, with its log under a
folder you give it::

    with SchemaRegistry(tmp_path) as registry:
        schema_id = registry.register("orders-value", avro_schema_text)
        ...  # [spark.schema_registry] url = registry.url

Why Apicurio: no Confluent Schema Registry, Karapace or Redpanda build can be had from the package
registries this project reaches, while Maven Central serves Apicurio's server as a Quarkus
application in parts (its classes, its dependency list). The pom kept beside this module
(``mqd/testing/apicurio/pom.xml``, package data) assembles them with ``quarkus-maven-plugin``; the
build runs once per machine and is kept in mqd's cache (``<cache>/schema-registry/<key>/``, the key
a hash of the pom, the Maven settings and the Maven arguments), so later starts run a JVM on the
built application and touch no network. Maven is the ``mvn`` on PATH, or else Apache Maven's own
binary distribution fetched from Maven Central (checked against its ``.sha1``) into
``<cache>/maven/``. Every Maven download comes from Maven Central, or from ``$MQD_MAVEN_REPOSITORY``
(a mirror): the settings file mirrors every repository there.

Prepare ahead (the first build downloads ~200 MB)::

    python -m mqd.testing.schema_registry --prepare

Measured on the 2-core test machine: a cold build (empty Maven repository, Maven 3.9.16 fetched)
73 s wall, 42 s CPU; again with the Maven repository warm (another cache key) 23 s. It leaves
~230 MB in ``<cache>/maven/repository`` and the 131 MB application. A warm start, JVM spawn to
``/health/ready``, 2.2-3.1 s at load 4 (C1 only and the serial GC); a stop 0.25 s.

One ``python -m mqd.testing.schema_registry --serve DIR`` runs one by hand until Ctrl-C.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from mqd.cache import cache_dir
from mqd.errors import MqdError
from mqd.fsutil import LockTimeout, atomic_write, locked
from mqd.testing.cluster import free_port
from mqd.testing.process import STOP_TIMEOUT, ManagedProcess

# mqd.testing.maven is imported where it is used (as kafka_cluster does): `python -m` of it must
# not find it imported before it runs

APICURIO_VERSION = "2.4.2.Final"
MAVEN_VERSION = "3.9.16"  # Apache Maven's binary distribution, fetched only when there is no `mvn`
CENTRAL = "https://repo.maven.apache.org/maven2"
CCOMPAT_PATH = "/apis/ccompat/v7"
BUILD_TIMEOUT = 1800.0  # Maven's whole run, downloads included
DOWNLOAD_TIMEOUT = 60.0  # one urllib request of the Maven distribution
START_TIMEOUT = 90.0  # a warm start takes ~5 s; a loaded 2-core machine, far longer
REQUEST_TIMEOUT = 30.0  # one admin request (register, set_compatibility)

# The Maven run: batch mode, no download progress lines, no tests. The application is packaged as
# Quarkus' fast-jar (quarkus-app/quarkus-run.jar: an indexed class loader, the faster start);
# Apicurio's own properties ask for the legacy runner jar (%prod profile), which the command line
# overrides. Part of the cache key.
MAVEN_ARGS = (
    "--batch-mode",
    "--no-transfer-progress",
    "-DskipTests",
    "-D%prod.quarkus.package.type=fast-jar",
    "-Dquarkus.package.type=fast-jar",
    "package",
)

# A test registry's JVM: small heap, the serial GC and C1 only (a start matters more than speed)
JVM_FLAGS = (
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

_NETWORK_SIGNS = (
    "UnknownHost",
    "Unknown host",
    "Connection refused",
    "Network is unreachable",
    "connect timed out",
    "Connect timed out",
    "No route to host",
    "Temporary failure in name resolution",
)


class SchemaRegistryBuildError(MqdError):
    """The registry could not be built: no Java, Maven Central out of reach, or Maven failed. The
    message says which and names the build log."""


class RegistryRequestError(MqdError):
    """The test registry refused an admin request (register, set_compatibility): its HTTP status
    and the registry's error message."""

    def __init__(self, message: str, status: int, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


# -- the build ---------------------------------------------------------------------------------------


def registry_cache() -> Path:
    """Where builds live: ``<mqd cache>/schema-registry``."""
    return cache_dir() / "schema-registry"


def pom_xml() -> bytes:
    """The build's pom (package data beside this module)."""
    try:
        return resources.files("mqd.testing").joinpath("apicurio/pom.xml").read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise SchemaRegistryBuildError(
            f"mqd/testing/apicurio/pom.xml is missing from this install of mqd ({exc}): "
            "an installed wheel must ship it as package data"
        ) from None


def settings_xml(repository: str) -> str:
    """Maven settings that send every repository's requests to ``repository`` (Apicurio's and
    Quarkus' poms name others: JBoss, Confluent, JitPack, which this build must not need)."""
    url = repository.rstrip("/")
    return (
        "<settings>\n"
        "  <mirrors>\n"
        "    <mirror>\n"
        "      <id>mqd-central</id>\n"
        "      <mirrorOf>*</mirrorOf>\n"
        f"      <url>{url}</url>\n"
        "    </mirror>\n"
        "  </mirrors>\n"
        "</settings>\n"
    )


def _repository() -> str:
    from mqd.testing.maven import default_repository

    return default_repository() or CENTRAL


def build_key(repository: str | None = None) -> str:
    """The build's cache key: a hash of everything that decides what it builds."""
    text = b"\n--\n".join(
        [pom_xml(), settings_xml(repository or _repository()).encode(), "\n".join(MAVEN_ARGS).encode()]
    )
    return hashlib.sha256(text).hexdigest()[:16]


def _runner(build_dir: Path) -> Path | None:
    """The built application's jar, when the build at ``build_dir`` is complete."""
    try:
        data = json.loads((build_dir / "app.json").read_text())
        jar = build_dir / str(data["runner"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return jar if jar.is_file() else None


def prepared(repository: str | None = None) -> Path | None:
    """The runnable jar of a finished build of the current inputs, None before the first build."""
    return _runner(registry_cache() / build_key(repository))


def _java_home() -> tuple[str, str]:
    """(java binary, JAVA_HOME for Maven) from ``$JAVA_HOME`` or the ``java`` on PATH."""
    from mqd.testing.maven import MavenError, java_binary

    try:
        java = java_binary()
    except MavenError as exc:
        raise SchemaRegistryBuildError(f"the test schema registry runs on Java: {exc}") from None
    home = os.environ.get("JAVA_HOME") or str(Path(os.path.realpath(java)).parent.parent)
    return java, home


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data: bytes = resp.read()
            return data
    except urllib.error.HTTPError as exc:
        raise SchemaRegistryBuildError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise SchemaRegistryBuildError(
            f"cannot reach {url} ({reason}): building the test schema registry needs network to "
            "Maven Central (or $MQD_MAVEN_REPOSITORY) once; later uses are offline",
            retriable=True,
        ) from None


def maven_distribution(repository: str | None = None, timeout: float = DOWNLOAD_TIMEOUT) -> Path:
    """``bin/mvn`` of Apache Maven :data:`MAVEN_VERSION`, fetched once from Maven Central
    (``org.apache.maven:apache-maven:<version>:bin@tar.gz``) into ``<cache>/maven/`` and checked
    against the ``.sha1`` served beside it."""
    from mqd.testing.maven import Coordinate, maven_dir

    home = maven_dir() / f"apache-maven-{MAVEN_VERSION}"
    mvn = home / "bin" / "mvn"
    if mvn.is_file():
        return mvn
    repository = repository or _repository()
    coord = Coordinate("org.apache.maven", "apache-maven", MAVEN_VERSION)
    url = coord.url(repository, "tar.gz").removesuffix(".tar.gz") + "-bin.tar.gz"
    with locked(maven_dir() / "apache-maven.lock", BUILD_TIMEOUT):
        if mvn.is_file():
            return mvn
        data = _download(url, timeout)
        published = _download(url + ".sha1", timeout).decode("ascii", "replace").split()
        actual = hashlib.sha1(data).hexdigest()
        if not published or published[0].lower() != actual:
            raise SchemaRegistryBuildError(f"{url}: sha1 {actual} is not the published {published[:1]}")
        staging = maven_dir() / f".apache-maven-{MAVEN_VERSION}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        archive = staging / "dist.tar.gz"
        archive.write_bytes(data)
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        archive.unlink()
        (top,) = [p for p in staging.iterdir() if p.is_dir()]
        os.replace(top, home)
        shutil.rmtree(staging, ignore_errors=True)
    return mvn


def maven_command(*, fetch: bool = False, repository: str | None = None) -> str:
    """The ``mvn`` to build with: the one on PATH, else (or with ``fetch``) :func:`maven_distribution`."""
    found = None if fetch else shutil.which("mvn")
    return found or str(maven_distribution(repository))


def _maven_failure(log: Path, repository: str) -> SchemaRegistryBuildError:
    text = log.read_text(errors="replace") if log.is_file() else ""
    errors = [ln.strip() for ln in text.splitlines() if ln.startswith("[ERROR]") and ln.strip() != "[ERROR]"]
    for line in errors:
        sign = next((s for s in _NETWORK_SIGNS if s in line), None)
        if sign is None:
            continue
        what = line[line.find("Could not transfer") :] if "Could not transfer" in line else line
        return SchemaRegistryBuildError(
            f"cannot reach {repository} ({sign}): building the test schema registry needs network to "
            f"Maven Central or $MQD_MAVEN_REPOSITORY once; Maven said: {what[:240]} (log: {log})",
            retriable=True,
        )
    first = "; ".join(errors[:3]) or (text.strip().splitlines() or ["no output"])[-1]
    return SchemaRegistryBuildError(
        f"Maven failed building the test schema registry: {first[:800]} (log: {log})"
    )


def prepare(
    *,
    fetch_maven: bool = False,
    repository: str | None = None,
    timeout: float = BUILD_TIMEOUT,
    quiet: bool = True,
) -> Path:
    """The runnable jar of Apicurio Registry, built first when this machine has no build of the
    current inputs (under a lock: two processes never build at once; the second waits and uses the
    first one's build). ``fetch_maven``: build with the Maven fetched from Maven Central even where
    ``mvn`` is on PATH. ``quiet=False`` says on stderr what it is doing."""
    repository = repository or _repository()
    key = build_key(repository)
    build_dir = registry_cache() / key
    jar = _runner(build_dir)
    if jar is not None:
        return jar
    _, java_home = _java_home()
    try:
        with locked(registry_cache() / "build.lock", timeout):
            jar = _runner(build_dir)
            if jar is None:
                jar = _build(build_dir, repository, java_home, fetch_maven, timeout, quiet)
    except LockTimeout:
        raise SchemaRegistryBuildError(
            f"another process held {registry_cache() / 'build.lock'} for {timeout:.0f}s", retriable=True
        ) from None
    return jar


def _build(
    build_dir: Path, repository: str, java_home: str, fetch_maven: bool, timeout: float, quiet: bool
) -> Path:
    from mqd.testing.maven import maven_dir

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    started = time.monotonic()
    mvn = maven_command(fetch=fetch_maven, repository=repository)
    work = build_dir / "build"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(build_dir / "app", ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_bytes(pom_xml())
    (work / "settings.xml").write_text(settings_xml(repository))
    log = build_dir / "build.log"
    argv = [
        mvn,
        "-s",
        str(work / "settings.xml"),
        f"-Dmaven.repo.local={maven_dir() / 'repository'}",
        *MAVEN_ARGS,
    ]
    env = {**os.environ, "JAVA_HOME": java_home, "MAVEN_OPTS": os.environ.get("MAVEN_OPTS", "-Xmx1g")}
    say(f"building Apicurio Registry {APICURIO_VERSION} with {mvn} (log: {log})")
    with open(log, "wb") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            run = subprocess.run(
                argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SchemaRegistryBuildError(
                f"building the test schema registry did not finish within {timeout:.0f}s (log: {log})",
                retriable=True,
            ) from None
    if run.returncode != 0:
        raise _maven_failure(log, repository)
    app = work / "target" / "quarkus-app"
    if not (app / "quarkus-run.jar").is_file():
        raise SchemaRegistryBuildError(f"Maven built no target/quarkus-app/quarkus-run.jar (log: {log})")
    os.replace(app, build_dir / "app")
    shutil.rmtree(work, ignore_errors=True)  # target/ holds the classes and jars twice more
    elapsed = time.monotonic() - started
    record = {"runner": "app/quarkus-run.jar", "apicurio": APICURIO_VERSION, "mvn": mvn, "seconds": elapsed}
    atomic_write(build_dir / "app.json", json.dumps(record).encode())
    say(f"built in {elapsed:.0f}s: {build_dir / 'app'}")
    return build_dir / "app" / "quarkus-run.jar"


# -- the server ----------------------------------------------------------------------------------


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class SchemaRegistry:
    """One Apicurio Registry process on a free 127.0.0.1 port, in-memory storage (everything
    registered is gone when it stops). ``root`` holds its log (``registry.log``).

    ``url`` is Confluent's API (``http://127.0.0.1:<port>/apis/ccompat/v7``), what a client's
    ``[spark.schema_registry] url`` takes. ``stop()`` and ``kill()`` may be called any number of
    times; a ``with`` block that raises prints the end of the log to stderr.
    """

    def __init__(
        self,
        root: Path,
        *,
        heap: str = "512m",
        start_timeout: float = START_TIMEOUT,
        build_timeout: float = BUILD_TIMEOUT,
    ) -> None:
        self.root = Path(root)
        self.heap = heap
        self.start_timeout = start_timeout
        self.build_timeout = build_timeout
        self.port: int | None = None
        self.start_seconds: float | None = None  # the last start, JVM spawn to ready
        self._proc: ManagedProcess | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``: the server's root (health at ``/health/ready``)."""
        if self.port is None:
            raise MqdError("the schema registry has not been started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """Confluent's REST API of this registry."""
        return self.base_url + CCOMPAT_PATH

    @property
    def log_path(self) -> Path:
        return self.root / "registry.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def process(self) -> ManagedProcess | None:
        """The registry's process (None before start): freeze it with SIGSTOP, read its pid."""
        return self._proc

    def start(self) -> SchemaRegistry:
        """Build once if needed (:func:`prepare`), then start the JVM and wait until it is ready."""
        if self.running:
            return self
        jar = prepare(timeout=self.build_timeout)
        java, _ = _java_home()
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [
            java,
            f"-Xmx{self.heap}",
            *JVM_FLAGS,
            "-Dquarkus.http.host=127.0.0.1",
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.log.console.color=false",
            "-jar",
            str(jar),
        ]
        self._proc = ManagedProcess(
            "schema-registry", argv, self.log_path, cwd=self.root, die_with_parent=True
        )
        began = time.monotonic()
        self._proc.start()
        try:
            self._proc.wait_ready(
                lambda: _ready(self.base_url + "/health/ready"), self.start_timeout, interval=0.1
            )
        except BaseException:
            self.kill()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, SIGKILL after ``timeout``; nothing when not running."""
        if self._proc is not None:
            self._proc.stop(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL and reap; nothing when not running."""
        if self._proc is not None:
            self._proc.kill_now()

    def dump_logs(self, lines: int = 60) -> str:
        """The end of the registry's log."""
        tail = self._proc.tail(lines) if self._proc is not None else ""
        return f"--- schema-registry ({self.log_path}) ---\n{tail}"

    def __enter__(self) -> SchemaRegistry:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            print(self.dump_logs(), file=sys.stderr)
        self.stop()

    # -- admin helpers ------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One request to Confluent's API (``path`` below ``/apis/ccompat/v7``); the answer's JSON.
        RegistryRequestError on an HTTP error, with the registry's message."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/vnd.schemaregistry.v1+json, application/json")
        if data is not None:
            req.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                answer: Any = json.loads(raw)
            except ValueError:
                answer = raw.decode(errors="replace")
            message = answer.get("message") if isinstance(answer, dict) else answer
            raise RegistryRequestError(
                f"{method} {path}: HTTP {exc.code}: {message}", exc.code, answer
            ) from None
        return json.loads(raw) if raw else None

    def register(
        self,
        subject: str,
        schema: str,
        schema_type: str = "AVRO",
        references: Iterable[tuple[str, str, int]] = (),
    ) -> int:
        """Register ``schema`` (its text) under ``subject`` as its next version; its global id.
        ``references``: (name, subject, version) of the schemas it refers to (a Protobuf import
        path, an Avro type's full name, a JSON Schema ``$ref``), registered before."""
        body: dict[str, Any] = {"schema": schema, "schemaType": schema_type}
        refs = [{"name": n, "subject": s, "version": v} for n, s, v in references]
        if refs:
            body["references"] = refs
        answer = self.request("POST", f"/subjects/{_segment(subject)}/versions", body)
        return int(answer["id"])

    def set_compatibility(self, subject: str | None, level: str) -> None:
        """The compatibility level (``BACKWARD``, ``FULL``, ``NONE``, ...) of ``subject``, or the
        global default with None."""
        path = "/config" if subject is None else f"/config/{_segment(subject)}"
        self.request("PUT", path, {"compatibility": level})


def _segment(text: str) -> str:
    return urllib.parse.quote(text, safe="")


# -- command line ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqd.testing.schema_registry",
        description="Build the test schema registry (Apicurio Registry from Maven Central) into mqd's "
        "cache, or start one on 127.0.0.1 until interrupted.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prepare", action="store_true", help="build once (no-op when built) and exit")
    what.add_argument("--serve", type=Path, metavar="DIR", help="start one (its log in DIR) until Ctrl-C")
    parser.add_argument("--fetch-maven", action="store_true", help="build with Maven from Maven Central")
    parser.add_argument("--timeout", type=float, default=BUILD_TIMEOUT, help="seconds (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.prepare:
            started = time.monotonic()
            jar = prepare(fetch_maven=args.fetch_maven, timeout=args.timeout, quiet=False)
            print(f"{jar} ({time.monotonic() - started:.1f}s)")
            return 0
        with SchemaRegistry(args.serve, build_timeout=args.timeout) as registry:
            print(f"{registry.url} (ready in {registry.start_seconds:.1f}s; Ctrl-C stops it)", flush=True)
            try:
                while registry.running:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                return 0
            print(f"error: the registry exited with {registry.process and registry.process.returncode}")
            return 1
    except MqdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
