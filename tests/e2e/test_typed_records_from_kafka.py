"""Typed records from Kafka to the Delta table, the way Kafka users write them: the issue's "done
when" for typed records, end to end.

One Apache Kafka broker (mqd.testing.KafkaCluster) and one schema registry (Apicurio, Confluent's
API) serve the module. Per format (avro, json_schema, protobuf) the test has its own topic (two
partitions), its own daemon run (the in-process Daemon in burst mode: it lands everything and
exits) and its own job run (``mqd spark --once``: job.run(cfg, once=True)), since a job decodes
one value_format:

- 300 records written by confluent-kafka's own serializers (AvroSerializer, JSONSerializer,
  ProtobufSerializer, ``auto.register.schemas`` on: each registers its version under the subject
  ``<topic>-value`` by TopicNameStrategy), 100 per version of one subject: v1 (id, name), v2 adds an
  optional ``score``, v3 removes ``name``;
- 4 poison records (~1%) produced raw between them: garbage bytes, a value shorter than the header,
  a wrong magic byte, a valid header naming a schema id the registry does not have.

The subject's compatibility: Avro BACKWARD (the three versions pass Apicurio's check); JSON Schema
and Protobuf NONE (Apicurio's global default), because Apicurio 2.4.2 refuses v2 under BACKWARD:
for JSON Schema a property added to an open content model is "OBJECT_TYPE_PROPERTY_SCHEMAS_NARROWED"
(Confluent's registry refuses it too: PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL); for Protobuf the Python
serializer registers a base64 FileDescriptorProto, which Apicurio stores verbatim and whose
compatibility check parses as .proto text (HTTP 500 "Syntax error ... unexpected label"). That
verbatim descriptor is also what the job fetches by id: mqd hands it to protoc as a descriptor
(mqd/spark/protobuf_tools.descriptor_set); before that every Protobuf record a Python producer
wrote was an unsupported_schema dead letter ("protoc refuses it: Expected top-level statement").
No serializer needs an option for Apicurio: the defaults (auto-registration, TopicNameStrategy, the
schema id as a prefix: Confluent's wire format) work against its Confluent API.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import deltalake
import pytest
from support.kafka import Produced, kafka_daemon_config, landed_rows, produce
from support.servers import serving
from support.table_readers import every_reader_keys
from support.typed import registry, typed_config

from mqd.process.daemon import Daemon
from mqd.spark import job
from mqd.spark.job_metrics import FILE_NAME, JobMetrics
from mqd.spark.wire_format import header
from mqd.testing.kafka_cluster import KafkaCluster
from mqd.testing.schema_registry import SchemaRegistry

pytestmark = pytest.mark.spark
pytest.importorskip("confluent_kafka.schema_registry")
__all__ = ["registry"]  # the module's fixture

PER_VERSION = 100
FORMATS = ["avro", "json_schema", "protobuf"]
UNKNOWN_ID = 2**31 - 7  # a well-formed id the registry never gave out


@pytest.fixture(scope="module")
def kafka(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One Apache Kafka broker for the module; its log printed at teardown when a test failed."""
    with serving(request, KafkaCluster(tmp_path_factory.mktemp("kafka"), brokers=1)) as server:
        yield server


def _record(n: int) -> dict[str, Any]:
    """Record n as its version has it: v1 (id, name), v2 (+ score), v3 (id, score)."""
    version = n // PER_VERSION
    rec: dict[str, Any] = {"id": n}
    if version < 2:
        rec["name"] = f"n{n}"
    if version > 0:
        rec["score"] = n / 2
    return rec


# -- each format's three versions, as its serializer is given them ------------------------------------

Serializer = Callable[[dict[str, Any], Any], bytes]  # (record, SerializationContext) -> value


def _avro(client: Any) -> list[Serializer]:
    from confluent_kafka.schema_registry.avro import AvroSerializer

    def schema(*fields: dict[str, Any]) -> str:
        return json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)})

    id_, name = {"name": "id", "type": "long"}, {"name": "name", "type": "string"}
    score = {"name": "score", "type": ["null", "double"], "default": None}
    return [
        AvroSerializer(client, s, conf={"auto.register.schemas": True})
        for s in (schema(id_, name), schema(id_, name, score), schema(id_, score))
    ]


def _json_schema(client: Any) -> list[Serializer]:
    from confluent_kafka.schema_registry.json_schema import JSONSerializer

    def schema(**props: Any) -> str:
        return json.dumps(
            {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "title": "Order",
                "type": "object",
                "properties": props,
                "required": ["id"],
            }
        )

    id_, name, score = {"type": "integer"}, {"type": "string"}, {"type": ["number", "null"]}
    versions = (
        schema(id=id_, name=name),
        schema(id=id_, name=name, score=score),
        schema(id=id_, score=score),
    )
    return [JSONSerializer(s, client, conf={"auto.register.schemas": True}) for s in versions]


def _protobuf(client: Any) -> list[Serializer]:
    """Message classes built at run time from descriptors (what protoc's Python output holds):
    shop/order.proto, message Order; v3 reserves name's number and name."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    fields = {"id": (1, f.TYPE_INT64), "name": (2, f.TYPE_STRING), "score": (3, f.TYPE_DOUBLE)}
    out: list[Serializer] = []
    for names in (("id", "name"), ("id", "name", "score"), ("id", "score")):
        fdp = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop", syntax="proto3")
        msg = fdp.message_type.add(name="Order")
        for n in names:
            number, kind = fields[n]
            msg.field.add(name=n, number=number, type=kind, label=f.LABEL_OPTIONAL, json_name=n)
        if "name" not in names:
            msg.reserved_name.append("name")
            msg.reserved_range.add(start=2, end=3)
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
        ser = ProtobufSerializer(cls, client, conf={"auto.register.schemas": True})

        def call(rec: dict[str, Any], ctx: Any, ser: Any = ser, cls: Any = cls) -> bytes:
            value: bytes = ser(cls(**rec), ctx)
            return value

        out.append(call)
    return out


SERIALIZERS: dict[str, Callable[[Any], list[Serializer]]] = {
    "avro": _avro,
    "json_schema": _json_schema,
    "protobuf": _protobuf,
}


def _produce_versions(
    fmt: str, kafka: KafkaCluster, registry: SchemaRegistry, topic: str
) -> dict[str, bytes]:
    """The 300 records through the format's serializers, v1 then v2 then v3, with the poison
    records produced raw between them; the poison values by their expected error class and name."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    ctx = SerializationContext(topic, MessageField.VALUE)
    v1, v2, v3 = SERIALIZERS[fmt](SchemaRegistryClient({"url": registry.url}))

    def batch(ser: Serializer, version: int) -> list[Produced]:
        ns = range(version * PER_VERSION, (version + 1) * PER_VERSION)
        return [(n % 2, b"%d" % n, ser(_record(n), ctx), []) for n in ns]

    first = batch(v1, 0)
    if fmt == "avro":  # the subject exists now; v2 and v3 are checked against it
        registry.set_compatibility(f"{topic}-value", "BACKWARD")
    good = first[0][2]
    assert good is not None and good[0] == 0
    poison = {
        "not_wire_format garbage": b"\xfe\x17garbage, not a serializer's bytes",
        "not_wire_format short": b"\x00\x00\x01",
        "not_wire_format magic": b"\x01" + good[1:],
        "unknown_schema": header(UNKNOWN_ID) + good[5:],
    }
    raw: list[Produced] = [(i % 2, b"poison-%d" % i, v, []) for i, v in enumerate(poison.values())]
    produce(kafka.bootstrap, first + raw[:2], topic=topic)
    produce(kafka.bootstrap, batch(v2, 1) + raw[2:3], topic=topic)
    produce(kafka.bootstrap, batch(v3, 2) + raw[3:], topic=topic)
    versions = registry.request("GET", f"/subjects/{topic}-value/versions")
    assert len(versions) == 3, versions  # one subject, three versions, registered by the serializers
    if fmt == "protobuf":  # what the registry answers for it: the serializer's base64 descriptor
        assert "message" not in registry.request("GET", f"/subjects/{topic}-value/versions/1")["schema"]
    return poison


def _delta_rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = deltalake.DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return rows


@pytest.mark.parametrize("fmt", FORMATS)
async def test_serialized_versions_and_poison_from_kafka_land_typed_and_dead_lettered(
    fmt: str, kafka: KafkaCluster, registry: SchemaRegistry, spark: Any, tmp_path: Path
) -> None:
    """Records of three versions of one subject, written by confluent-kafka's serializer for
    ``fmt`` into a real topic, plus ~1% poison produced raw, go through the daemon (landing) and
    ``mqd spark --once``. The typed table holds exactly the 300 good records, each key once:
    ``id`` typed, ``score`` null for v1 rows, ``name`` null for v3 rows, as Spark reads it and as
    delta-rs, Polars and DuckDB read it. Every poison record is a dead letter of its class (garbage,
    short and wrong-magic values not_wire_format, the unknown id unknown_schema) with its bytes;
    table + dead letters are every produced record; the job's metrics file counts the same."""
    topic = f"orders-{fmt}"
    kafka.create_topic(topic, 2)
    poison = await asyncio.to_thread(_produce_versions, fmt, kafka, registry, topic)
    produced = 3 * PER_VERSION + len(poison)

    cfg = kafka_daemon_config(kafka.bootstrap, tmp_path, topic=topic)
    cfg = cfg.model_copy(update={"spark": typed_config(tmp_path, registry.url, value_format=fmt).spark})
    await asyncio.wait_for(Daemon(cfg, burst=True).run(), 120)
    assert sum(len(rows) for rows in landed_rows(Path(cfg.landing.dir)).values()) == produced
    assert await asyncio.to_thread(job.run, cfg, once=True) == 0

    # the typed table: exactly the good records, each once, typed, nulls where a version lacks a field
    out = Path(cfg.spark.output_dir)
    rows = sorted(_delta_rows(out), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(3 * PER_VERSION))
    assert [(r["id"], r["name"], r["score"]) for r in rows] == [
        (n, _record(n).get("name"), _record(n).get("score")) for n in range(3 * PER_VERSION)
    ]
    assert {r["key"] for r in rows} == {b"%d" % n for n in range(3 * PER_VERSION)}
    frame = spark.read.format("delta").load(str(out))  # typed by Spark: one action, ~300 rows
    types = dict(frame.dtypes)
    assert (types["id"], types["name"], types["score"]) == ("bigint", "string", "double"), types
    by_spark = frame.select("topic", "partition", "offset", "id", "name", "score").collect()
    assert len({(r.topic, r.partition, r.offset) for r in by_spark}) == len(by_spark) == 3 * PER_VERSION
    assert sorted((r.id, r.name, r.score) for r in by_spark) == [
        (r["id"], r["name"], r["score"]) for r in rows
    ]
    assert sum(r.score is None for r in by_spark) == sum(r.name is None for r in by_spark) == PER_VERSION
    table_keys = sorted((r["topic"], r["partition"], r["incarnation"], r["offset"]) for r in rows)
    for reader, keys in every_reader_keys(out).items():
        assert keys == table_keys, reader

    # the dead letters: every poison record with its class; together with the table, everything
    dead = _delta_rows(Path(cfg.spark.quarantine_dir))
    assert sorted((r["error_class"], r["value"]) for r in dead) == sorted(
        (label.split()[0], value) for label, value in poison.items()
    )
    unknown = next(r for r in dead if r["error_class"] == "unknown_schema")
    assert unknown["schema_id"] == UNKNOWN_ID and str(UNKNOWN_ID) in unknown["error_message"]
    dead_keys = [(r["topic"], r["partition"], r["incarnation"], r["offset"]) for r in dead]
    everything = table_keys + dead_keys
    assert len(set(everything)) == len(everything) == produced
    landed = {(p, o) for p, recs in landed_rows(Path(cfg.landing.dir)).items() for o, *_ in recs}
    assert {(p, o) for _t, p, _i, o in everything} == landed

    # the job's counters agree
    metrics = JobMetrics(Path(cfg.spark.checkpoint_dir) / FILE_NAME).load().values
    totals: dict[tuple[str, str], float] = {}
    for (metric, _query, error_class), value in metrics.items():
        totals[(metric, error_class)] = totals.get((metric, error_class), 0) + value
    assert totals[("mqd_spark_rows_read_total", "")] == produced
    assert totals[("mqd_spark_rows_written_total", "")] == 3 * PER_VERSION
    dead_counts = {c: v for (m, c), v in totals.items() if m == "mqd_spark_dead_letter_rows_total" and v}
    assert dead_counts == {"not_wire_format": 3, "unknown_schema": 1}, metrics


def test_a_schema_registered_as_a_serialized_descriptor_compiles() -> None:
    """confluent-kafka's ProtobufSerializer registers a base64 FileDescriptorProto, which Apicurio
    gives back verbatim: protoc (given it as a descriptor, under the writer schema's file name)
    compiles it with its imports, one a .proto text reference, one a well-known type; a bare base64
    text that is no descriptor stays a protoc refusal. (No Kafka, no Spark: the fix's own check.)"""
    import base64

    from google.protobuf import descriptor_pb2

    from mqd.spark.protobuf_tools import ProtocError, descriptor_set

    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="shop/order.proto",
        package="shop",
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "money/money.proto"],
    )
    msg = fdp.message_type.add(name="Order")
    msg.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    msg.field.add(
        name="at",
        number=2,
        type=f.TYPE_MESSAGE,
        type_name=".google.protobuf.Timestamp",
        label=f.LABEL_OPTIONAL,
    )
    msg.field.add(
        name="total", number=3, type=f.TYPE_MESSAGE, type_name=".money.Money", label=f.LABEL_OPTIONAL
    )
    text = base64.standard_b64encode(fdp.SerializeToString()).decode()
    money = 'syntax = "proto3";\npackage money;\nmessage Money { string currency = 1; }\n'
    fds, main = descriptor_set(text, [("money/money.proto", money)])
    files = {x.name: x for x in descriptor_pb2.FileDescriptorSet.FromString(fds).file}
    assert set(files) == {main, "money/money.proto", "google/protobuf/timestamp.proto"}
    assert [m.name for m in files[main].message_type] == ["Order"] and files[main].package == "shop"
    with pytest.raises(ProtocError):
        descriptor_set("AAAAAAAAAAAA", [])
