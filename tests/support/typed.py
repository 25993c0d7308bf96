"""Typed records for the Spark job's tests: Avro payloads in the registry's wire format (written by
fastavro, the encoder Confluent's Python serializer uses), landed as mqd lands records, and a real
schema registry per module (mqd.testing.SchemaRegistry: Apicurio, Confluent's API)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pyarrow as pa
import pytest

from mqd.config import LandingConfig, MqdConfig, SparkConfig
from mqd.landing.local_store import LocalStore
from mqd.landing.publisher import Publisher
from mqd.spark.wire_format import header
from mqd.testing.schema_registry import SchemaRegistry
from mqd.wire import format as fmt
from support.servers import serving

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def record_schema(name: str, *fields: tuple[str, Any]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "namespace": "shop",
        "fields": [{"name": n, "type": t} for n, t in fields],
    }


def avro_value(schema_id: int, schema: dict[str, Any] | str, record: Any) -> bytes:
    """``record`` as a serializer writes it: the 5-byte header, then its Avro binary encoding."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return header(schema_id) + out.getvalue()


def land_values(
    landing: Path,
    values: Sequence[bytes],
    *,
    partition: int = 0,
    keys: Sequence[bytes | None] | None = None,
    topic: str = "events",
) -> list[int]:
    """Publish ``values`` (and ``keys``) as the next file of ``topic``/``partition``; their offsets."""
    pub = Publisher(LocalStore(landing))
    pub.store.open()
    last = pub.store.head(topic, partition).last_offset
    first = 0 if last is None else last + 1
    raw = fmt.encode_batch(
        list(values), keys=keys, timestamps=np.full(len(values), T0, dtype=np.int64), base_offset=first
    )
    batch = fmt.to_arrow(raw, fmt.scan(raw)[0])
    pub.publish(topic, partition, pa.Table.from_batches([batch]), last)
    return list(range(first, first + len(values)))


def typed_config(root: Path, registry_url: str, **spark: Any) -> MqdConfig:
    """A job from ``root/landing`` into ``root/events`` with Avro values by ``registry_url``."""
    kw: dict[str, Any] = {
        "output_dir": root / "events",
        "checkpoint_dir": root / "ckpt",
        "quarantine_dir": root / "dead-letters",
        "master": "local[2]",
        "shuffle_partitions": 2,
        "value_format": "avro",
        "schema_registry": {"url": registry_url},
        "partition_by": ["topic"],
        **spark,
    }
    return MqdConfig(landing=LandingConfig(dir=root / "landing"), spark=SparkConfig(**kw))


@pytest.fixture(scope="module")
def registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SchemaRegistry]:
    """A real registry for the module; its log printed at teardown when a test failed meanwhile."""
    with serving(request, SchemaRegistry(tmp_path_factory.mktemp("schema-registry"))) as server:
        yield server


def register(registry: SchemaRegistry, subject: str, schema: dict[str, Any] | str, kind: str = "AVRO") -> int:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return registry.register(subject, text, kind)
