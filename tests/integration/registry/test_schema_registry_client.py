"""mqd.spark.schema_registry.SchemaRegistryClient against a real registry (mqd.testing.SchemaRegistry:
Apicurio Registry through Confluent's API), one per module.

Requests are counted, credentials demanded and https served by a small aiohttp reverse proxy in
front of the registry (tests/support/registry_proxy.py): Apicurio's own authentication needs a
Keycloak server, so the proxy is the honest stand-in for a registry behind basic auth or bearer
tokens; what the client sends meets a real HTTP server either way. Dead URLs are closed ephemeral
ports of 127.0.0.1, or a socket that accepts connections and never answers.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.registry_proxy import registry_proxy
from support.servers import serving

from mqd.config import SchemaRegistryConfig
from mqd.spark.schema_registry import (
    RegisteredSchema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from mqd.testing.certificates import generate_certificates
from mqd.testing.cluster import free_port
from mqd.testing.schema_registry import RegistryRequestError, SchemaRegistry

pytestmark = pytest.mark.timeout(240)  # the first use builds the registry (~1-2 min, once per machine)


def avro(*fields: tuple[str, object]) -> str:
    return json.dumps(
        {
            "type": "record",
            "name": "Order",
            "namespace": "shop",
            "fields": [
                {"name": n, "type": t, **({"default": ""} if t == "string" else {})} for n, t in fields
            ],
        }
    )


def proto(*fields: str, package: str = "shop") -> str:
    body = "".join(f"  {f} = {i};\n" for i, f in enumerate(fields, 1))
    return f'syntax = "proto3";\npackage {package};\n\nmessage Order {{\n{body}}}\n'


def json_schema(*props: tuple[str, str]) -> str:
    return json.dumps({"type": "object", "properties": {n: {"type": t} for n, t in props}})


TYPED = {
    "AVRO": ("orders-avro-value", avro(("id", "long")), avro(("id", "long"), ("note", "string"))),
    "PROTOBUF": ("orders-proto-value", proto("int64 id"), proto("int64 id", "string note")),
    "JSON": (
        "orders-json-value",
        json_schema(("id", "integer")),
        json_schema(("id", "integer"), ("note", "string")),
    ),
}

CURRENCY_PROTO = 'syntax = "proto3";\npackage money;\n\nmessage Currency {\n  string code = 1;\n}\n'
MONEY_PROTO = (
    'syntax = "proto3";\npackage money;\n\nimport "money/currency.proto";\n\n'
    "message Money {\n  int64 units = 1;\n  money.Currency currency = 2;\n}\n"
)
INVOICE_PROTO = (
    'syntax = "proto3";\npackage billing;\n\nimport "money/money.proto";\n\n'
    "message Invoice {\n  int64 id = 1;\n  money.Money total = 2;\n}\n"
)
ADDRESS_AVRO = json.dumps(
    {"type": "record", "name": "Address", "namespace": "shop", "fields": [{"name": "city", "type": "string"}]}
)
CUSTOMER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Customer",
        "namespace": "shop",
        "fields": [{"name": "name", "type": "string"}, {"name": "address", "type": "shop.Address"}],
    }
)


@dataclass(frozen=True)
class Registered:
    ids: dict[str, tuple[int, int]]  # schema type -> (version 1's id, version 2's id)
    invoice_id: int
    customer_id: int


@pytest.fixture(scope="module")
def registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SchemaRegistry]:
    with serving(request, SchemaRegistry(tmp_path_factory.mktemp("schema-registry"))) as server:
        yield server


@pytest.fixture(scope="module")
def registered(registry: SchemaRegistry) -> Registered:
    ids = {}
    for kind, (subject, v1, v2) in TYPED.items():
        ids[kind] = (registry.register(subject, v1, kind), registry.register(subject, v2, kind))
    registry.register("money-currency", CURRENCY_PROTO, "PROTOBUF")
    registry.register(
        "money-money", MONEY_PROTO, "PROTOBUF", references=[("money/currency.proto", "money-currency", 1)]
    )
    invoice = registry.register(
        "invoices-value", INVOICE_PROTO, "PROTOBUF", references=[("money/money.proto", "money-money", 1)]
    )
    registry.register("shop-address", ADDRESS_AVRO)
    customer = registry.register(
        "customers-value", CUSTOMER_AVRO, references=[("shop.Address", "shop-address", 1)]
    )
    return Registered(ids, invoice, customer)


def client(*urls: str, **settings: object) -> SchemaRegistryClient:
    return SchemaRegistryClient(SchemaRegistryConfig.model_validate({"url": list(urls), **settings}))


def closed_url() -> str:
    """A 127.0.0.1 port nothing listens on: connection refused."""
    return f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"


def same_text(kind: str, a: str, b: str) -> bool:
    return json.loads(a) == json.loads(b) if kind in ("AVRO", "JSON") else a.strip() == b.strip()


def test_typed_subjects_by_id_latest_and_versions(registry: SchemaRegistry, registered: Registered) -> None:
    """Avro, Protobuf and JSON Schema subjects with two versions each: every id gives its type and
    text; latest() is version 2 with its id; versions() lists 1 and 2."""
    c = client(registry.url)
    for kind, (subject, v1, v2) in TYPED.items():
        id1, id2 = registered.ids[kind]
        assert id1 != id2
        for sid, text in ((id1, v1), (id2, v2)):
            found = c.schema(sid)
            assert (found.id, found.schema_type, found.subject, found.version) == (sid, kind, None, None)
            assert same_text(kind, found.schema, text), (kind, found.schema)
            assert found.references == () and found.referenced == ()
        latest = c.latest(subject)
        assert (latest.id, latest.subject, latest.version, latest.schema_type) == (id2, subject, 2, kind)
        assert c.versions(subject) == [1, 2]
        first = c.version(subject, 1)
        assert (first.id, first.version) == (id1, 1)


def test_references_resolved_dependencies_first(registry: SchemaRegistry, registered: Registered) -> None:
    """A Protobuf schema importing one that imports another: all three texts come back, the deepest
    first, under the names the imports use; an Avro record using a named type of another subject."""
    invoice = client(registry.url).schema(registered.invoice_id)
    assert invoice.schema_type == "PROTOBUF"
    assert invoice.references == (SchemaReference("money/money.proto", "money-money", 1),)
    assert [(r.name, r.subject, r.version) for r in invoice.referenced] == [
        ("money/currency.proto", "money-currency", 1),
        ("money/money.proto", "money-money", 1),
    ]
    assert invoice.reference_texts["money/currency.proto"].strip() == CURRENCY_PROTO.strip()
    assert invoice.reference_texts["money/money.proto"].strip() == MONEY_PROTO.strip()
    money = invoice.referenced[1]
    assert money.references == (SchemaReference("money/currency.proto", "money-currency", 1),)
    assert money.schema_type == "PROTOBUF" and money.id > 0

    customer = client(registry.url).schema(registered.customer_id)
    assert customer.schema_type == "AVRO"
    (address,) = customer.referenced
    assert (address.name, address.subject, address.version) == ("shop.Address", "shop-address", 1)
    assert json.loads(address.schema) == json.loads(ADDRESS_AVRO)


def test_each_id_and_reference_asked_once_per_client(
    registry: SchemaRegistry, registered: Registered
) -> None:
    """Counted at a proxy in front of the registry: an id asked three times is one request, the
    references under it one request each; a second client asks again (the cache is the client's)."""
    with registry_proxy(registry.base_url) as proxy:
        c = client(proxy.url)
        first = [c.schema(registered.invoice_id) for _ in range(3)]
        assert first[0] is first[1] is first[2]
        assert proxy.count(f"/schemas/ids/{registered.invoice_id}") == 1
        assert proxy.count("/subjects/money-money/versions/1") == 1
        assert proxy.count("/subjects/money-currency/versions/1") == 1
        assert proxy.count() == c.requests == 3
        id1, id2 = registered.ids["AVRO"]
        c.schema(id1)
        c.schema(id1)
        assert proxy.count(f"/schemas/ids/{id1}") == 1
        # latest() asks every time (a subject gains versions), and its id is then known
        c.latest("orders-avro-value")
        c.latest("orders-avro-value")
        assert proxy.count("/versions/latest") == 2
        before = proxy.count()
        assert c.schema(id2).id == id2
        assert proxy.count() == before
        client(proxy.url).schema(registered.invoice_id)
        assert proxy.count(f"/schemas/ids/{registered.invoice_id}") == 2


def test_a_dead_url_is_passed_over_and_the_live_one_kept(
    registry: SchemaRegistry, registered: Registered
) -> None:
    """First URL refuses connections: the second answers, and later requests start there."""
    with registry_proxy(registry.base_url) as proxy:
        c = client(closed_url(), proxy.url, request_timeout=5)
        id1, id2 = registered.ids["JSON"]
        assert c.schema(id1).schema_type == "JSON"
        assert c.requests == 2 and proxy.count() == 1
        assert c.schema(id2).id == id2
        assert c.requests == 3 and proxy.count() == 2  # straight to the URL that answered


def test_5xx_and_a_silent_server_are_passed_over(registry: SchemaRegistry, registered: Registered) -> None:
    """A URL answering 503 and one that accepts connections but never answers (request_timeout):
    both passed over; the error names each when no URL answers, and is retriable."""
    with (
        registry_proxy(registry.base_url, fail_status=503) as failing,
        registry_proxy(registry.base_url) as live,
        socket.create_server(("127.0.0.1", 0)) as silent,
    ):
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}/apis/ccompat/v7"
        c = client(failing.url, silent_url, live.url, request_timeout=0.5)
        id1, _ = registered.ids["PROTOBUF"]
        started = time.monotonic()
        assert c.schema(id1).schema_type == "PROTOBUF"
        assert time.monotonic() - started < 10
        assert failing.count() == 1 and live.count() == 1

        nobody = client(failing.url, silent_url, request_timeout=0.5)
        with pytest.raises(SchemaRegistryError) as err:
            nobody.schema(id1)
        message = str(err.value)
        assert err.value.retriable and err.value.schema_id == id1
        assert failing.url in message and "HTTP 503" in message and silent_url in message
        assert "timed out" in message, message


def test_4xx_is_final(registry: SchemaRegistry, registered: Registered) -> None:
    """An unknown id: the registry's 404 and its message, the URL and the id in the error, and the
    second URL is not asked."""
    with registry_proxy(registry.base_url) as first, registry_proxy(registry.base_url) as second:
        c = client(first.url, second.url)
        with pytest.raises(SchemaRegistryError) as err:
            c.schema(987654)
        e = err.value
        assert (e.status, e.error_code, e.schema_id, e.url, e.retriable) == (
            404,
            40403,
            987654,
            first.url,
            False,
        )
        assert first.url in str(e) and "schema id 987654" in str(e) and "HTTP 404" in str(e)
        assert "987654" in str(e).split("error 40403:", 1)[1]  # the registry's own message
        assert second.count() == 0
        with pytest.raises(SchemaRegistryError) as err:
            c.latest("no-such-subject")
        assert err.value.status == 404 and "no-such-subject" in str(err.value)
        assert second.count() == 0


def test_basic_auth(registry: SchemaRegistry, registered: Registered) -> None:
    """A registry behind basic auth: the right pair passes, a wrong password is a final 401."""
    with registry_proxy(registry.base_url, basic=("alice", "s3cret-pw")) as proxy:
        id1, _ = registered.ids["AVRO"]
        assert client(proxy.url, username="alice", password="s3cret-pw").schema(id1).id == id1
        with pytest.raises(SchemaRegistryError) as err:
            client(proxy.url, closed_url(), username="alice", password="wrong").schema(id1)
        assert err.value.status == 401 and not err.value.retriable
        assert (
            "HTTP 401" in str(err.value) and "Unauthorized" in str(err.value) and proxy.url in str(err.value)
        )
        with pytest.raises(SchemaRegistryError) as err:
            client(proxy.url).schema(id1)  # none at all
        assert err.value.status == 401


def test_bearer_token(registry: SchemaRegistry, registered: Registered) -> None:
    with registry_proxy(registry.base_url, bearer="tok-4d1f") as proxy:
        id1, _ = registered.ids["PROTOBUF"]
        assert client(proxy.url, bearer_token="tok-4d1f").schema(id1).schema_type == "PROTOBUF"
        with pytest.raises(SchemaRegistryError) as err:
            client(proxy.url, bearer_token="tok-other").schema(id1)
        assert err.value.status == 401 and "Unauthorized" in str(err.value)


def test_https_with_a_ca_file(registry: SchemaRegistry, registered: Registered, tmp_path: Path) -> None:
    """An https registry whose certificate a test CA signed: tls_ca_file trusts it; without it the
    error says the certificate failed, and is not retriable (a configuration matter)."""
    certs = generate_certificates(tmp_path / "tls")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(certs.keystore_file, password=certs.key_password)
    with registry_proxy(registry.base_url, tls=tls, basic=("bob", "pw-over-tls")) as proxy:
        assert proxy.url.startswith("https://127.0.0.1:")
        id1, _ = registered.ids["JSON"]
        trusted = client(proxy.url, tls_ca_file=str(certs.ca_file), username="bob", password="pw-over-tls")
        assert trusted.schema(id1).schema_type == "JSON"
        with pytest.raises(SchemaRegistryError) as err:
            client(proxy.url, username="bob", password="pw-over-tls").schema(id1)
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) or "certificate verify failed" in str(err.value)
        assert not err.value.retriable and proxy.url in str(err.value)


def test_testing_api_helpers(registry: SchemaRegistry) -> None:
    """register() gives a new version's id and set_compatibility() makes the registry check the
    next one; an incompatible schema is refused with the registry's message."""
    subject = "compat-avro-value"
    first = registry.register(subject, avro(("id", "long")))
    registry.set_compatibility(subject, "BACKWARD")
    with pytest.raises(RegistryRequestError) as err:
        registry.register(subject, avro(("id", "string")))  # a changed type: not backward compatible
    assert err.value.status == 409
    registry.set_compatibility(subject, "NONE")
    second = registry.register(subject, avro(("id", "string")))
    assert second != first
    found: RegisteredSchema = client(registry.url).latest(subject)
    assert (found.id, found.version) == (second, 2)


def test_stop_and_kill_are_idempotent(tmp_path: Path) -> None:
    """A second registry of its own: kill twice, stop twice, and its URL refuses afterwards."""
    server = SchemaRegistry(tmp_path)
    server.stop()
    server.kill()  # never started: nothing to do
    with server:
        url = server.url
        assert server.running and server.start_seconds is not None
        server.kill()
        server.kill()
        server.stop()
    server.stop()
    assert not server.running
    with pytest.raises(SchemaRegistryError) as err:
        client(url, request_timeout=2).schema(1)
    assert err.value.retriable and "refused" in str(err.value).lower()
