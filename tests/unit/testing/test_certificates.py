"""mqd.testing.certificates' pure parts (the DER and PKCS#12 reading, PEM, keytool's SAN value) and
KafkaCluster's security settings before anything starts; one test runs keytool for real and checks
the files with OpenSSL in a TLS handshake between two in-process sockets."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest

from mqd.testing import KafkaCluster, KafkaSecurity
from mqd.testing.certificates import (
    OID_CERT_BAG,
    OID_SHROUDED_KEY_BAG,
    CertificateError,
    Certificates,
    decode_oid,
    der_items,
    generate_certificates,
    pem,
    pkcs12_bags,
    subject_alt_names,
)


def tlv(tag: int, content: bytes) -> bytes:
    """One DER element (short or long length form)."""
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + content


def oid(dotted: str) -> bytes:
    """An OBJECT IDENTIFIER element (the encoder decode_oid is checked against)."""
    arcs = [int(a) for a in dotted.split(".")]
    out = bytearray()
    for arc in [arcs[0] * 40 + arcs[1], *arcs[2:]]:
        chunk = [arc & 0x7F]
        while arc := arc >> 7:
            chunk.append(0x80 | (arc & 0x7F))
        out += bytes(reversed(chunk))
    return tlv(0x06, bytes(out))


def test_der_items_reads_short_and_long_lengths_and_refuses_what_der_does_not_allow() -> None:
    """Elements come back in order with their content and whole encoding, whatever the length form;
    truncated data, indefinite lengths and high tag numbers are ValueErrors, not garbage."""
    long = tlv(0x04, b"x" * 300)
    data = tlv(0x02, b"\x03") + long
    assert [(t, c) for t, c, _ in der_items(data)] == [(0x02, b"\x03"), (0x04, b"x" * 300)]
    assert list(der_items(data))[1][2] == long
    for bad in (long[:-1], b"\x30\x80\x00\x00", b"\x1f\x01\x00", b"\x30", b"\x04\x82\x01"):
        with pytest.raises(ValueError):
            list(der_items(bad))


@pytest.mark.parametrize("dotted", ["1.2.840.113549.1.12.10.1.3", "2.5.29.17", "0.9.2342", "2.999.1"])
def test_decode_oid_reads_what_an_encoder_wrote(dotted: str) -> None:
    """Multi-byte arcs and the first byte's 40 * x + y split (arc 2 above 39 included)."""
    (_, content, _) = next(der_items(oid(dotted)))
    assert decode_oid(content) == dotted


def test_pem_is_what_openssl_reads_back() -> None:
    """A PEM block of 64-character lines that Python's ssl module turns back into the same DER."""
    der = bytes(range(256)) * 3
    text = pem("CERTIFICATE", der)
    assert all(len(line) <= 64 for line in text.splitlines())
    assert ssl.PEM_cert_to_DER_cert(text) == der


def test_subject_alt_names_tells_addresses_from_names() -> None:
    """IPv4 and IPv6 addresses become ip: entries, names dns: entries; what would break keytool's
    -ext parsing is refused."""
    assert subject_alt_names(["localhost", "127.0.0.1", "::1"]) == "dns:localhost,ip:127.0.0.1,ip:::1"
    for bad in ("a,b", "", "host name"):
        with pytest.raises(ValueError):
            subject_alt_names([bad])


def pfx(*safe_contents: list[bytes], encrypted: bool = False) -> bytes:
    """A PKCS#12 file holding ``safe_contents`` (lists of SafeBag elements), unencrypted unless
    ``encrypted`` (then its only ContentInfo is of type encryptedData)."""
    data = "1.2.840.113549.1.7.1"
    infos = [tlv(0x30, oid(data) + tlv(0xA0, tlv(0x04, tlv(0x30, b"".join(bags))))) for bags in safe_contents]
    if encrypted:
        infos = [tlv(0x30, oid("1.2.840.113549.1.7.6") + tlv(0xA0, tlv(0x30, b"")))]
    auth_safe = tlv(0x30, oid(data) + tlv(0xA0, tlv(0x04, tlv(0x30, b"".join(infos)))))
    return tlv(0x30, tlv(0x02, b"\x03") + auth_safe)


def bag(kind: str, value: bytes, name: str | None) -> bytes:
    attrs = b""
    if name is not None:
        friendly = tlv(0x30, oid("1.2.840.113549.1.9.20") + tlv(0x31, tlv(0x1E, name.encode("utf-16-be"))))
        attrs = tlv(0x31, friendly)
    return tlv(0x30, oid(kind) + tlv(0xA0, value) + attrs)


def test_pkcs12_bags_returns_certificates_and_shrouded_keys_by_friendly_name() -> None:
    """A hand-built PKCS#12 file: a cert bag's certificate DER and a shrouded key bag's whole
    EncryptedPrivateKeyInfo come back with their friendly names (keytool's aliases); encrypted
    SafeContents are a CertificateError saying which keytool setting was missing."""
    cert_der = tlv(0x30, b"certificate")
    key_der = tlv(0x30, tlv(0x30, b"algorithm") + tlv(0x04, b"ciphertext"))
    cert_bag = tlv(0x30, oid("1.2.840.113549.1.9.22.1") + tlv(0xA0, tlv(0x04, cert_der)))
    data = pfx(
        [bag(OID_SHROUDED_KEY_BAG, key_der, "server")],
        [bag(OID_CERT_BAG, cert_bag, "server"), bag(OID_CERT_BAG, cert_bag, None)],
    )
    got = [(b.kind, b.friendly_name, b.value) for b in pkcs12_bags(data)]
    assert got == [
        (OID_SHROUDED_KEY_BAG, "server", key_der),
        (OID_CERT_BAG, "server", cert_der),
        (OID_CERT_BAG, None, cert_der),
    ]
    with pytest.raises(CertificateError, match="certProtectionAlgorithm"):
        pkcs12_bags(pfx([], encrypted=True))
    with pytest.raises(ValueError):
        pkcs12_bags(data[:-3])


def handshake(certs: Certificates, ca_file: Path, server_name: str) -> dict[str, Any]:
    """A TLS handshake over a socket pair: an OpenSSL server on ``certs``' keystore, a client
    verifying against ``ca_file`` for ``server_name``; the certificate the client accepted."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs.keystore_file, password=certs.key_password)
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    client = client_ctx.wrap_socket(a, server_hostname=server_name, do_handshake_on_connect=False)
    server = server_ctx.wrap_socket(b, server_side=True, do_handshake_on_connect=False)

    def serve() -> None:
        # the client's side raises what a test looks at; the server's only ends with it
        with contextlib.suppress(ssl.SSLError, OSError):
            server.do_handshake()

    t = threading.Thread(target=serve)
    t.start()
    try:
        client.do_handshake()
        cert = client.getpeercert()
    finally:
        client.close()
        t.join(10)
        server.close()
    assert cert is not None
    return cert


@pytest.mark.skipif(shutil.which("java") is None, reason="keytool runs in a JVM")
def test_generated_certificates_pass_openssl_verification(tmp_path: Path) -> None:
    """generate_certificates (keytool for real): the server's PEM keystore loads in OpenSSL with the
    key password, its chain verifies against ca_file for localhost and 127.0.0.1, and not against
    another generated CA nor for another name; the key files are the user's only."""
    certs = generate_certificates(tmp_path / "a", java=shutil.which("java") or "java")
    other = generate_certificates(tmp_path / "b", ["localhost"], java=shutil.which("java") or "java")
    for name in ("localhost", "127.0.0.1"):
        cert = handshake(certs, certs.ca_file, name)
        assert cert["issuer"] == ((("commonName", "mqd test CA"),),)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        handshake(certs, other.ca_file, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(certs, certs.ca_file, "example.com")
    assert certs.keystore_file.stat().st_mode & 0o077 == 0


def test_a_secured_cluster_configures_its_listeners_before_it_starts(tmp_path: Path) -> None:
    """KafkaSecurity() before start: the clients' listener (bootstrap) is SASL_SSL with both SCRAM
    mechanisms and a PEM keystore under root/tls; brokers and controllers keep PLAINTEXT listeners;
    the format gets an --add-scram per user and mechanism; client settings name the first user."""
    security = KafkaSecurity(users={"alice": "a-secret", "bob": "b-secret"})
    kafka = KafkaCluster(tmp_path, security=security)
    b = kafka.brokers[0]
    props = kafka.server_properties(0)
    assert props["listeners"] == (
        f"SASL_SSL://127.0.0.1:{b.port},PLAINTEXT://127.0.0.1:{b.internal_port},"
        f"CONTROLLER://127.0.0.1:{b.controller_port}"
    )
    assert (
        props["advertised.listeners"]
        == f"SASL_SSL://127.0.0.1:{b.port},PLAINTEXT://127.0.0.1:{b.internal_port}"
    )
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512,SCRAM-SHA-256"
    assert props["ssl.keystore.type"] == "PEM" and props["ssl.keystore.location"] == str(
        tmp_path / "tls/server.pem"
    )
    assert "ScramLoginModule" in props["listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config"]
    assert (
        kafka.bootstrap == f"127.0.0.1:{b.port}"
        and kafka.plaintext_bootstrap == f"127.0.0.1:{b.internal_port}"
    )
    assert kafka._scram_arguments().count("--add-scram") == 4
    assert "SCRAM-SHA-256=[name=bob,password=b-secret]" in kafka._scram_arguments()
    assert kafka.users == {"alice": "a-secret", "bob": "b-secret"}
    with pytest.raises(RuntimeError, match="start it first"):
        kafka.client_config()  # no CA before start
    plain = KafkaCluster(tmp_path / "plain", security=KafkaSecurity("SASL_PLAINTEXT", users={"c": "d"}))
    assert plain.client_config() == {
        "bootstrap.servers": plain.bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "c",
        "sasl.password": "d",
    }
    assert plain.mqd_kafka_settings(mechanism="SCRAM-SHA-256", password="wrong")["sasl_password"] == "wrong"
    assert "ssl.keystore.type" not in plain.server_properties(0)
    with pytest.raises(KeyError, match="no SCRAM user"):
        plain.client_config("nobody")
    none = KafkaCluster(tmp_path / "none")
    assert none.client_config() == {"bootstrap.servers": none.bootstrap} and none.mqd_kafka_settings() == {}
    assert none.plaintext_bootstrap == none.bootstrap and none.ca_file is None and none.users == {}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"protocol": "PLAINTEXT"},
        {"users": {}},
        {"users": {"a,b": "x"}},
        {"users": {"a": "p]w"}},
        {"mechanisms": ()},
        {"mechanisms": ("PLAIN",)},
    ],
)
def test_kafka_security_refuses_what_kafka_could_not_take(kwargs: dict[str, object]) -> None:
    """A protocol without security, no users for SASL, names or passwords kafka-storage's --add-scram
    parser would split, no or unknown mechanisms: a ValueError at construction, not a broker that
    fails to start."""
    with pytest.raises(ValueError):
        KafkaSecurity(**kwargs)  # type: ignore[arg-type]
