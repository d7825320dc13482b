"""Avro schemas as Arrow types, and Avro container files as Arrow batches (fastavro).

What the Kafka value formats (:mod:`raystream.engine.formats`), the file source and
sink, and the committed-output reader share, so it sits in the lowest layer.

    >>> avro_types({"type": "record", "name": "R", "fields": [
    ...     {"name": "n", "type": "long"},
    ...     {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}, {}, "R")
    (StructType(struct<n: int64, ts: int64>), StructType(struct<n: int64, ts: timestamp[ms, tz=UTC]>))
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pyarrow as pa

# Logical types read as their underlying int/long and cast to the Arrow type in one go
# (fastavro would make a datetime per value).
_CAST_LOGICAL = {"timestamp-millis": pa.timestamp("ms", tz="UTC"),
                 "timestamp-micros": pa.timestamp("us", tz="UTC"),
                 "local-timestamp-millis": pa.timestamp("ms"),
                 "local-timestamp-micros": pa.timestamp("us"),
                 "date": pa.date32(), "time-millis": pa.time32("ms"),
                 "time-micros": pa.time64("us")}
_AVRO_PRIMITIVE = {"null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(),
                   "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
                   "bytes": pa.binary(), "string": pa.string()}


def avro_types(schema: Any, names: dict[str, tuple[pa.DataType, pa.DataType]],
               where: str) -> tuple[pa.DataType, pa.DataType]:
    """(the type fastavro's dicts are read as, the column's type) of an Avro schema; they
    differ where a logical type is read as its number and cast."""
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVE:
            return _AVRO_PRIMITIVE[schema], _AVRO_PRIMITIVE[schema]
        if schema in names:
            return names[schema]
        raise ValueError(f"Avro schema: unknown type {schema!r} at {where}")
    if isinstance(schema, list):  # a union: only null and one other type map to a column
        others = [s for s in schema if s != "null"]
        if len(others) != 1:
            raise ValueError(f"Avro schema: the union {json.dumps(schema)} at {where} has no "
                             f"column type (only [\"null\", T] unions do); make it one type "
                             f"or read the value with value_format='raw'")
        return avro_types(others[0], names, where)
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical in _CAST_LOGICAL and kind in ("int", "long"):
        return _AVRO_PRIMITIVE[kind], _CAST_LOGICAL[logical]
    if logical == "decimal" and kind in ("bytes", "fixed"):
        t = pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0)))
        if kind == "fixed":
            names[schema["name"]] = (t, t)
        return t, t
    if kind == "record":
        # a name registered before its fields: a recursive record fails below, clearly
        fields = [(f["name"], avro_types(f["type"], names, f"{where}.{f['name']}"))
                  for f in schema["fields"]]
        types = (pa.struct([(n, t[0]) for n, t in fields]),
                 pa.struct([(n, t[1]) for n, t in fields]))
        names[schema["name"]] = types
        return types
    if kind == "enum":
        names[schema["name"]] = (pa.string(), pa.string())
        return pa.string(), pa.string()
    if kind == "fixed":
        t = pa.binary(int(schema["size"]))
        names[schema["name"]] = (t, t)
        return t, t
    if kind == "array":
        read, column = avro_types(schema["items"], names, f"{where}[]")
        return pa.list_(read), pa.list_(column)
    if kind == "map":
        read, column = avro_types(schema["values"], names, f"{where}{{}}")
        return pa.map_(pa.string(), read), pa.map_(pa.string(), column)
    return avro_types(kind, names, where)  # {"type": "long"} and the like


def physical(schema: Any) -> Any:
    """The schema with the logical types of :data:`_CAST_LOGICAL` taken off (same bytes)."""
    if isinstance(schema, list):
        return [physical(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("logicalType") in _CAST_LOGICAL:
        return {k: v for k, v in schema.items() if k != "logicalType"}
    out = dict(schema)
    if "fields" in out:
        out["fields"] = [{**f, "type": physical(f["type"])} for f in out["fields"]]
    for key in ("items", "values"):
        if key in out:
            out[key] = physical(out[key])
    return out


# -- Avro container files ---------------------------------------------------------------------
class AvroFileError(pa.ArrowInvalid):
    """An Avro container file that cannot be read; ``row`` is the 1-based record where
    reading stopped (None: its header)."""

    def __init__(self, message: str, row: int | None = None) -> None:
        super().__init__(message)
        self.row = row


def _container_reader(stream: Any) -> tuple[Any, pa.Schema]:
    import fastavro

    try:
        reader = fastavro.reader(stream)
        raw = json.loads(reader.metadata["avro.schema"])
    except Exception as exc:  # whatever fastavro raises on a file of another kind
        raise AvroFileError(f"not an Avro container file ({type(exc).__name__}: {exc})") from exc
    if not (isinstance(raw, dict) and raw.get("type") == "record"):
        raise AvroFileError("the file's Avro schema is not a record: its values have no "
                            "columns")
    try:
        column_type = avro_types(raw, {}, raw["name"])[1]
    except ValueError as exc:
        raise AvroFileError(str(exc)) from exc
    return reader, pa.schema(list(column_type))


def avro_file_schema(stream: Any) -> pa.Schema:
    """The columns of an Avro container file, from the schema in its header.

        >>> import io, fastavro
        >>> f = io.BytesIO()
        >>> fastavro.writer(f, {"type": "record", "name": "R",
        ...                     "fields": [{"name": "n", "type": "long"}]}, [{"n": 1}])
        >>> _ = f.seek(0); avro_file_schema(f)
        n: int64
    """
    return _container_reader(stream)[1]


def avro_file_batches(stream: Any, batch_size: int) -> Iterator[pa.RecordBatch]:
    """The records of an Avro container file (any codec fastavro reads) as batches of
    ``batch_size`` rows: fastavro yields records one by one, each batch is one
    conversion of its dicts. A file it cannot read raises :class:`AvroFileError`."""
    reader, schema = _container_reader(stream)
    struct = pa.struct(list(schema))
    records: list = []
    row = 0
    try:
        for record in reader:  # fastavro decodes a record a step
            records.append(record)
            if len(records) == batch_size:
                row += len(records)
                yield pa.RecordBatch.from_struct_array(pa.array(records, type=struct))
                records = []
    except AvroFileError:
        raise
    except Exception as exc:
        raise AvroFileError(f"{type(exc).__name__}: {exc}", row=row + len(records) + 1) from exc
    if records:
        yield pa.RecordBatch.from_struct_array(pa.array(records, type=struct))


