"""Avro schemas and a Protobuf message class the format tests share, with the libraries'
own writing and reading of them: the oracle a format's columns and bytes are checked
against (fastavro's ``schemaless_writer``/``schemaless_reader``, protobuf's
``SerializeToString``/``FromString``)."""

from __future__ import annotations

import io
from typing import Any

import fastavro
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor as F

TIMESTAMP_MS = {"type": "long", "logicalType": "timestamp-millis"}
# an event of tests/test_kafka.py (k, v, i, ts), and a note and tags that are sometimes empty
EVENT_AVRO = {"type": "record", "name": "Event", "namespace": "rstest", "fields": [
    {"name": "k", "type": "long"}, {"name": "v", "type": "long"}, {"name": "i", "type": "long"},
    {"name": "ts", "type": TIMESTAMP_MS},
    {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}]}
# a running sum's update: the event's key, sum, input id, source partition and count
SUMS_AVRO = {"type": "record", "name": "Sum", "namespace": "rstest", "fields": [
    {"name": "k", "type": "long"}, {"name": "v", "type": "long"}, {"name": "i", "type": "long"},
    {"name": "p", "type": "int"}, {"name": "n", "type": "long"}]}


def avro_encode(schema: dict, records: list[dict], header: bytes = b"") -> list[bytes]:
    """Each record as fastavro writes it (after ``header``, Confluent's framing)."""
    parsed = fastavro.parse_schema(schema)
    out = []
    for record in records:
        buf = io.BytesIO(header)
        buf.seek(len(header))
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def avro_decode(schema: dict, values: list[bytes]) -> list[dict]:
    """Each value as fastavro reads it."""
    parsed = fastavro.parse_schema(schema)
    return [fastavro.schemaless_reader(io.BytesIO(v), parsed) for v in values]


def event_message_class() -> Any:
    """The event as a Protobuf message class built at run time (no protoc): ``note`` has
    presence (proto3 ``optional``), ``tags`` is repeated."""
    file = descriptor_pb2.FileDescriptorProto(name="rstest_event.proto", package="rstest",
                                              syntax="proto3")
    msg = file.message_type.add(name="Event")
    for number, name in enumerate(("k", "v", "i", "ts"), start=1):
        msg.field.add(name=name, number=number, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.field.add(name="note", number=5, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL,
                  proto3_optional=True, oneof_index=0)
    msg.oneof_decl.add(name="_note")
    msg.field.add(name="tags", number=6, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("rstest.Event"))


def event_message(cls: Any, record: dict) -> Any:
    """A record of :data:`EVENT_AVRO`'s fields (``ts`` in ms) as an event message."""
    return cls(**{k: v for k, v in record.items() if v is not None})


def proto_decode(cls: Any, values: list[bytes]) -> list[dict]:
    """Each value as protobuf reads it, as a row: a field with presence that is not set is
    None, a repeated field a list."""
    rows = []
    for value in values:
        m = cls.FromString(value)
        rows.append({f.name: (list(getattr(m, f.name)) if f.name == "tags"
                              else getattr(m, f.name) if not f.has_presence
                              or m.HasField(f.name) else None)
                     for f in cls.DESCRIPTOR.fields})
    return rows
