"""Protobuf records decoded in Spark's JVM (``value_format`` / ``key_format`` = ``protobuf``).

Maven Central serves no spark-protobuf for Spark 4, so mqd brings its own small decoder,
mqd/spark/jvm/ProtobufDecode.java (mqd/spark/protobuf_tools.py builds it). Per writer schema id, on
the driver: protoc compiles the schema and its imports into a FileDescriptorSet, the decoder's
describe gives each message's path and Spark type (:func:`plan_schema`). Per record, in the
executors: a Java UDF reads the message indexes (:func:`path_column`), another parses the message
with protobuf-java's DynamicMessage into a row of that message's Spark type (:func:`decode_column`),
null when it does not parse. No Python runs per record.

The jars reach the session when the first Protobuf schema id is met, not before (a job without one
never fetches or compiles anything): ``ADD JAR`` of the decoder's jar and protobuf-java, which puts
them on the driver's class loader and ships them to the executors (:func:`ensure_session`). The
FileDescriptorSet travels in the plan as a binary literal (a few KB per schema), so an executor
needs no file of the driver's; each decoder instance keeps the descriptor it built.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mqd.spark import protobuf_tools as tools
from mqd.spark.protobuf_types import MessageType, messages

PATH_FUNCTION = "mqd_protobuf_path"
_lock = threading.Lock()
_ready: set[str] = set()  # the SparkContexts (application ids) whose sessions have the jars


@dataclass(slots=True)
class ProtobufSchema:
    """A writer schema compiled: its FileDescriptorSet, its file's name in it, its messages by path."""

    descriptor_set: bytes
    file: str
    messages: dict[str, MessageType] = field(default_factory=dict)


def plan_schema(text: str, references: Sequence[tuple[str, str]]) -> ProtobufSchema:
    """The writer schema ``text`` (its imports as (name, text) in ``references``) compiled and
    described. protobuf_tools.ProtocError when protoc refuses it."""
    fds, file = tools.descriptor_set(text, references)
    return ProtobufSchema(fds, file, messages(tools.describe(fds, file)))


def ensure_session(spark: Any) -> None:
    """The decoder's jars added to ``spark`` (once per SparkContext) and the path UDF registered."""
    from pyspark.sql.types import StringType

    app = spark.sparkContext.applicationId
    with _lock:
        if app not in _ready:
            for jar in tools.session_jars():
                spark.sql(f"ADD JAR '{jar}'")
            _ready.add(app)
        _use_jar_loader(spark)
        spark.udf.registerJavaFunction(PATH_FUNCTION, tools.PATH_CLASS, StringType())


def _use_jar_loader(spark: Any) -> None:
    """The calling JVM thread loads classes through the session's jar class loader (what ADD JAR
    extended): py4j may serve a later call from another thread than the one ADD JAR ran on."""
    jvm = spark.sparkContext._jvm
    loader = spark._jsparkSession.sharedState().jarClassLoader()
    jvm.java.lang.Thread.currentThread().setContextClassLoader(loader)


def path_column(data: Any) -> Any:
    """The message-index path of each payload (after the 5-byte header) as text, null if malformed."""
    from pyspark.sql import functions as F

    # the indexes are at most a few bytes: the UDF gets a short prefix, not the message
    return F.call_function(PATH_FUNCTION, F.substring(data, 1, 5 * (1 + 64)))


def function_name(role: str, schema_id: int, path: str) -> str:
    return f"mqd_protobuf_{role}_{schema_id}_{path.replace('.', '_')}"


def decode_column(spark: Any, data: Any, name: str, schema: ProtobufSchema, message: MessageType) -> Any:
    """Each payload (after the 5-byte header) parsed as ``message`` into a row of its Spark type,
    null when it does not parse. Registers the UDF ``name`` for this message's type."""
    from pyspark.sql import functions as F

    _use_jar_loader(spark)
    spark.udf.registerJavaFunction(name, tools.DECODE_CLASS, message.spark_type)
    return F.call_function(name, data, F.lit(schema.descriptor_set), F.lit(message.name))


__all__ = [
    "PATH_FUNCTION",
    "ProtobufSchema",
    "decode_column",
    "ensure_session",
    "function_name",
    "path_column",
    "plan_schema",
]
