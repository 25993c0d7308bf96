"""A throw-away certificate authority and a server certificate signed by it, for TLS in tests.

:func:`generate_certificates` makes, in a folder of its own: ``ca.pem`` (the CA's certificate: what
a client trusts), ``server.pem`` (a PEM keystore: the server's encrypted PKCS#8 key, its certificate
and the CA's, as Kafka reads with ``ssl.keystore.type=PEM`` and OpenSSL with ``load_cert_chain``)
and ``keys.p12`` (both keys, the CA's only there). The server certificate names ``localhost`` and
``127.0.0.1`` (or the given hosts) and is valid for a month from an hour ago.

The keys and signatures come from Java's ``keytool`` (the JVM the Kafka brokers need anyway; the
venv has no ``cryptography``): two runs of about 0.3-1 s each, the second making the server's key
and certificate signed by the CA (``-signer``, Java 17+). keytool cannot write a private key as PEM,
so the PEM files are taken out of its PKCS#12 file by :func:`pkcs12_bags`, which is why keytool is
told to leave the certificates unencrypted there (``keystore.pkcs12.certProtectionAlgorithm=NONE``);
the key bag is already an EncryptedPrivateKeyInfo, which is what an ``ENCRYPTED PRIVATE KEY`` PEM
block holds, so it is copied as it is, encrypted with PBE-SHA1-3DES (:data:`KEY_PROTECTION`), which
both Java 17's PEM reading and OpenSSL decrypt.

Test keys only: EC P-256, random passwords, files readable by the user only.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import subprocess
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOSTS = ("localhost", "127.0.0.1")
VALIDITY_DAYS = 31
KEYTOOL_TIMEOUT = 60.0  # a JVM start on a loaded 2-core machine takes ~1 s; far more is a hang
# a keytool run is short: the JIT and GC settings that start a JVM fastest
KEYTOOL_JVM_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto")
KEY_PROTECTION = "PBEWithSHA1AndDESede"  # test keys: what Java and OpenSSL both decrypt, not strength
_PASSWORD_ENV = "MQD_TEST_KEYSTORE_PASSWORD"  # keytool reads it from there, not from its argv

CA_ALIAS = "ca"
SERVER_ALIAS = "server"

# PKCS#12 (RFC 7292) and PKCS#7 object identifiers that pkcs12_bags reads
OID_DATA = "1.2.840.113549.1.7.1"
OID_ENCRYPTED_DATA = "1.2.840.113549.1.7.6"
OID_KEY_BAG = "1.2.840.113549.1.12.10.1.1"
OID_SHROUDED_KEY_BAG = "1.2.840.113549.1.12.10.1.2"
OID_CERT_BAG = "1.2.840.113549.1.12.10.1.3"
OID_X509_CERTIFICATE = "1.2.840.113549.1.9.22.1"
OID_FRIENDLY_NAME = "1.2.840.113549.1.9.20"

TAG_INTEGER = 0x02
TAG_OCTET_STRING = 0x04
TAG_OID = 0x06
TAG_BMP_STRING = 0x1E
TAG_SEQUENCE = 0x30
TAG_SET = 0x31
TAG_EXPLICIT_0 = 0xA0


class CertificateError(RuntimeError):
    """keytool failed, or its PKCS#12 file does not hold what it should."""


@dataclass(frozen=True)
class Certificates:
    """What :func:`generate_certificates` wrote.

    - ``ca_file``: the CA's certificate (PEM), a client's trust store (``ssl.ca.location``,
      ``tls_ca_file``, ``cafile=``).
    - ``keystore_file``: the server's key (encrypted PKCS#8), its certificate and the CA's (PEM).
    - ``key_password``: decrypts the key (Kafka's ``ssl.key.password``; also ``keys.p12``'s password).
    - ``hosts``: the DNS names and IP addresses the server certificate is valid for.
    """

    ca_file: Path
    keystore_file: Path
    key_password: str
    hosts: tuple[str, ...]


def generate_certificates(
    directory: Path,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    *,
    java: str = "java",
    ca_name: str = "mqd test CA",
    password: str | None = None,
    timeout: float = KEYTOOL_TIMEOUT,
) -> Certificates:
    """A new CA and a server certificate for ``hosts`` signed by it, written under ``directory``
    (created; files already there are replaced). ``java``: the JVM whose keytool runs;
    ``password``: the key password (default: a random one), known ahead so that a server's config
    can be written while the keys are made."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    store = directory / "keys.p12"
    store.unlink(missing_ok=True)  # keytool would add to an old store, with another password
    password = password or secrets.token_urlsafe(18)
    keytool = _Keytool(java, store, password, directory / "keytool.log", timeout)
    keytool.run(
        "-genkeypair",
        "-alias",
        CA_ALIAS,
        "-dname",
        f"CN={_dn_value(ca_name)}",
        "-ext",
        "bc:c=ca:true,pathlen:0",
        "-ext",
        "ku:c=keyCertSign,cRLSign",
    )
    keytool.run(
        "-genkeypair",
        "-alias",
        SERVER_ALIAS,
        "-signer",
        CA_ALIAS,
        "-dname",
        f"CN={_dn_value(hosts[0])}",
        "-ext",
        f"san={subject_alt_names(hosts)}",
        "-ext",
        "ku:c=digitalSignature",
        "-ext",
        "eku=serverAuth,clientAuth",
    )
    bags = pkcs12_bags(store.read_bytes())
    ca_cert = _one(bags, OID_CERT_BAG, CA_ALIAS)
    server_cert = _one(bags, OID_CERT_BAG, SERVER_ALIAS)
    server_key = _one(bags, OID_SHROUDED_KEY_BAG, SERVER_ALIAS)
    ca_file = directory / "ca.pem"
    keystore_file = directory / "server.pem"
    _write_private(ca_file, pem("CERTIFICATE", ca_cert))
    _write_private(
        keystore_file,
        pem("ENCRYPTED PRIVATE KEY", server_key)
        + pem("CERTIFICATE", server_cert)
        + pem("CERTIFICATE", ca_cert),
    )
    return Certificates(ca_file, keystore_file, password, tuple(hosts))


class _Keytool:
    def __init__(self, java: str, store: Path, password: str, log: Path, timeout: float) -> None:
        self.java = java
        self.store = store
        self.password = password
        self.log = log
        self.timeout = timeout

    def run(self, *args: str) -> None:
        argv = [
            self.java,
            *KEYTOOL_JVM_FLAGS,
            "-Dkeystore.pkcs12.certProtectionAlgorithm=NONE",
            # Kafka decrypts a PEM key with the SecretKeyFactory its EncryptedPrivateKeyInfo names:
            # Java 17 names keytool's default (PBES2 with AES) "PBES2", for which there is none
            f"-Dkeystore.pkcs12.keyProtectionAlgorithm={KEY_PROTECTION}",
            "-m",
            "java.base/sun.security.tools.keytool.Main",
            *args,
            "-keyalg",
            "EC",
            "-groupname",
            "secp256r1",
            # an hour back: a server whose clock is a little behind still accepts it
            "-startdate",
            "-1H",
            "-validity",
            str(VALIDITY_DAYS),
            "-keystore",
            str(self.store),
            "-storetype",
            "PKCS12",
            "-storepass:env",
            _PASSWORD_ENV,
        ]
        env = {**os.environ, _PASSWORD_ENV: self.password}
        try:
            done = subprocess.run(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CertificateError(f"keytool {args[0]} did not finish within {self.timeout:.0f} s") from exc
        except OSError as exc:
            raise CertificateError(f"cannot run keytool ({self.java}): {exc}") from exc
        output = (done.stdout + done.stderr).decode(errors="replace")
        with self.log.open("a") as f:
            f.write(f"$ keytool {' '.join(args)}\n{output}\n")
        if done.returncode != 0:
            raise CertificateError(f"keytool {args[0]} failed ({done.returncode}): {output.strip()[-2000:]}")


def _dn_value(text: str) -> str:
    # RFC 4514 escapes; keytool's -dname parser follows them
    out = "".join(f"\\{c}" if c in ',+"\\<>;=' else c for c in text)
    return "\\" + out if out.startswith(("#", " ")) else out


def subject_alt_names(hosts: Sequence[str]) -> str:
    """keytool's ``-ext san=`` value: ``ip:`` for addresses, ``dns:`` for names."""
    parts = []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not host or any(c in host for c in ", \t\n:"):
                raise ValueError(f"not a host name or IP address: {host!r}") from None
            parts.append(f"dns:{host}")
        else:
            parts.append(f"ip:{host}")
    return ",".join(parts)


def pem(label: str, der: bytes) -> str:
    """``der`` as a PEM block (64 base64 characters a line, RFC 7468)."""
    body = "\n".join(textwrap.wrap(base64.b64encode(der).decode(), 64))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


# -- DER and PKCS#12 reading -----------------------------------------------------------------------


@dataclass(frozen=True)
class Bag:
    """One SafeBag of a PKCS#12 file: its type (an OID), its friendly name (keytool's alias) and its
    content: a certificate's DER for a certBag, an EncryptedPrivateKeyInfo's DER for a shrouded key
    bag, a PrivateKeyInfo's DER for a plain key bag."""

    kind: str
    friendly_name: str | None
    value: bytes


def der_items(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    """The DER elements one after the other in ``data``: (tag, content, whole encoding). Definite
    lengths only (DER has no other); ValueError on a truncated or indefinite element."""
    pos = 0
    while pos < len(data):
        start = pos
        if pos + 2 > len(data):
            raise ValueError(f"DER: truncated element at byte {start}")
        tag = data[pos]
        if tag & 0x1F == 0x1F:
            raise ValueError(f"DER: high tag numbers are not used in PKCS#12 (byte {start})")
        first = data[pos + 1]
        pos += 2
        if first < 0x80:
            length = first
        elif first == 0x80:
            raise ValueError(f"DER: indefinite length at byte {start}")
        else:
            n = first & 0x7F
            if pos + n > len(data):
                raise ValueError(f"DER: truncated length at byte {start}")
            length = int.from_bytes(data[pos : pos + n], "big")
            pos += n
        if pos + length > len(data):
            raise ValueError(f"DER: element at byte {start} runs past the end ({length} bytes)")
        yield tag, data[pos : pos + length], data[start : pos + length]
        pos += length


def _children(content: bytes) -> list[tuple[int, bytes, bytes]]:
    return list(der_items(content))


def _only(data: bytes, tag: int, what: str) -> bytes:
    items = _children(data)
    if len(items) != 1 or items[0][0] != tag:
        raise ValueError(f"PKCS#12: {what} is not one element of tag {tag:#04x}")
    return items[0][1]


def decode_oid(content: bytes) -> str:
    """An OBJECT IDENTIFIER's content octets in dotted form."""
    if not content:
        raise ValueError("DER: empty object identifier")
    arcs: list[int] = []
    value = 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if content[-1] & 0x80:
        raise ValueError("DER: object identifier ends inside an arc")
    first = arcs[0]
    head = [0, first] if first < 40 else [1, first - 40] if first < 80 else [2, first - 80]
    return ".".join(map(str, head + arcs[1:]))


def _content_info(element: bytes) -> tuple[str, bytes]:
    """A ContentInfo's type and its [0] EXPLICIT content (absent: empty)."""
    parts = _children(element)
    if not parts or parts[0][0] != TAG_OID:
        raise ValueError("PKCS#12: a ContentInfo without a content type")
    body = parts[1][1] if len(parts) > 1 and parts[1][0] == TAG_EXPLICIT_0 else b""
    return decode_oid(parts[0][1]), body


def pkcs12_bags(data: bytes) -> list[Bag]:
    """The SafeBags of a PKCS#12 file whose SafeContents are not encrypted (key bags may be shrouded:
    they are returned as they are). The MAC is not checked: the file is the one keytool just wrote.
    CertificateError when a SafeContents is encrypted."""
    pfx = _only(data, TAG_SEQUENCE, "the PFX")
    parts = _children(pfx)
    if len(parts) < 2 or parts[0][0] != TAG_INTEGER or parts[0][1] != b"\x03":
        raise ValueError("PKCS#12: not a version 3 PFX")
    kind, body = _content_info(parts[1][1])
    if kind != OID_DATA:
        raise ValueError(f"PKCS#12: authSafe of type {kind}, not data (public-key integrity mode?)")
    data = _only(body, TAG_OCTET_STRING, "the authSafe's data")
    authenticated_safe = _only(data, TAG_SEQUENCE, "the AuthenticatedSafe")
    bags: list[Bag] = []
    for tag, content, _ in der_items(authenticated_safe):
        if tag != TAG_SEQUENCE:
            raise ValueError("PKCS#12: an AuthenticatedSafe entry is not a ContentInfo")
        kind, body = _content_info(content)
        if kind == OID_ENCRYPTED_DATA:
            raise CertificateError(
                "PKCS#12: encrypted SafeContents (keytool without "
                "-Dkeystore.pkcs12.certProtectionAlgorithm=NONE?)"
            )
        if kind != OID_DATA:
            raise ValueError(f"PKCS#12: SafeContents of type {kind}")
        data = _only(body, TAG_OCTET_STRING, "SafeContents data")
        safe_contents = _only(data, TAG_SEQUENCE, "SafeContents")
        bags.extend(_safe_bag(bag) for _, bag, _ in der_items(safe_contents))
    return bags


def _safe_bag(content: bytes) -> Bag:
    parts = _children(content)
    if len(parts) < 2 or parts[0][0] != TAG_OID or parts[1][0] != TAG_EXPLICIT_0:
        raise ValueError("PKCS#12: malformed SafeBag")
    kind = decode_oid(parts[0][1])
    value = parts[1][1]
    if kind == OID_CERT_BAG:
        cert_parts = _children(_only(value, TAG_SEQUENCE, "a CertBag"))
        if len(cert_parts) != 2 or decode_oid(cert_parts[0][1]) != OID_X509_CERTIFICATE:
            raise ValueError("PKCS#12: a CertBag that holds no X.509 certificate")
        value = _only(_only(cert_parts[1][2], TAG_EXPLICIT_0, "certValue"), TAG_OCTET_STRING, "certValue")
    elif kind in (OID_SHROUDED_KEY_BAG, OID_KEY_BAG):
        _only(value, TAG_SEQUENCE, "a key bag")
        value = next(der_items(value))[2]  # the whole SEQUENCE, tag and length too: what PEM holds
    name = None
    if len(parts) > 2 and parts[2][0] == TAG_SET:
        for _, attribute, _ in der_items(parts[2][1]):
            attr = _children(attribute)
            if len(attr) == 2 and decode_oid(attr[0][1]) == OID_FRIENDLY_NAME:
                name = _only(attr[1][1], TAG_BMP_STRING, "friendlyName").decode("utf-16-be")
    return Bag(kind, name, value)


def _one(bags: list[Bag], kind: str, name: str) -> bytes:
    found = [b.value for b in bags if b.kind == kind and b.friendly_name == name]
    if len(found) != 1:
        raise CertificateError(f"keytool's PKCS#12 file has {len(found)} {kind} bags named {name!r}, not 1")
    return found[0]
