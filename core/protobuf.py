"""Protobuf messages as Arrow columns and back, by their descriptors (the protobuf
package, imported only when a Protobuf format is used).

What the Kafka value format :class:`raystream.engine.formats.Protobuf` needs of a
message class: a descriptor set that ships it to workers (:func:`file_set`,
:func:`message_class`), its Arrow type (:func:`arrow_struct`: enums as names, nested
messages as structs, repeated fields as lists, maps as Arrow maps), a batch of messages
as a struct column (:func:`messages_to_arrow`) and a row as constructor arguments
(:func:`message_kwargs`), and Confluent's message indexes (:func:`message_indexes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

pc: Any = pyarrow.compute  # its stubs name few of the kernels Arrow generates


def file_set(descriptor: Any) -> bytes:
    """A serialized FileDescriptorSet of the message's file and every file it imports,
    imports first."""
    from google.protobuf import descriptor_pb2

    files, seen = [], set()

    def add(file: Any) -> None:
        if file.name in seen:
            return
        seen.add(file.name)
        for dep in file.dependencies:
            add(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        files.append(proto)
    add(descriptor.file)
    return descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()


def message_class(full_name: str, file_set: bytes) -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(file_set).file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def _repeated(f: Any) -> bool:
    is_repeated = getattr(f, "is_repeated", None)  # protobuf >= 6; .label before
    return bool(is_repeated) if is_repeated is not None else f.label == f.LABEL_REPEATED


def _is_map(f: Any) -> bool:
    return (f.message_type is not None and f.message_type.GetOptions().map_entry
            and _repeated(f))


def _proto_scalar(f: Any) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    table = {F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float32(), F.TYPE_INT64: pa.int64(),
             F.TYPE_SINT64: pa.int64(), F.TYPE_SFIXED64: pa.int64(), F.TYPE_UINT64: pa.uint64(),
             F.TYPE_FIXED64: pa.uint64(), F.TYPE_INT32: pa.int32(), F.TYPE_SINT32: pa.int32(),
             F.TYPE_SFIXED32: pa.int32(), F.TYPE_UINT32: pa.uint32(),
             F.TYPE_FIXED32: pa.uint32(), F.TYPE_BOOL: pa.bool_(), F.TYPE_STRING: pa.string(),
             F.TYPE_BYTES: pa.binary(), F.TYPE_ENUM: pa.string()}
    return table[f.type]


def _proto_type(f: Any, within: tuple[str, ...]) -> pa.DataType:
    """The Arrow type of a field (its element's, for the repeated)."""
    if f.message_type is None:
        return _proto_scalar(f)
    if _is_map(f):
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return pa.map_(_proto_scalar(key), _proto_type(value, within))
    return arrow_struct(f.message_type, within)


def arrow_struct(message: Any, within: tuple[str, ...] = ()) -> pa.StructType:
    if message.full_name in within:
        raise ValueError(f"Protobuf: message {message.full_name} contains itself "
                         f"({' > '.join(within + (message.full_name,))}); a recursive message "
                         f"has no column type: read it with value_format='raw'")
    inner = within + (message.full_name,)
    fields = []
    for f in message.fields:
        t = _proto_type(f, inner)
        fields.append((f.name, pa.list_(t) if _repeated(f) and not _is_map(f) else t))
    return pa.struct(fields)


def _proto_values(values: list, f: Any, t: pa.DataType) -> pa.Array:
    """The Arrow array of one field's values (one element per value, none null)."""
    if f.message_type is None:
        if f.enum_type is not None:  # numbers -> names, in one take
            numbers = sorted(v.number for v in f.enum_type.values)
            names = pa.array([f.enum_type.values_by_number[n].name for n in numbers], pa.string())
            got = np.asarray(values, dtype=np.int64)
            where = np.searchsorted(numbers, got).clip(0, len(numbers) - 1)
            known = np.asarray(numbers, dtype=np.int64)[where] == got
            return names.take(pa.array(where, mask=~known))  # an unknown number: null
        return pa.array(values, type=t)
    if _is_map(f):
        key_f, value_f = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        lengths = np.fromiter((len(m) for m in values), np.int64, len(values))
        keys = [k for m in values for k in m]
        items = [m[k] for m in values for k in m]
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        return pa.MapArray.from_arrays(offsets, _proto_values(keys, key_f, t.key_type),
                                       _proto_values(items, value_f, t.item_type))
    return messages_to_arrow(values, f.message_type, t, None)


def messages_to_arrow(messages: list, descriptor: Any, t: pa.StructType,
                    mask: np.ndarray | None) -> pa.Array:
    """A struct column of messages, a child array per field (``mask``: which are null)."""
    children = []
    for f, child in zip(descriptor.fields, t):
        name = f.name
        if _repeated(f) and not _is_map(f):
            lists = [getattr(m, name) for m in messages]
            lengths = np.fromiter((len(x) for x in lists), np.int64, len(lists))
            flat = [v for x in lists for v in x]
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            children.append(pa.ListArray.from_arrays(
                offsets, _proto_values(flat, f, child.type.value_type)))
            continue
        got = [getattr(m, name) for m in messages]
        if f.has_presence and not _is_map(f):
            absent = np.fromiter((not m.HasField(name) for m in messages), bool, len(messages))
            if absent.any():
                if f.message_type is not None:
                    children.append(messages_to_arrow(got, f.message_type, child.type, absent))
                    continue
                column = _proto_values(got, f, child.type)
                children.append(pc.if_else(pa.array(absent), pa.nulls(len(got), child.type),
                                           column))
                continue
        children.append(_proto_values(got, f, child.type))
    return pa.StructArray.from_arrays(children, fields=list(t),
                                      mask=pa.array(mask) if mask is not None else None)


def message_indexes(descriptor: Any) -> list[int]:
    """Where a message is declared in its file: its index among the file's messages, then
    among each enclosing message's nested messages (what Confluent's framing carries)."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto()
    descriptor.file.CopyToProto(proto)
    package = descriptor.file.package
    names = descriptor.full_name[len(package) + 1 if package else 0:].split(".")
    indexes, declared = [], proto.message_type
    for name in names:
        i = [m.name for m in declared].index(name)
        indexes.append(i)
        declared = declared[i].nested_type
    return indexes


def message_kwargs(row: dict, descriptor: Any) -> dict:
    """A row (from ``to_pylist``, maps as dicts) as the message constructor's arguments:
    nulls left out, nested rows likewise."""
    out = {}
    for name, value in row.items():
        if value is None:
            continue
        f = descriptor.fields_by_name[name]
        if f.message_type is not None:
            if _is_map(f):
                value_f = f.message_type.fields_by_name["value"]
                value = {k: _proto_nested(v, value_f) for k, v in value.items()}
            elif _repeated(f):
                value = [message_kwargs(v, f.message_type) for v in value if v is not None]
            else:
                value = message_kwargs(value, f.message_type)
        out[name] = value
    return out


def _proto_nested(value: Any, f: Any) -> Any:
    return message_kwargs(value, f.message_type) if f.message_type is not None else value
