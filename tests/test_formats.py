"""The value formats (engine/formats.py) against the libraries themselves: what fastavro
and protobuf write is decoded into the columns fastavro and protobuf read from the same
bytes, and what the formats write reads back with fastavro and protobuf as the rows
they came from. Pure Python, no broker."""

from __future__ import annotations

import datetime
import decimal
import json
import pickle

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor as F

from raystream.engine.formats import (TOMBSTONE, Avro, FormatError, Json, Protobuf, Raw,
                                      confluent_header, value_format_of)
from tests.support.formats import avro_decode, avro_encode

UTC = datetime.timezone.utc
SCHEMA = {
    "type": "record", "name": "Click", "namespace": "test",
    "fields": [
        {"name": "user", "type": "long"},
        {"name": "n", "type": "int"},
        {"name": "score", "type": "double"},
        {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"},
        {"name": "page", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "ref", "type": ["null", "string"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "BUY"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "where", "type": {"type": "record", "name": "Where", "fields": [
            {"name": "x", "type": "double"}, {"name": "y", "type": ["null", "long"]}]}},
        {"name": "id", "type": {"type": "fixed", "name": "Id", "size": 4}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                   "scale": 2}},
    ]}


def click(i: int) -> dict:
    return {"user": i * 1_000_003, "n": -i, "score": i / 7, "ratio": 0.5 * i, "ok": i % 2 == 0,
            "page": f"page-{i}-ü", "blob": bytes([i % 256, 0, 255]),
            "ref": None if i % 3 else f"r{i}", "kind": ["VIEW", "BUY"][i % 2],
            "tags": [f"t{j}" for j in range(i % 4)], "counts": {f"c{j}": j * i for j in range(i % 3)},
            "where": {"x": i + 0.25, "y": None if i % 5 == 0 else i},
            "id": i.to_bytes(4, "big"),
            "ts": datetime.datetime.fromtimestamp(1_700_000_000 + i, UTC)
            + datetime.timedelta(milliseconds=i % 1000),
            "us": datetime.datetime(2024, 1, 1, tzinfo=UTC) + datetime.timedelta(microseconds=i),
            "day": datetime.date(2024, 2, 29) + datetime.timedelta(days=i),
            "price": decimal.Decimal(i * 101) / 100}


def as_python(rows: list[dict]) -> list[dict]:
    """Arrow's maps (lists of pairs) as dicts, to compare with fastavro's rows."""
    return [{k: dict(v) if k == "counts" else v for k, v in row.items()} for row in rows]


# -- Avro -------------------------------------------------------------------------------------
def test_avro_decodes_what_fastavro_writes_into_the_columns_fastavro_reads():
    records = [click(i) for i in range(200)]
    values = avro_encode(SCHEMA, records)
    batch, bad = Avro(SCHEMA).decode(pa.array(values, pa.binary()))
    assert bad == []
    assert batch.schema.names == [f["name"] for f in SCHEMA["fields"]]
    assert batch.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert batch.schema.field("us").type == pa.timestamp("us", tz="UTC")
    assert batch.schema.field("day").type == pa.date32()
    assert batch.schema.field("price").type == pa.decimal128(9, 2)
    assert batch.schema.field("counts").type == pa.map_(pa.string(), pa.int64())
    assert as_python(batch.to_pylist()) == avro_decode(SCHEMA, values)


def test_avro_writes_the_bytes_fastavro_writes():
    records = [click(i) for i in range(100)]
    batch = Avro(SCHEMA).decode(pa.array(avro_encode(SCHEMA, records), pa.binary()))[0]
    values = Avro(SCHEMA).encode(batch, where="test").to_pylist()
    assert values == avro_encode(SCHEMA, records)
    # timestamps as int64 ms (the engine's convention) are written as timestamp-millis too
    ts = pa.record_batch({"user": [1], "ts": pa.array([1_700_000_000_123], pa.int64())})
    small = {"type": "record", "name": "T", "fields": [
        {"name": "user", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    assert Avro(small).encode(ts, where="test").to_pylist() == avro_encode(
        small, [{"user": 1, "ts": 1_700_000_000_123}])


def test_avro_bad_records_are_named_by_index_and_the_rest_decode():
    records = [click(i) for i in range(10)]
    values: list[bytes | None] = list(avro_encode(SCHEMA, records))
    values[2] = values[2][:5]  # truncated
    values[5] = values[5] + b"\x00\x01"  # bytes left over
    values[7] = None  # a tombstone
    batch, bad = Avro(SCHEMA).decode(pa.array(values, pa.binary()))
    assert [i for i, _ in bad] == [2, 5, 7]
    assert bad[0][1].startswith("not Avro of schema test.Click: ")
    assert bad[1][1] == "not Avro of schema test.Click: 2 bytes left after the record"
    assert bad[2][1] == TOMBSTONE
    assert batch["user"].to_pylist() == [records[i]["user"] for i in (0, 1, 3, 4, 6, 8, 9)]
    empty, bad = Avro(SCHEMA).decode(pa.array([], pa.binary()))
    assert empty.num_rows == 0 and bad == [] and empty.schema == Avro(SCHEMA).arrow_schema


def test_avro_confluent_framing_is_checked_stripped_and_prepended():
    fmt = Avro(SCHEMA, confluent_schema_id=258)
    records = [click(i) for i in range(3)]
    plain = avro_encode(SCHEMA, records)
    header = b"\x00\x00\x00\x01\x02"
    framed = [header + v for v in plain]
    batch = fmt.decode(pa.array(framed, pa.binary()))[0]
    assert fmt.encode(batch, where="test").to_pylist() == framed
    _, bad = fmt.decode(pa.array([framed[0], b"\x00\x00\x00\x01\x03" + plain[1], plain[2][:3],
                                  framed[2]], pa.binary()))
    assert [i for i, _ in bad] == [1, 2]
    assert bad[0][1] == ("not in Confluent wire format with schema id 258 "
                         "(header 0000000103)")


def test_avro_schema_as_a_json_string_or_a_file(tmp_path):
    path = tmp_path / "click.avsc"
    path.write_text(json.dumps(SCHEMA))
    assert Avro(str(path)).arrow_schema == Avro(json.dumps(SCHEMA)).arrow_schema == \
        Avro(path).arrow_schema == Avro(SCHEMA).arrow_schema
    assert Avro(str(path)) == Avro(SCHEMA)


def test_avro_mistakes_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="no file .*give the schema as a dict, a JSON string"):
        Avro(str(tmp_path / "missing.avsc"))
    with pytest.raises(ValueError, match="the top level must be a record"):
        Avro('"string"')
    with pytest.raises(ValueError, match=r"the union .* at R.v has no column type"):
        Avro({"type": "record", "name": "R", "fields": [{"name": "v", "type": ["int", "string"]}]})
    with pytest.raises(ValueError, match="not a valid schema"):
        Avro({"type": "record", "name": "R", "fields": [{"name": "v", "type": "nope"}]})
    with pytest.raises(ValueError, match="needs value_schema=, the Avro schema"):
        value_format_of("avro", where="read_kafka")
    with pytest.raises(ValueError, match="schema= .* is for JSON values"):
        value_format_of("avro", schema=pa.schema([("a", pa.int64())]), value_schema=SCHEMA,
                        where="read_kafka")
    with pytest.raises(ValueError, match=r"must be one of \['json', 'raw', 'avro', 'protobuf'\]"):
        value_format_of("xml", where="read_kafka")
    fmt = Avro(SCHEMA)
    with pytest.raises(FormatError, match="sink: the Avro schema's field.s. user, n,"):
        fmt.encode(pa.record_batch({"page": ["a"]}), where="sink")
    short = {"type": "record", "name": "S", "fields": [{"name": "n", "type": "int"}]}
    with pytest.raises(FormatError, match="sink: row 0 does not fit the Avro schema S"):
        Avro(short).encode(pa.record_batch({"n": pa.array([None], pa.int64())}), where="sink")


def test_formats_travel_pickled():
    fmt = Avro(SCHEMA, confluent_schema_id=3)
    back = pickle.loads(pickle.dumps(fmt))
    assert back == fmt and back.read_type == fmt.read_type
    Click = click_class()
    proto = pickle.loads(pickle.dumps(Protobuf(Click)))  # a class made at run time
    assert proto == Protobuf(Click)
    values = [Click(user=4, page="p").SerializeToString()]
    assert proto.decode(pa.array(values, pa.binary()))[0]["user"].to_pylist() == [4]


def test_json_and_raw_by_name():
    schema = pa.schema([("user", pa.int64())])
    assert value_format_of("json", schema=schema, where="x") == Json(schema)
    assert value_format_of("raw", where="x") == Raw()
    with pytest.raises(FormatError, match="needs a column 'value'"):
        Raw().encode(pa.record_batch({"v": [1]}), where="sink")


# -- Protobuf ---------------------------------------------------------------------------------
def click_class():
    """A message class made at run time (no protoc): every kind of field the format maps."""
    file = descriptor_pb2.FileDescriptorProto(name="click_test.proto", package="rstest",
                                              syntax="proto3")
    kind = file.enum_type.add(name="Kind")
    kind.value.add(name="VIEW", number=0)
    kind.value.add(name="BUY", number=5)
    where = file.message_type.add(name="Where")
    where.field.add(name="x", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    where.field.add(name="label", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    msg = file.message_type.add(name="Click")
    entry = msg.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    add = msg.field.add
    add(name="user", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    add(name="page", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    add(name="tags", number=3, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    add(name="kind", number=4, type=F.TYPE_ENUM, type_name=".rstest.Kind",
        label=F.LABEL_OPTIONAL)
    add(name="where", number=5, type=F.TYPE_MESSAGE, type_name=".rstest.Where",
        label=F.LABEL_OPTIONAL)
    add(name="score", number=6, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL,
        proto3_optional=True, oneof_index=0)
    msg.oneof_decl.add(name="_score")
    add(name="counts", number=7, type=F.TYPE_MESSAGE, type_name=".rstest.Click.CountsEntry",
        label=F.LABEL_REPEATED)
    add(name="blob", number=8, type=F.TYPE_BYTES, label=F.LABEL_OPTIONAL)
    add(name="ok", number=9, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    add(name="small", number=10, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
    add(name="trail", number=11, type=F.TYPE_MESSAGE, type_name=".rstest.Where",
        label=F.LABEL_REPEATED)
    add(name="kinds", number=12, type=F.TYPE_ENUM, type_name=".rstest.Kind",
        label=F.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("rstest.Click"))


def proto_click(Click, i: int):
    m = Click(user=i * 1_000_003, page=f"p{i}-ü", tags=[f"t{j}" for j in range(i % 3)],
              kind="BUY" if i % 2 else "VIEW", blob=bytes([i % 256]), ok=i % 3 == 0,
              small=i, kinds=["BUY", "VIEW"][: i % 3])
    if i % 4:
        m.where.x, m.where.label = i / 3, f"w{i}"
    if i % 5:
        m.score = i * 0.5
    for j in range(i % 3):
        m.counts[f"c{j}"] = i * j
        m.trail.add(x=float(j), label=f"l{j}")
    return m


def proto_row(m) -> dict:
    """A message as the row it must become, from protobuf's own accessors (the oracle)."""
    return {"user": m.user, "page": m.page, "tags": list(m.tags),
            "kind": m.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[m.kind].name,
            "where": {"x": m.where.x, "label": m.where.label} if m.HasField("where") else None,
            "score": m.score if m.HasField("score") else None,
            "counts": sorted(m.counts.items()), "blob": m.blob, "ok": m.ok, "small": m.small,
            "trail": [{"x": w.x, "label": w.label} for w in m.trail],
            "kinds": [m.DESCRIPTOR.fields_by_name["kinds"].enum_type.values_by_number[k].name
                      for k in m.kinds]}


def test_protobuf_decodes_what_protobuf_writes_into_the_fields_protobuf_reads():
    Click = click_class()
    messages = [proto_click(Click, i) for i in range(60)]
    values = [m.SerializeToString() for m in messages]
    batch, bad = Protobuf(Click).decode(pa.array(values, pa.binary()))
    assert bad == []
    assert batch.schema.field("kind").type == pa.string()
    assert batch.schema.field("counts").type == pa.map_(pa.string(), pa.int64())
    assert batch.schema.field("small").type == pa.uint32()
    rows = [{**row, "counts": sorted(row["counts"])} for row in batch.to_pylist()]
    assert rows == [proto_row(Click.FromString(v)) for v in values]


def test_protobuf_writes_messages_protobuf_reads_as_the_rows():
    Click = click_class()
    messages = [proto_click(Click, i) for i in range(60)]
    fmt = Protobuf(Click)
    batch = fmt.decode(pa.array([m.SerializeToString() for m in messages], pa.binary()))[0]
    values = fmt.encode(batch, where="test").to_pylist()
    assert [Click.FromString(v) for v in values] == messages
    # columns that are not fields (a Kafka source's metadata, say) are not written
    extra = fmt.encode(pa.record_batch({"user": [1], "offset": [2]}), where="test")
    assert [Click.FromString(v) for v in extra.to_pylist()] == [Click(user=1)]
    with pytest.raises(FormatError, match="no column is a field of Protobuf message "
                                          "rstest.Click .columns: offset; fields: user, page,"):
        fmt.encode(pa.record_batch({"offset": [2]}), where="test")


def test_protobuf_bad_records_are_named_by_index():
    Click = click_class()
    good = proto_click(Click, 3).SerializeToString()
    batch, bad = Protobuf(Click).decode(pa.array([good, b"\xff\xff\xff", None, good, b""],
                                                 pa.binary()))
    assert [i for i, _ in bad] == [1, 2]
    assert bad[0][1].startswith("not Protobuf rstest.Click: ")
    assert bad[1][1] == TOMBSTONE
    assert batch["user"].to_pylist() == [3_000_009, 3_000_009, 0]  # b"": every field default
    with pytest.raises(ValueError, match="give a generated message class"):
        Protobuf(dict)


def test_protobuf_confluent_framing_carries_the_schema_id_and_the_message_indexes():
    """Confluent's Protobuf wire format: magic byte 0, the id (4 bytes, big-endian), then
    the message's indexes in its file as zigzag varints, [0] as one byte 0 (the encoding of
    confluent-kafka's ProtobufSerializer._encode_varints, written out here by hand)."""
    Click = click_class()  # the second message of its file: indexes [1]
    fmt = Protobuf(Click, confluent_schema_id=300)
    header = b"\x00\x00\x00\x01\x2c" + b"\x02" + b"\x02"  # id 300; count 1, index 1
    assert fmt.header == header
    Where = type(Click().where)  # the first message of the file: indexes [0], one byte 0
    assert Protobuf(Where, confluent_schema_id=300).header == b"\x00\x00\x00\x01\x2c\x00"
    Entry = message_factory.GetMessageClass(Click.DESCRIPTOR.nested_types_by_name["CountsEntry"])
    assert Protobuf(Entry, confluent_schema_id=300).header == (  # nested in Click: [1, 0]
        b"\x00\x00\x00\x01\x2c" + b"\x04\x02\x00")
    assert confluent_header(300, [1, 0]) == b"\x00\x00\x00\x01\x2c\x04\x02\x00"
    messages = [proto_click(Click, i) for i in range(5)]
    framed = [header + m.SerializeToString() for m in messages]
    batch, bad = fmt.decode(pa.array(framed + [messages[0].SerializeToString()], pa.binary()))
    assert [i for i, _ in bad] == [5]
    assert bad[0][1].startswith("not in Confluent wire format with schema id 300")
    encoded = fmt.encode(batch, where="test").to_pylist()
    assert all(e.startswith(header) for e in encoded)
    # a map field's entries serialize in no fixed order: compare the messages, not bytes
    assert [Click.FromString(e[len(header):]) for e in encoded] == messages
    back = pickle.loads(pickle.dumps(fmt))
    assert back == fmt and back.header == header
    with pytest.raises(ValueError, match="confluent_schema_id must be a schema id"):
        Protobuf(Click, confluent_schema_id=-1)
