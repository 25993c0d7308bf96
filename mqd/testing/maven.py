"""Maven coordinates to local jar files, for a host with Python and Java but without Maven.

Apache Ivy does the resolving (transitive runtime dependencies, checksums, Maven's version rules),
from Maven Central (Ivy's own default repository) or the Maven repository in
``$MQD_MAVEN_REPOSITORY`` (a mirror). Its one jar (no dependencies of its own) is the one pyspark
ships (``mqd[spark]``, in the dev extra), or, from a mirror, downloaded with urllib once and checked
against the ``.sha1`` served beside it; it runs as ``java -cp ivy.jar org.apache.ivy.Main``.
Everything lives under :func:`maven_dir` (``<mqd cache>/maven``): Ivy's cache of the resolved jars
and one classpath file per set of coordinates, so a second use of the same coordinates starts no
JVM and touches no network::

    from mqd.testing.maven import classpath

    cp = classpath(["org.apache.kafka:kafka_2.13:4.4.0"])  # "/.../kafka_2.13-4.4.0.jar:/.../..."

From a shell (``make install`` pre-fetches so), the classpath is printed::

    python -m mqd.testing.maven org.apache.kafka:kafka_2.13:4.4.0 org.slf4j:slf4j-simple:1.7.36
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from mqd.cache import cache_dir
from mqd.errors import MqdError
from mqd.fsutil import LockTimeout, atomic_write, locked

# None: Maven Central, as Ivy's ibiblio resolver knows it (its default root); else a mirror's URL
Repository = str | None
REPOSITORY_ENV = "MQD_MAVEN_REPOSITORY"
IVY_VERSION = "2.5.3"
RESOLVE_TIMEOUT = 600.0  # Ivy's whole run: Kafka's first download is ~45 MB
DOWNLOAD_TIMEOUT = 60.0  # one urllib request (connect or a read)
_NETWORK_HINT = (
    "the first use needs network to Maven Central (or $MQD_MAVEN_REPOSITORY); later uses are offline"
)
# what Ivy prints when it could not connect (rather than: the artifact is not there)
_NETWORK_SIGNS = ("UnknownHost", "Host ", "Connection refused", "Network is unreachable", "connect timed out")


def default_repository() -> Repository:
    """``$MQD_MAVEN_REPOSITORY`` when set (a mirror), else None: Maven Central."""
    return os.environ.get(REPOSITORY_ENV) or None


def _name(repository: Repository) -> str:
    return repository or "Maven Central"


class MavenError(MqdError):
    """Jars could not be had: no java, Maven Central out of reach, or a coordinate that does not
    resolve. The message is one line that says which."""


@dataclass(frozen=True, order=True)
class Coordinate:
    """A Maven artifact: ``group:artifact:version``."""

    group: str
    artifact: str
    version: str

    @classmethod
    def parse(cls, text: str) -> Coordinate:
        parts = text.strip().split(":")
        if len(parts) != 3 or not all(p and p.strip() == p and "/" not in p for p in parts):
            raise MavenError(f"not a Maven coordinate group:artifact:version: {text!r}")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    def url(self, repository: str, ext: str = "jar") -> str:
        """Where ``repository`` (Maven's layout) serves this artifact's ``ext`` file."""
        folder = f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}"
        return f"{repository.rstrip('/')}/{folder}/{self.artifact}-{self.version}.{ext}"


IVY = Coordinate("org.apache.ivy", "ivy", IVY_VERSION)


def maven_dir() -> Path:
    """Where the jars and classpaths are kept: ``<cache_dir()>/maven``."""
    return cache_dir() / "maven"


def coordinates(specs: Iterable[str | Coordinate]) -> list[Coordinate]:
    """Parsed, duplicates dropped, sorted: one set of coordinates has one spelling."""
    return sorted({s if isinstance(s, Coordinate) else Coordinate.parse(s) for s in specs})


def classpath_key(coords: Sequence[Coordinate], repository: Repository = None) -> str:
    """The name of a coordinate set's classpath file: the same set in any order gives the same key."""
    text = "\n".join([(repository or "central").rstrip("/"), *map(str, coordinates(coords))])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def read_classpath(path: Path) -> list[Path] | None:
    """The jars a classpath file lists, or None when the file is missing or unreadable or one of its
    jars is gone (a cleaned cache): then the set is resolved again."""
    try:
        data = json.loads(path.read_text())
        jars = [Path(p) for p in data["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not jars or not all(j.is_file() for j in jars):
        return None
    return jars


def ivy_module_xml(coords: Sequence[Coordinate], name: str) -> str:
    """An Ivy module that depends on ``coords``, each with its runtime dependencies (Maven's
    ``compile`` and ``runtime`` scopes: Ivy's ``default`` configuration of a Maven module)."""
    deps = "\n".join(
        f"    <dependency org={quoteattr(c.group)} name={quoteattr(c.artifact)} rev={quoteattr(c.version)}"
        ' conf="default->default"/>'
        for c in coords
    )
    return (
        '<ivy-module version="2.0">\n'
        f'  <info organisation="mqd" module={quoteattr(name)}/>\n'
        f"  <dependencies>\n{deps}\n  </dependencies>\n</ivy-module>\n"
    )


def ivy_settings_xml(cache: Path, repository: Repository = None) -> str:
    """Ivy settings: one Maven repository, Ivy's cache in ``cache`` (never ``~/.ivy2``)."""
    root = f" root={quoteattr(repository.rstrip('/') + '/')}" if repository else ""
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="central"/>\n'
        f'  <caches defaultCacheDir={quoteattr(str(cache))} useOrigin="false"/>\n'
        "  <resolvers>\n"
        f'    <ibiblio name="central" m2compatible="true"{root}/>\n'
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` when there is one, else ``java`` on PATH; MavenError when neither."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise MavenError("java not found (no $JAVA_HOME/bin/java, no java on PATH): install Java 17 or newer")
    return found


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        data: bytes = resp.read()
        return data


def _unreachable(repository: Repository, exc: BaseException | str) -> MavenError:
    reason = getattr(exc, "reason", None) or exc
    return MavenError(f"cannot reach {_name(repository)} ({reason}): {_NETWORK_HINT}", retriable=True)


def _pyspark_ivy() -> Path | None:
    """The Ivy jar pyspark ships (Spark resolves its packages with it), if pyspark is installed."""
    try:
        import pyspark
    except ImportError:
        return None
    return next(iter(sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))), None)


def ivy_jar(repository: Repository = None, timeout: float = DOWNLOAD_TIMEOUT) -> Path:
    """Ivy's jar: pyspark's, else one in :func:`maven_dir` downloaded from a mirror and checked
    against its ``.sha1`` the first time."""
    path = maven_dir() / f"ivy-{IVY.version}.jar"
    if path.is_file():
        return path
    bundled = _pyspark_ivy()
    if bundled is not None:
        return bundled
    if repository is None:
        raise MavenError(
            "no Apache Ivy jar: install pyspark (pip install 'mqd[spark]'), which ships it, or set "
            f"${REPOSITORY_ENV} to a Maven repository to download it from"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = _get(IVY.url(repository), timeout)
        expected = _get(IVY.url(repository, "jar.sha1"), timeout).decode("ascii", "replace").split()
    except urllib.error.HTTPError as exc:
        raise MavenError(f"{IVY.url(repository)}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise _unreachable(repository, exc) from None
    actual = hashlib.sha1(data).hexdigest()
    if not expected or expected[0].lower() != actual:
        raise MavenError(f"{IVY.url(repository)}: sha1 {actual} is not the published {expected[:1]}")
    atomic_write(path, data)
    return path


def _network_failure(output: str) -> str | None:
    """Ivy's line saying it could not connect, if its output has one."""
    for line in output.splitlines():
        if any(sign in line for sign in _NETWORK_SIGNS) and ("found" in line or "Exception" in line):
            return line.strip()[:300]
    return None


def _unresolved(output: str) -> list[str]:
    """Ivy's "UNRESOLVED DEPENDENCIES" lines: ``:: org#name;version: not found``."""
    return [
        line.strip(" \t:") for line in output.splitlines() if line.strip().startswith("::") and ";" in line
    ]


def _run_ivy(coords: list[Coordinate], key: str, repository: Repository, timeout: float) -> list[Path]:
    work = maven_dir() / "resolve" / key
    work.mkdir(parents=True, exist_ok=True)
    (work / "ivysettings.xml").write_text(ivy_settings_xml(maven_dir() / "ivy-cache", repository))
    (work / "ivy.xml").write_text(ivy_module_xml(coords, f"resolve-{key}"))
    out_file = work / "classpath.txt"
    out_file.unlink(missing_ok=True)
    argv = [
        java_binary(),
        "-Xmx256m",
        "-cp",
        str(ivy_jar(repository)),
        "org.apache.ivy.Main",
        "-settings",
        str(work / "ivysettings.xml"),
        "-ivy",
        str(work / "ivy.xml"),
        "-confs",
        "default",
        "-cachepath",
        str(out_file),
        "-warn",
    ]
    what = ", ".join(map(str, coords))
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise MavenError(f"resolving {what} did not finish within {timeout:.0f}s", retriable=True) from None
    output = run.stdout + run.stderr
    text = out_file.read_text().strip() if out_file.is_file() else ""
    if run.returncode == 0 and text:
        return [Path(p) for p in text.split(os.pathsep) if p]
    why = _network_failure(output)
    if why is not None:
        raise _unreachable(repository, why)
    missing = _unresolved(output)
    if missing:
        raise MavenError(f"does not resolve from {_name(repository)}: {'; '.join(missing)}")
    last = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "no output")
    raise MavenError(f"Ivy failed ({run.returncode}) resolving {what}: {last.strip()}")


def resolve(
    specs: Iterable[str | Coordinate], *, repository: Repository = None, timeout: float = RESOLVE_TIMEOUT
) -> list[Path]:
    """The jars of ``specs`` (``group:artifact:version``) and of their runtime dependencies, in
    Ivy's order. From the classpath file when one lists only jars that exist; else Ivy resolves
    (under a lock, so two processes never resolve at once) and the file is written."""
    coords = coordinates(specs)
    if not coords:
        raise MavenError("no Maven coordinates given")
    repository = repository or default_repository()
    key = classpath_key(coords, repository)
    cp_file = maven_dir() / "classpaths" / f"{key}.json"
    jars = read_classpath(cp_file)
    if jars is not None:
        return jars
    try:
        with locked(maven_dir() / "resolve.lock", timeout):
            jars = read_classpath(cp_file)  # another process may have resolved it meanwhile
            if jars is None:
                jars = _run_ivy(coords, key, repository, timeout)
                cp_file.parent.mkdir(parents=True, exist_ok=True)
                record = {"coordinates": [str(c) for c in coords], "repository": repository}
                atomic_write(cp_file, json.dumps({**record, "jars": [str(j) for j in jars]}).encode())
    except LockTimeout:
        raise MavenError(
            f"another process held {maven_dir() / 'resolve.lock'} for {timeout:.0f}s", retriable=True
        ) from None
    return jars


def classpath(
    specs: Iterable[str | Coordinate], *, repository: Repository = None, timeout: float = RESOLVE_TIMEOUT
) -> str:
    """:func:`resolve`'s jars joined for ``java -cp``."""
    return os.pathsep.join(map(str, resolve(specs, repository=repository, timeout=timeout)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mqd.testing.maven",
        description="Resolve Maven coordinates (with their runtime dependencies) into mqd's cache "
        "and print the classpath.",
    )
    parser.add_argument("coordinates", nargs="+", metavar="GROUP:ARTIFACT:VERSION")
    parser.add_argument(
        "--repository",
        default=None,
        help=f"a Maven repository (default: ${REPOSITORY_ENV}, else Maven Central)",
    )
    parser.add_argument(
        "--timeout", type=float, default=RESOLVE_TIMEOUT, help="seconds (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    try:
        print(classpath(args.coordinates, repository=args.repository, timeout=args.timeout))
    except MavenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
