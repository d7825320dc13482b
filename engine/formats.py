"""Value formats: how a record's bytes (a Kafka value) become Arrow columns, and back.

One frozen spec per format, each with ``decode`` (binary values -> the rows that
decoded, plus ``(index, cause)`` of those that did not) and ``encode`` (a batch ->
one binary value per row):

* :class:`Json`: one JSON object per value, all of a batch parsed in one pyarrow
  JSON read (values are looked at one by one only when the batch has a bad one,
  to find which); written with :func:`raystream.engine.json_lines.json_lines`.
* :class:`Raw`: the bytes, as column ``value``.
* :class:`Avro`: plain Avro binary (no container header: fastavro's
  ``schemaless_reader``/``schemaless_writer``) of one record schema, given as a
  dict, a JSON string or the path of an ``.avsc`` file. Its fields are the
  columns. With ``confluent_schema_id=N`` every value carries Confluent's wire
  format header (magic byte 0, then ``N`` as 4 bytes big-endian): decoding
  checks and strips it, encoding prepends it. There is no Schema Registry
  client: the one schema given decodes every record, and a record framed with
  another schema id is a bad record.
* :class:`Protobuf`: a generated message class's serialized messages (with
  ``confluent_schema_id=N``, in Confluent's framing: the 5 bytes above, then the
  message's indexes in its file). Fields are columns; enums are their names (strings),
  messages structs, repeated fields lists, maps Arrow maps. The spec carries
  the message's descriptors, not the class, so a class built at run time
  travels to the workers too.

fastavro and protobuf decode record by record; their results become Arrow
columns in one conversion per column (Avro: one ``pa.array`` over the batch's
dicts; Protobuf: one per field), never by appending rows. (Avro container files,
for ``read_files(format="avro")`` and ``sink_to_avro``, are read with the same
schema-to-Arrow mapping, in :mod:`raystream.core.avro`.)

    >>> import pyarrow as pa
    >>> fmt = Avro({"type": "record", "name": "Click",
    ...             "fields": [{"name": "user", "type": "long"},
    ...                        {"name": "page", "type": ["null", "string"]}]})
    >>> values = fmt.encode(pa.record_batch({"user": [1, 2], "page": ["home", None]}),
    ...                     where="example")
    >>> batch, bad = fmt.decode(pa.concat_arrays([values, pa.array([b"\\x02"], pa.binary())]))
    >>> batch.to_pydict(), bad
    ({'user': [1, 2], 'page': ['home', None]}, [(2, 'not Avro of schema Click: EOFError')])
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.json as pajson

from raystream.core import protobuf
from raystream.core.avro import avro_types, physical
from raystream.engine.json_lines import JsonLinesError, json_lines

pc: Any = pyarrow.compute  # its stubs name few of the kernels Arrow generates

# pyarrow's "in row N" counts rows of its read, not of the batch
JSON_BLOCK_ROW = re.compile(r"\.? in row \d+$")
TOMBSTONE = "no value (a tombstone?)"


class FormatError(ValueError):
    """A batch cannot be encoded in its format (a column missing or of the wrong type);
    the message names the operator, the column and what to do."""


@runtime_checkable
class ValueFormat(Protocol):
    """What a value format does; :class:`Json`, :class:`Raw`, :class:`Avro` and
    :class:`Protobuf` are the ones there are."""

    @property
    def name(self) -> str:
        """``"json"``, ``"raw"``, ``"avro"`` or ``"protobuf"``."""
        ...

    def decode(self, values: pa.Array) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
        """The rows of the values that decode, and ``(index, cause)`` of those that do not."""
        ...

    def encode(self, batch: pa.RecordBatch, *, where: str) -> pa.Array:
        """One value per row (binary or string); a :class:`FormatError` naming ``where``
        when the batch does not fit the format."""
        ...


def _null_values(values: pa.Array) -> list[tuple[int, str]]:
    if not values.null_count:
        return []
    return [(int(i), TOMBSTONE)
            for i in np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))]


def _without(bad: list[tuple[int, str]], n: int) -> np.ndarray:
    good = np.ones(n, dtype=bool)
    good[[i for i, _ in bad]] = False
    return good


def _unframed(values: pa.Array, header: bytes, schema_id: int) -> list[tuple[int, str]]:
    """``(index, cause)`` of the non-null values that do not start with ``header``
    (Confluent's wire format for ``schema_id``), found with one kernel over the batch."""
    heads = pc.binary_slice(values, 0, len(header))
    framed = pc.fill_null(pc.equal(heads, pa.scalar(header, pa.binary())), False)
    return [(int(i), f"not in Confluent wire format with schema id {schema_id} "
                     f"(header {heads[int(i)].as_py().hex()})")
            for i in np.flatnonzero(~framed.to_numpy(zero_copy_only=False))
            if values[int(i)].is_valid]


def _zigzag_varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def confluent_header(schema_id: int, message_indexes: list[int] | None = None) -> bytes:
    """Confluent's wire-format prefix: magic byte 0, the schema id (4 bytes, big-endian)
    and, for Protobuf, the message's indexes in its file (``[0]``, the first message, as
    one byte 0; otherwise their count and each as zigzag varints).

        >>> confluent_header(7), confluent_header(7, [0]), confluent_header(7, [1, 2])
        (b'\\x00\\x00\\x00\\x00\\x07', b'\\x00\\x00\\x00\\x00\\x07\\x00', b'\\x00\\x00\\x00\\x00\\x07\\x04\\x02\\x04')
    """
    if not 0 <= schema_id < 2 ** 31:
        raise ValueError(f"confluent_schema_id must be a schema id in [0, 2^31), not "
                         f"{schema_id}")
    head = b"\x00" + schema_id.to_bytes(4, "big")
    if message_indexes is None:
        return head
    if message_indexes == [0]:
        return head + b"\x00"
    return head + b"".join(_zigzag_varint(n) for n in [len(message_indexes), *message_indexes])


def _binary_values(values: pa.Array) -> tuple[bytes, np.ndarray]:
    """The data buffer of binary ``values`` and each value's (start, end) in it."""
    values = values.cast(pa.large_binary())
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[
        values.offset:values.offset + len(values) + 1]
    data = values.buffers()[2]
    return (data.to_pybytes() if data is not None else b""), offsets


def _from_buffer(data: bytes, ends: list[int]) -> pa.Array:
    """A binary array of the values laid end to end in ``data`` (value i ends at ends[i])."""
    offsets = np.asarray([0, *ends], dtype=np.int64)
    return pa.Array.from_buffers(pa.large_binary(), len(ends),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)]).cast(
        pa.binary())


# -- JSON and raw -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Json:
    """One JSON object per value; ``schema`` (an Arrow schema) fixes the columns' types,
    else pyarrow infers them from the batch.

        >>> import pyarrow as pa
        >>> Json(pa.schema([("user", pa.int64())])).decode(
        ...     pa.array([b'{"user": 1}', b'{"user": '])) # doctest: +NORMALIZE_WHITESPACE
        (pyarrow.RecordBatch
        user: int64
        ----
        user: [1], [(1, 'JSON parse error: Invalid value')])
    """

    schema: pa.Schema | None = None
    # timestamps written as SQL's text, 'yyyy-MM-dd HH:mm:ss.SSS' (Flink's json format, and
    # what a decoding schema's timestamp column reads), not epoch milliseconds
    timestamps_as_text: bool = False
    name: str = field(default="json", init=False)

    def decode(self, values: pa.Array) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
        schema = self.schema
        n = len(values)
        values = values.cast(pa.binary())
        # A raw newline is invalid inside a JSON string, so outside strings it is only
        # whitespace: replacing it keeps one record per line.
        lines = pc.replace_substring(values, "\n", " ")
        missing = pc.fill_null(pc.equal(pc.binary_length(lines), 0), True)
        bad: list[tuple[int, str]] = [
            (int(i), "empty value (a tombstone?)")
            for i in np.flatnonzero(missing.to_numpy(zero_copy_only=False))]
        good = _without(bad, n)
        try:
            table = _read_json(lines.filter(pa.array(good)) if bad else lines, schema)
            if table.num_rows != int(good.sum()):
                raise pa.ArrowInvalid("records and parsed rows differ in number")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            batch_error = f"{type(exc).__name__}: {exc}"
            for i in np.flatnonzero(good):  # the error path only: which records are bad?
                try:
                    one = _read_json(lines.slice(int(i), 1), schema)
                    if one.num_rows != 1:
                        raise pa.ArrowInvalid("not one JSON object")
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                    bad.append((int(i), JSON_BLOCK_ROW.sub("", str(e))))
                    good[i] = False
            if good.all():  # each parses alone, not together: the types differ between records
                raise pa.ArrowInvalid(f"the records' JSON types differ ({batch_error}); give "
                                      f"read_kafka a schema") from exc
            table = _read_json(lines.filter(pa.array(good)), schema) if good.any() else None
            bad.sort()
        if table is None:
            fields = schema if schema is not None else pa.schema([])
            return pa.RecordBatch.from_pylist([], schema=fields), bad
        return table.combine_chunks().to_batches()[0] if table.num_rows else \
            pa.RecordBatch.from_pylist([], schema=table.schema), bad

    def encode(self, batch: pa.RecordBatch, *, where: str) -> pa.Array:
        if self.timestamps_as_text:
            texts = [_timestamps_as_text(c.type) for c in batch.columns]
            batch = pa.RecordBatch.from_arrays(
                [c if t == c.type else c.cast(t) for c, t in zip(batch.columns, texts)],
                names=batch.schema.names)
        try:
            return json_lines(batch, where=where)
        except JsonLinesError as e:
            raise FormatError(str(e)) from None


def _timestamps_as_text(type_: pa.DataType) -> pa.DataType:
    """``type_`` with every timestamp in it (in a ROW too) a string: the cast to that type
    writes them as SQL's text."""
    if pa.types.is_timestamp(type_):
        return pa.string()
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(_timestamps_as_text(f.type)) for f in type_])
    if pa.types.is_list(type_):
        return pa.list_(_timestamps_as_text(type_.value_type))
    return type_


def _read_json(lines: pa.Array, schema: pa.Schema | None) -> pa.Table:
    joined = lines_buffer(lines)
    options = (pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
               if schema is not None else pajson.ParseOptions())
    # one block for the whole batch: type inference sees every record at once
    read = pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, len(joined) + 1))
    return pajson.read_json(pa.BufferReader(joined), parse_options=options, read_options=read)


def lines_buffer(lines: pa.Array) -> pa.Buffer:
    """Every value followed by a newline, in one buffer (no per-value Python loop)."""
    big = pa.large_binary()
    terminated = pc.binary_join_element_wise(
        lines.cast(big), pa.scalar(b"", big), pa.scalar(b"\n", big))
    offsets = np.frombuffer(terminated.buffers()[1], dtype=np.int64)[
        terminated.offset:terminated.offset + len(terminated) + 1]
    return terminated.buffers()[2][int(offsets[0]):int(offsets[-1])]


@dataclass(frozen=True)
class Raw:
    """The value's bytes as column ``column`` (default ``value``; and that column written as
    it is).

        >>> import pyarrow as pa
        >>> Raw().decode(pa.array([b"a"]))[0].to_pydict()
        {'value': [b'a']}
    """

    column: str = "value"
    name: str = field(default="raw", init=False)

    def decode(self, values: pa.Array) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
        return pa.record_batch([values.cast(pa.binary())], names=[self.column]), []

    def encode(self, batch: pa.RecordBatch, *, where: str) -> pa.Array:
        if self.column not in batch.schema.names:
            raise FormatError(f"{where}: value_format='raw' needs a column {self.column!r} "
                              f"(columns: {', '.join(batch.schema.names)})")
        return batch.column(self.column)


def _avro_schema_text(schema: Mapping[str, Any] | str | os.PathLike) -> str:
    if isinstance(schema, Mapping):
        return json.dumps(schema)
    if isinstance(schema, os.PathLike) or not str(schema).lstrip().startswith(("{", "[", '"')):
        path = os.fspath(schema)
        if not os.path.isfile(path):
            raise ValueError(f"Avro schema: no file {path!r}; give the schema as a dict, a JSON "
                             f"string or the path of an .avsc file")
        with open(path, encoding="utf-8") as f:
            return f.read()
    return str(schema)


@dataclass(frozen=True)
class Avro:
    """Plain Avro binary of one record schema: ``schema`` is a dict, a JSON string or the
    path of an ``.avsc`` file; its fields are the columns. ``confluent_schema_id``: values
    carry Confluent's 5-byte header (magic byte 0 + this id, big-endian), checked and
    stripped when read, prepended when written (no registry is asked: the schema given
    decodes every record). When writing, columns that are not fields of the schema are
    not written, and a field without a column is null (if it may be) or its default.

        >>> import pyarrow as pa
        >>> fmt = Avro('{"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}',
        ...            confluent_schema_id=7)
        >>> values = fmt.encode(pa.record_batch({"n": [3]}), where="example")
        >>> values.to_pylist()
        [b'\\x00\\x00\\x00\\x00\\x07\\x06']
        >>> fmt.decode(pa.array([b"\\x00\\x00\\x00\\x00\\x07\\x06", b"\\x00\\x00\\x00\\x00\\x08\\x06"]))[1]
        [(1, 'not in Confluent wire format with schema id 7 (header 0000000008)')]
    """

    schema: Mapping[str, Any] | str | os.PathLike = field(compare=False)
    confluent_schema_id: int | None = None
    name: str = field(default="avro", init=False)
    text: str = field(default="", init=False, repr=False)
    parsed: Any = field(default=None, init=False, repr=False, compare=False)
    read_schema: Any = field(default=None, init=False, repr=False, compare=False)
    read_type: pa.DataType = field(default=pa.null(), init=False, repr=False, compare=False)
    column_type: pa.DataType = field(default=pa.null(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        import fastavro
        from fastavro.schema import SchemaParseException

        text = _avro_schema_text(self.schema)
        try:
            raw = json.loads(text)
            parsed = fastavro.parse_schema(raw)
        except (ValueError, TypeError, KeyError, SchemaParseException) as exc:
            raise ValueError(f"Avro schema: not a valid schema ({type(exc).__name__}: {exc}); "
                             f"see the Avro specification's 'Schema Declaration'") from None
        if not (isinstance(raw, dict) and raw.get("type") == "record"):
            raise ValueError("Avro schema: the top level must be a record (its fields are "
                             "the columns); wrap the value in a record with one field")
        if self.confluent_schema_id is not None:
            confluent_header(self.confluent_schema_id)  # a ValueError when it is not an id
        read, column = avro_types(raw, {}, raw["name"])
        for name, value in (("text", text), ("parsed", parsed),
                            ("read_schema", fastavro.parse_schema(physical(raw))),
                            ("read_type", read), ("column_type", column)):
            object.__setattr__(self, name, value)

    def __reduce__(self) -> Any:  # ship the text, parse again where it lands
        return (Avro, (self.text, self.confluent_schema_id))

    @property
    def header(self) -> bytes | None:
        if self.confluent_schema_id is None:
            return None
        return confluent_header(self.confluent_schema_id)

    @property
    def arrow_schema(self) -> pa.Schema:
        """The columns a decoded batch has."""
        return pa.schema(list(self.column_type))

    def decode(self, values: pa.Array) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
        from fastavro import schemaless_reader

        values = values.cast(pa.binary())
        bad = _null_values(values)
        header = self.header
        if header is not None and self.confluent_schema_id is not None:
            bad += _unframed(values, header, self.confluent_schema_id)
        good = _without(bad, len(values))
        data, offsets = _binary_values(values)
        starts = offsets[:-1] + (len(header) if header is not None else 0)
        stream = io.BytesIO(data)
        schema, record_name = self.read_schema, self.parsed["name"]
        records = []
        for i in np.flatnonzero(good).tolist():  # fastavro reads one record a call
            end = int(offsets[i + 1])
            stream.seek(int(starts[i]))
            try:
                record = schemaless_reader(stream, schema)
            except Exception as exc:  # whatever the reader raises on bytes of another shape
                cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                bad.append((i, f"not Avro of schema {record_name}: {cause}"))
                good[i] = False
                continue
            if stream.tell() != end:
                bad.append((i, f"not Avro of schema {record_name}: {end - stream.tell()} "
                               f"bytes left after the record"
                            if stream.tell() < end else
                            f"not Avro of schema {record_name}: the record runs past the value"))
                good[i] = False
                continue
            records.append(record)
        bad.sort()
        column = pa.array(records, type=self.read_type)
        if self.read_type != self.column_type:
            column = column.cast(self.column_type)
        return pa.RecordBatch.from_struct_array(column), bad

    def records(self, batch: pa.RecordBatch, *, where: str) -> list[dict]:
        """The rows of ``batch`` as the records fastavro writes (the schema's fields only;
        timestamps, dates and times as the numbers Avro stores, no datetime per value)."""
        names = set(batch.schema.names)
        fields = self.parsed["fields"]
        missing = [f["name"] for f in fields if f["name"] not in names and "default" not in f
                   and not (isinstance(f["type"], list) and "null" in f["type"])]
        if missing:
            raise FormatError(f"{where}: the Avro schema's field(s) {', '.join(missing)} have "
                              f"no column (columns: {', '.join(batch.schema.names)}); add them "
                              f"or give the fields a default")
        known = [f["name"] for f in fields if f["name"] in names]
        columns = [_avro_number(batch.column(n), self.column_type.field(n).type) for n in known]
        return pa.Table.from_arrays(columns, names=known).to_pylist(maps_as_pydicts="strict")

    def encode(self, batch: pa.RecordBatch, *, where: str) -> pa.Array:
        from fastavro import schemaless_writer

        out, ends, header = io.BytesIO(), [], self.header
        schema = self.read_schema
        for i, row in enumerate(self.records(batch, where=where)):  # one record a call
            if header is not None:
                out.write(header)
            try:
                schemaless_writer(out, schema, row)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise FormatError(f"{where}: row {i} does not fit the Avro schema "
                                  f"{self.parsed['name']}: {type(exc).__name__}: {exc} "
                                  f"(row: {row})") from None
            ends.append(out.tell())
        return _from_buffer(out.getvalue(), ends)


def _avro_number(column: pa.Array, avro_type: pa.DataType) -> pa.Array:
    """A column as the Avro schema's read type wants it: a timestamp, date or time
    column as its int64/int32 in the schema's unit."""
    t = column.type
    if pa.types.is_timestamp(avro_type) and pa.types.is_timestamp(t):
        # finer than the schema's unit: truncated (as the Parquet sink truncates to us)
        return pc.cast(column, pa.timestamp(avro_type.unit, t.tz), safe=False).view(pa.int64())
    if pa.types.is_timestamp(avro_type) and pa.types.is_integer(t):
        return column.cast(pa.int64())
    if pa.types.is_date32(avro_type) and pa.types.is_date(t):
        return column.cast(pa.date32()).view(pa.int32())
    if pa.types.is_time32(avro_type) and pa.types.is_time(t):
        return column.cast(avro_type).view(pa.int32())
    if pa.types.is_time64(avro_type) and pa.types.is_time(t):
        return column.cast(avro_type).view(pa.int64())
    return column


# -- Protobuf ---------------------------------------------------------------------------------
@dataclass(frozen=True, init=False)
class Protobuf:
    """Serialized messages of a generated Protobuf message class (``Protobuf(Click)``
    for ``from clicks_pb2 import Click``). Its fields are the columns: enums as their
    names, messages as structs, repeated fields as lists, maps as maps; a field with
    presence (``optional``, a message) that is not set is null. When writing, a null is
    a field left unset, and columns that are not fields of the message are not written.
    ``confluent_schema_id``: values carry Confluent's wire-format prefix (magic byte 0,
    this id, the message's indexes in its file), checked and stripped when read,
    prepended when written (no registry is asked).

        >>> import pyarrow as pa
        >>> from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        >>> file = descriptor_pb2.FileDescriptorProto(name="ex.proto", package="ex", syntax="proto3")
        >>> msg = file.message_type.add(name="Click")
        >>> _ = msg.field.add(name="user", number=1, type=3, label=1)  # int64
        >>> Click = message_factory.GetMessageClass(
        ...     descriptor_pool.DescriptorPool().Add(file).message_types_by_name["Click"])
        >>> fmt = Protobuf(Click)
        >>> fmt.decode(fmt.encode(pa.record_batch({"user": [5, 6]}), where="example"))[0].to_pydict()
        {'user': [5, 6]}
    """

    message: str
    file_set: bytes
    confluent_schema_id: int | None = None
    name: str = "protobuf"

    def __init__(self, message_class: Any, confluent_schema_id: int | None = None) -> None:
        descriptor = getattr(message_class, "DESCRIPTOR", None)
        if descriptor is None or not hasattr(descriptor, "full_name"):
            raise ValueError(f"Protobuf: give a generated message class (from a *_pb2 module, "
                             f"or message_factory.GetMessageClass), not {message_class!r}")
        if confluent_schema_id is not None:
            confluent_header(confluent_schema_id)  # a ValueError when it is not an id
        _init_protobuf(self, descriptor.full_name, protobuf.file_set(descriptor), confluent_schema_id)
        protobuf.arrow_struct(descriptor)  # a message without a column type fails now

    def __reduce__(self) -> Any:  # the descriptors travel, the class is built where it lands
        return (_protobuf_of, (self.message, self.file_set, self.confluent_schema_id))

    @property
    def header(self) -> bytes | None:
        """Confluent's prefix of every value, or None."""
        if self.confluent_schema_id is None:
            return None
        return confluent_header(self.confluent_schema_id,
                                protobuf.message_indexes(self.message_class.DESCRIPTOR))

    @property
    def message_class(self) -> Any:
        cached = self.__dict__.get("_class")
        if cached is None:
            cached = protobuf.message_class(self.message, self.file_set)
            self.__dict__["_class"] = cached
        return cached

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema(list(protobuf.arrow_struct(self.message_class.DESCRIPTOR)))

    def decode(self, values: pa.Array) -> tuple[pa.RecordBatch, list[tuple[int, str]]]:
        from google.protobuf.message import DecodeError

        cls = self.message_class
        values = values.cast(pa.binary())
        bad = _null_values(values)
        header = self.header
        if header is not None and self.confluent_schema_id is not None:
            bad += _unframed(values, header, self.confluent_schema_id)
        skip = len(header) if header is not None else 0
        good = _without(bad, len(values))
        messages = []
        for i, value in enumerate(values.to_pylist()):
            if not good[i]:
                continue
            m = cls()
            try:
                m.ParseFromString(value[skip:] if skip else value)  # one message a call
            except (DecodeError, RuntimeError, ValueError) as exc:
                bad.append((i, f"not Protobuf {self.message}: {exc}"))
                good[i] = False
                continue
            messages.append(m)
        bad.sort()
        t = protobuf.arrow_struct(cls.DESCRIPTOR)
        return pa.RecordBatch.from_struct_array(
            protobuf.messages_to_arrow(messages, cls.DESCRIPTOR, t, None)), bad

    def encode(self, batch: pa.RecordBatch, *, where: str) -> pa.Array:
        cls = self.message_class
        descriptor = cls.DESCRIPTOR
        known = [n for n in batch.schema.names if n in descriptor.fields_by_name]
        if not known and batch.num_rows:
            raise FormatError(f"{where}: no column is a field of Protobuf message "
                              f"{self.message} (columns: {', '.join(batch.schema.names)}; "
                              f"fields: {', '.join(f.name for f in descriptor.fields)}); "
                              f"rename the columns to the message's fields")
        batch = batch.select(known)
        rows = batch.to_pylist(maps_as_pydicts="strict")
        out, ends, header = io.BytesIO(), [], self.header
        for i, row in enumerate(rows):  # protobuf builds one message a call
            try:
                m = cls(**protobuf.message_kwargs(row, descriptor))
            except (TypeError, ValueError) as exc:
                raise FormatError(f"{where}: row {i} does not fit Protobuf message "
                                  f"{self.message}: {exc} (row: {row})") from None
            if header is not None:
                out.write(header)
            out.write(m.SerializeToString())
            ends.append(out.tell())
        return _from_buffer(out.getvalue(), ends)


def _init_protobuf(spec: Protobuf, message: str, file_set: bytes,
                   confluent_schema_id: int | None) -> None:
    for name, value in (("message", message), ("file_set", file_set),
                        ("confluent_schema_id", confluent_schema_id), ("name", "protobuf")):
        object.__setattr__(spec, name, value)


def _protobuf_of(message: str, file_set: bytes, confluent_schema_id: int | None = None
                 ) -> Protobuf:
    spec = object.__new__(Protobuf)
    _init_protobuf(spec, message, file_set, confluent_schema_id)
    return spec


# -- choosing one -----------------------------------------------------------------------------
NAMES = ("json", "raw", "avro", "protobuf")


def value_format_of(value_format: ValueFormat | str, *, schema: pa.Schema | None = None,
                    value_schema: Any = None, where: str) -> ValueFormat:
    """The format a connector's ``value_format=`` (and ``schema=``, ``value_schema=``)
    name; a ValueError saying what to give otherwise.

        >>> value_format_of("avro", value_schema={"type": "record", "name": "R",
        ...     "fields": [{"name": "n", "type": "long"}]}, where="read_kafka").arrow_schema
        n: int64
        >>> value_format_of("avro", where="read_kafka")
        Traceback (most recent call last):
        ...
        ValueError: read_kafka: value_format='avro' needs value_schema=, the Avro schema (a dict, a JSON string or the path of an .avsc file)
    """
    if isinstance(value_format, ValueFormat) and not isinstance(value_format, str):
        if value_schema is not None:
            raise ValueError(f"{where}: value_schema= is for value_format='avro' or "
                             f"'protobuf' by name; {value_format!r} has its schema already")
        if schema is not None and not isinstance(value_format, Json):
            raise ValueError(f"{where}: schema= (an Arrow schema) is for JSON values; the "
                             f"columns of {value_format.name} values come from its own schema")
        if isinstance(value_format, Json) and schema is not None:
            if value_format.schema is not None and not value_format.schema.equals(schema):
                raise ValueError(f"{where}: two Arrow schemas, in Json(...) and schema=; "
                                 f"give one")
            return Json(schema)
        return value_format
    if value_format not in NAMES:
        raise ValueError(f"{where}: value_format must be one of {list(NAMES)} or a format "
                         f"(rs.formats.Avro(...), rs.formats.Protobuf(...)), not "
                         f"{value_format!r}")
    if value_format in ("json", "raw"):
        if value_schema is not None:
            raise ValueError(f"{where}: value_schema= is for 'avro' or 'protobuf'; JSON takes "
                             f"an Arrow schema as schema=")
        if value_format == "raw":
            if schema is not None:
                raise ValueError(f"{where}: schema= is for JSON values; raw values are one "
                                 f"binary column 'value'")
            return Raw()
        return Json(schema)
    if schema is not None:
        raise ValueError(f"{where}: schema= (an Arrow schema) is for JSON values; "
                         f"{value_format} values have their columns from value_schema=")
    if value_format == "avro":
        if value_schema is None:
            raise ValueError(f"{where}: value_format='avro' needs value_schema=, the Avro "
                             f"schema (a dict, a JSON string or the path of an .avsc file)")
        return Avro(value_schema)
    if value_schema is None:
        raise ValueError(f"{where}: value_format='protobuf' needs value_schema=, the "
                         f"generated message class")
    return Protobuf(value_schema)
