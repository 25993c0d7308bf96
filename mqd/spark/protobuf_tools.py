"""The tools behind typed Protobuf records (``value_format`` / ``key_format`` = ``protobuf``), each
fetched or built once per machine into ``<mqd cache>/protobuf`` and only when a Protobuf schema id
is met (a job without one never touches them):

- ``protoc`` (com.google.protobuf:protoc, the machine's classifier, type exe) from Maven Central,
  checked against the ``.sha1`` served beside it: the driver compiles each writer schema, with the
  schemas it imports under the names it imports them by, into a FileDescriptorSet
  (:func:`descriptor_set`). A schema protoc refuses is :class:`ProtocError` with protoc's message.
- protobuf-java (Maven Central, through mqd/testing/maven.py's Ivy resolver): the runtime of the
  decoder, and the home of the well-known types' .proto files (google/protobuf/timestamp.proto...),
  which the protoc download lacks: they are unpacked beside it as protoc's include folder.
- The decoder, mqd/spark/jvm/ProtobufDecode.java, compiled with the JDK's javac against pyspark's
  jars and protobuf-java into a jar keyed by the source's hash (:func:`protobuf_jar`).

``python -m mqd.spark.protobuf_tools`` prepares all three (``make install``), offline afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

from mqd.cache import cache_dir
from mqd.errors import MqdError
from mqd.fsutil import atomic_write, locked

PROTOBUF_VERSION = "4.36.2"  # protoc and protobuf-java: one release
PROTOBUF_JAVA = f"com.google.protobuf:protobuf-java:{PROTOBUF_VERSION}"
CENTRAL = "https://repo1.maven.org/maven2"
DOWNLOAD_TIMEOUT = 120.0
PROTOC_TIMEOUT = 60.0
SOURCE = Path(__file__).parent / "jvm" / "ProtobufDecode.java"
DECODE_CLASS = "mqd.spark.ProtobufDecode"
PATH_CLASS = "mqd.spark.ProtobufDecode$Path"


class ProtobufToolError(MqdError):
    """protoc, protobuf-java or the decoder's jar could not be had (no network on first use, no
    javac, an unknown platform). Fails the batch: retried at the job's restart, never a dead letter."""

    retriable = True


class ProtocError(ValueError):
    """protoc refused a schema: the message is protoc's own (its temp folder's paths left out)."""


def tools_dir() -> Path:
    return cache_dir() / "protobuf"


def protoc_classifier() -> str:
    """protoc's Maven classifier for this machine (linux-x86_64, linux-aarch_64, osx-...)."""
    system = {"linux": "linux", "darwin": "osx", "windows": "windows"}.get(platform.system().lower())
    machine = platform.machine().lower()
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch_64", "arm64": "aarch_64"}.get(machine)
    if system is None or arch is None:
        raise ProtobufToolError(f"no protoc build on Maven Central for {platform.system()} {machine}")
    return f"{system}-{arch}"


def protoc_url(repository: str = CENTRAL, version: str = PROTOBUF_VERSION, classifier: str = "") -> str:
    c = classifier or protoc_classifier()
    return f"{repository.rstrip('/')}/com/google/protobuf/protoc/{version}/protoc-{version}-{c}.exe"


def _repository() -> str:
    from mqd.testing.maven import default_repository

    return default_repository() or CENTRAL


def protoc() -> Path:
    """The protoc binary, downloaded and checked against its ``.sha1`` the first time."""
    path = tools_dir() / f"protoc-{PROTOBUF_VERSION}-{protoc_classifier()}.exe"
    if path.is_file():
        return path
    with locked(tools_dir() / "fetch.lock", DOWNLOAD_TIMEOUT * 2):
        if path.is_file():
            return path
        url = protoc_url(_repository())
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as resp:
                data: bytes = resp.read()
            with urllib.request.urlopen(url + ".sha1", timeout=DOWNLOAD_TIMEOUT) as resp:
                expected = resp.read().decode("ascii", "replace").split()
        except urllib.error.HTTPError as exc:
            raise ProtobufToolError(f"{url}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ProtobufToolError(f"cannot download protoc from {url} ({reason})") from None
        actual = hashlib.sha1(data).hexdigest()
        if not expected or expected[0].lower() != actual:
            raise ProtobufToolError(f"{url}: sha1 {actual} is not the published {expected[:1]}")
        atomic_write(path, data)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def protobuf_java() -> list[Path]:
    """protobuf-java's jar (no runtime dependencies of its own)."""
    from mqd.testing.maven import MavenError, resolve

    try:
        return resolve([PROTOBUF_JAVA])
    except MavenError as exc:
        raise ProtobufToolError(str(exc)) from None


def include_dir() -> Path:
    """The well-known types' .proto files (google/protobuf/*.proto), from protobuf-java's jar."""
    out = tools_dir() / f"include-{PROTOBUF_VERSION}"
    if (out / "google" / "protobuf" / "timestamp.proto").is_file():
        return out
    jar = next(j for j in protobuf_java() if "protobuf-java" in j.name)
    tmp = Path(tempfile.mkdtemp(prefix=".include-", dir=tools_dir()))
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.startswith("google/protobuf/") and name.endswith(".proto"):
                z.extract(name, tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _pyspark_jars() -> Path:
    try:
        import pyspark
    except ImportError:
        raise ProtobufToolError("pyspark is not installed: pip install 'mqd[spark]'") from None
    return Path(pyspark.__file__).parent / "jars"


def jar_key() -> str:
    """The decoder jar's key: its source, protobuf-java's version and pyspark's."""
    import pyspark

    text = SOURCE.read_bytes() + f"\n{PROTOBUF_VERSION}\n{pyspark.__version__}".encode()
    return hashlib.sha256(text).hexdigest()[:20]


def protobuf_jar() -> Path:
    """The decoder's jar (mqd/spark/jvm/ProtobufDecode.java compiled by the JDK's javac for Java
    17), built once per source; with :func:`protobuf_java` it is what a session needs."""
    out = tools_dir() / f"mqd-protobuf-decode-{jar_key()}.jar"
    if out.is_file():
        return out
    javac = _javac()
    cp = os.pathsep.join([str(_pyspark_jars() / "*"), *map(str, protobuf_java())])
    with locked(tools_dir() / "compile.lock", 300), tempfile.TemporaryDirectory() as tmp:
        if out.is_file():
            return out
        classes = Path(tmp) / "classes"
        run = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-cp", cp, "-d", str(classes), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if run.returncode != 0:
            raise ProtobufToolError(
                f"javac failed on {SOURCE.name}: {(run.stderr or run.stdout).strip()[:2000]}"
            )
        built = Path(tmp) / out.name
        with zipfile.ZipFile(built, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        atomic_write(out, built.read_bytes())
    return out


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        raise ProtobufToolError("javac not found (a JDK 17 or newer, not only a JRE, is needed for protobuf)")
    return found


def session_jars() -> list[Path]:
    """What a Spark session needs to decode Protobuf: the decoder's jar and protobuf-java."""
    return [protobuf_jar(), *protobuf_java()]


# -- per schema ---------------------------------------------------------------------------------------


def main_file_name(references: Sequence[tuple[str, str]]) -> str:
    """A file name for the writer schema that none of its imports uses."""
    taken = {name for name, _ in references}
    n = 0
    while f"mqd_writer_schema_{n}.proto" in taken:
        n += 1
    return f"mqd_writer_schema_{n}.proto"


def descriptor_set(text: str, references: Sequence[tuple[str, str]]) -> tuple[bytes, str]:
    """(the FileDescriptorSet of ``text`` with its imports, the writer schema's file name in it).
    ``references``: (import name, schema text) of every schema it reaches. ProtocError when
    protoc refuses it. A schema (or import) registered as a base64 FileDescriptorProto, as
    confluent-kafka's Python serializer registers them, is handed to protoc as a descriptor
    (``--descriptor_set_in``) under its name; .proto text and the well-known types are files."""
    from mqd.spark.protobuf_types import file_descriptor_set, serialized_file

    main = main_file_name(references)
    with tempfile.TemporaryDirectory(prefix="mqd-protoc-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        described: list[bytes] = []
        for name, body in [*references, (main, text)]:
            descriptor = serialized_file(body, name)
            if descriptor is not None:
                described.append(descriptor)
                continue
            target = (src / name).resolve()
            if not target.is_relative_to(src.resolve()):
                raise ProtocError(f"import name {name!r} leaves the source folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
        out = Path(tmp) / "set.pb"
        argv = [
            str(protoc()),
            f"-I{src}",
            f"-I{include_dir()}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            main,
        ]
        if described:
            given = Path(tmp) / "given.pb"
            given.write_bytes(file_descriptor_set(described))
            argv.insert(-1, f"--descriptor_set_in={given}")
        run = subprocess.run(
            argv, capture_output=True, text=True, cwd=src, timeout=PROTOC_TIMEOUT, stdin=subprocess.DEVNULL
        )
        if run.returncode != 0 or not out.is_file():
            message = (run.stderr or run.stdout).replace(f"{src}/", "").strip()
            raise ProtocError(message[:1000] or f"protoc exited {run.returncode}")
        return out.read_bytes(), main


def describe(fds: bytes, file_name: str) -> dict[str, object]:
    """The decoder's plan of every message of ``file_name``: ``{"messages": [{"path", "name",
    "type" (Spark's JSON type text, a dict) or None, "error"}]}`` (one JVM start, the driver's)."""
    from mqd.testing.maven import java_binary

    # the decoder implements Spark's UDF interfaces: spark-sql-api's jar is enough to load it
    api = sorted(_pyspark_jars().glob("spark-sql-api_*.jar"))
    cp = os.pathsep.join(str(j) for j in [*session_jars(), *api])
    with tempfile.NamedTemporaryFile(prefix="mqd-fds-", suffix=".pb") as f:
        f.write(fds)
        f.flush()
        run = subprocess.run(
            [
                java_binary(),
                "-Xmx128m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                cp,
                DECODE_CLASS,
                "describe",
                f.name,
                file_name,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    if run.returncode != 0:
        raise ProtobufToolError(f"the Protobuf decoder's describe failed: {run.stderr.strip()[:1000]}")
    found: dict[str, object] = json.loads(run.stdout)
    return found


def prepare() -> list[Path]:
    """Everything fetched and built: protoc, the include folder, protobuf-java, the decoder's jar."""
    return [protoc(), include_dir(), *session_jars()]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m mqd.spark.protobuf_tools",
        description="Fetch protoc and protobuf-java from Maven Central and build the Protobuf "
        "decoder's jar into mqd's cache (what value_format = 'protobuf' needs).",
    )
    parser.parse_args(argv)
    try:
        for p in prepare():
            print(p)
    except MqdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "PROTOBUF_JAVA",
    "PROTOBUF_VERSION",
    "ProtobufToolError",
    "ProtocError",
    "describe",
    "descriptor_set",
    "include_dir",
    "prepare",
    "protobuf_jar",
    "protobuf_java",
    "protoc",
    "session_jars",
]
