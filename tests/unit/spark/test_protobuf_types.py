"""The pure parts of typed Protobuf records: the message indexes of the wire format (zig-zag
varints, the 0x00 shorthand for [0]) and the Spark type of each message of a writer schema
(protoc's FileDescriptorSet read by mqd's decoder: scalars by kind, enums as strings, repeated as
arrays, maps, nested messages as structs, Timestamp as timestamp, wrappers as nullable scalars,
imports resolved, a recursive message refused, a .proto protoc refuses with protoc's message).
protoc and protobuf-java come from mqd's cache (python -m mqd.spark.protobuf_tools)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqd.spark import protobuf_tools as tools
from mqd.spark.protobuf_decode import plan_schema
from mqd.spark.protobuf_types import (
    decode_message_indexes,
    encode_message_indexes,
    messages,
    path_text,
    unzigzag,
    wire_record,
    zigzag,
)


def test_first_message_is_the_single_zero_byte() -> None:
    assert encode_message_indexes([0]) == b"\x00"
    assert decode_message_indexes(b"\x00\x08\x01") == ([0], 1)


def test_indexes_are_a_zigzag_count_then_zigzag_indexes() -> None:
    # [1]: count 1 -> 2, index 1 -> 2; [0, 2]: count 2 -> 4, 0 -> 0, 2 -> 4
    assert encode_message_indexes([1]) == b"\x02\x02"
    assert encode_message_indexes([0, 2]) == b"\x04\x00\x04"
    assert encode_message_indexes([70]) == b"\x02\x8c\x01"
    assert decode_message_indexes(b"\x04\x00\x04rest") == ([0, 2], 3)
    assert path_text([0, 2]) == "0.2"


@given(st.lists(st.integers(min_value=0, max_value=2**31 - 1), min_size=1, max_size=64))
def test_indexes_round_trip(indexes: list[int]) -> None:
    data = encode_message_indexes(indexes)
    assert decode_message_indexes(data + b"\x08\x01") == (indexes, len(data))


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_zigzag_round_trip(n: int) -> None:
    assert zigzag(n) >= 0 and unzigzag(zigzag(n)) == n


@pytest.mark.parametrize(
    "data",
    [
        b"",  # nothing
        b"\x80",  # cut inside a varint
        b"\x01",  # count -1
        b"\x02\x01",  # index -1
        b"\x04\x02",  # count 2, one index
        b"\x82\x01",  # count 65
        b"\xff\xff\xff\xff\xff\x01",  # a varint longer than an int32's
    ],
)
def test_malformed_indexes_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_message_indexes(data)


def test_wire_record_is_header_indexes_message() -> None:
    assert wire_record(7, b"\x08\x01", [1]) == b"\x00\x00\x00\x00\x07\x02\x02\x08\x01"
    with pytest.raises(ValueError):
        encode_message_indexes([])


def test_describe_answer_as_spark_types() -> None:
    found = messages(
        {
            "messages": [
                {"path": "0", "name": "a.M", "type": {"type": "struct", "fields": []}, "error": None},
                {"path": "1", "name": "a.R", "type": None, "error": "recursive message: a.R -> a.R"},
            ]
        }
    )
    assert found["0"].spark_type == StructType([]) and found["0"].name == "a.M"
    assert found["1"].spark_type is None and "recursive" in (found["1"].error or "")
    with pytest.raises(ValueError, match="no file"):
        messages({"error": "no file x.proto in the descriptor set"})


def _f(name: str, t: object) -> StructField:
    return StructField(name, t, True)  # type: ignore[arg-type]


SCALARS = """syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";

message All {
  double d = 1; float f = 2; int32 i32 = 3; int64 i64 = 4; uint32 u32 = 5; uint64 u64 = 6;
  sint32 s32 = 7; sint64 s64 = 8; fixed32 x32 = 9; fixed64 x64 = 10; sfixed32 sx32 = 11;
  sfixed64 sx64 = 12; bool b = 13; string s = 14; bytes raw = 15;
  Color color = 16;
  repeated int32 nums = 17;
  map<int32, Inner> by_id = 18;
  Inner inner = 19;
  repeated Inner inners = 20;
  google.protobuf.Timestamp at = 21;
  google.protobuf.Int64Value maybe = 22;
  google.protobuf.Struct doc = 23;
  oneof pick { string a = 24; int64 n = 25; }
  optional string note = 26;
  enum Color { RED = 0; GREEN = 1; }
  message Inner { string name = 1; repeated string tags = 2; }
}

message Second { string only = 1; }
message Tree { string label = 1; Forest kids = 2; }
message Forest { repeated Tree trees = 1; }
"""


def test_descriptor_to_spark_type() -> None:
    plan = plan_schema(SCALARS, [])
    inner = StructType([_f("name", StringType()), _f("tags", ArrayType(StringType(), True))])
    assert plan.messages["0"].name == "t.All"
    assert plan.messages["0"].spark_type == StructType(
        [
            _f("d", DoubleType()),
            _f("f", FloatType()),
            _f("i32", IntegerType()),
            _f("i64", LongType()),
            _f("u32", LongType()),
            _f("u64", DecimalType(20, 0)),
            _f("s32", IntegerType()),
            _f("s64", LongType()),
            _f("x32", LongType()),
            _f("x64", DecimalType(20, 0)),
            _f("sx32", IntegerType()),
            _f("sx64", LongType()),
            _f("b", BooleanType()),
            _f("s", StringType()),
            _f("raw", BinaryType()),
            _f("color", StringType()),
            _f("nums", ArrayType(IntegerType(), True)),
            _f("by_id", MapType(IntegerType(), inner, True)),
            _f("inner", inner),
            _f("inners", ArrayType(inner, True)),
            _f("at", TimestampType()),
            _f("maybe", LongType()),
            _f("doc", StringType()),
            _f("a", StringType()),
            _f("n", LongType()),
            _f("note", StringType()),
        ]
    )
    # nested messages have paths too; the synthetic map entry keeps its index (0.0) but no entry
    assert {p: m.name for p, m in plan.messages.items()} == {
        "0": "t.All",
        "0.1": "t.All.Inner",
        "1": "t.Second",
        "2": "t.Tree",
        "3": "t.Forest",
    }
    assert plan.messages["1"].spark_type == StructType([_f("only", StringType())])
    for path in ("2", "3"):  # Tree -> Forest -> Tree
        assert plan.messages[path].spark_type is None
        assert "recursive message" in (plan.messages[path].error or "")


def test_imports_by_registered_name() -> None:
    money = 'syntax = "proto3";\npackage money;\nmessage Money { string currency = 1; int64 units = 2; }\n'
    invoice = (
        'syntax = "proto3";\npackage billing;\nimport "money/money.proto";\n'
        "message Invoice { money.Money total = 1; }\n"
    )
    plan = plan_schema(invoice, [("money/money.proto", money)])
    assert plan.messages["0"].spark_type == StructType(
        [_f("total", StructType([_f("currency", StringType()), _f("units", LongType())]))]
    )
    with pytest.raises(tools.ProtocError, match=r"money/money\.proto"):
        plan_schema(invoice, [])


def test_protoc_refusal_carries_protocs_message() -> None:
    with pytest.raises(tools.ProtocError, match='"Nope" is not defined') as err:
        plan_schema('syntax = "proto3";\nmessage X { Nope y = 1; }\n', [])
    assert "mqd-protoc-" not in str(err.value)  # its temp folder left out
    with pytest.raises(tools.ProtocError, match="leaves the source folder"):
        plan_schema('syntax = "proto3";\nmessage X {}\n', [("../evil.proto", "")])
