"""SQL column types as Arrow types, and the other way round (for a DataStream registered
as a table); what may be cast to what without a ``CAST``.

A TIMESTAMP(p) is an Arrow timestamp of the unit that holds p digits, without a time
zone; a TIMESTAMP_LTZ(p) is one in UTC. A VARCHAR of any length is an Arrow string, and
an Arrow dictionary of strings (what the Nexmark generator makes) reads as one.

    >>> import pyarrow as pa
    >>> from raystream.engine.sql.ast import ScalarType, TypeName
    >>> arrow_type(ScalarType(TypeName.TIMESTAMP, 3))
    TimestampType(timestamp[ms])
    >>> type_name(pa.decimal128(23, 3))
    'DECIMAL(23, 3)'
"""

from __future__ import annotations

import pyarrow as pa

from raystream.engine.errors import SqlError
from raystream.engine.sql.ast import (ArrayType, MapType, RowField, RowType, ScalarType, SqlType,
                                      TypeName)

_SIMPLE = {
    TypeName.BOOLEAN: pa.bool_(), TypeName.TINYINT: pa.int8(), TypeName.SMALLINT: pa.int16(),
    TypeName.INT: pa.int32(), TypeName.BIGINT: pa.int64(), TypeName.FLOAT: pa.float32(),
    TypeName.DOUBLE: pa.float64(), TypeName.VARCHAR: pa.string(), TypeName.DATE: pa.date32(),
    TypeName.BYTES: pa.binary(),
}
_NAMES = {value: name.value for name, value in _SIMPLE.items()}
_NAMES[pa.string()] = "STRING"
_NAMES[pa.large_string()] = "STRING"
_NAMES[pa.null()] = "NULL"


def _unit(precision: int | None) -> str:
    digits = 6 if precision is None else precision
    return "s" if digits == 0 else "ms" if digits <= 3 else "us" if digits <= 6 else "ns"


def arrow_type(sql: SqlType) -> pa.DataType:
    """The Arrow type of a column of SQL type ``sql``."""
    if isinstance(sql, RowType):
        return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in sql.fields])
    if isinstance(sql, ArrayType):
        return pa.list_(arrow_type(sql.element))
    if isinstance(sql, MapType):
        return pa.map_(arrow_type(sql.key), arrow_type(sql.value))
    if sql.name is TypeName.DECIMAL:
        return pa.decimal128(sql.precision or 10, sql.scale or 0)
    if sql.name is TypeName.TIMESTAMP:
        return pa.timestamp(_unit(sql.precision))
    if sql.name is TypeName.TIMESTAMP_LTZ:
        return pa.timestamp(_unit(sql.precision), tz="UTC")
    return _SIMPLE[sql.name]


def sql_type_of(arrow: pa.DataType, *, column: str) -> SqlType:
    """The SQL type of an Arrow column (a DataStream's, registered as a table)."""
    arrow = value_type(arrow)
    for name, simple in _SIMPLE.items():
        if arrow == simple:
            return ScalarType(name)
    if pa.types.is_large_string(arrow):
        return ScalarType(TypeName.VARCHAR)
    if pa.types.is_decimal(arrow):
        return ScalarType(TypeName.DECIMAL, arrow.precision, arrow.scale)
    if pa.types.is_timestamp(arrow):
        digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[arrow.unit]
        return ScalarType(TypeName.TIMESTAMP_LTZ if arrow.tz else TypeName.TIMESTAMP, digits)
    if pa.types.is_struct(arrow):
        return RowType(tuple(RowField(f.name, sql_type_of(f.type, column=f"{column}.{f.name}"))
                             for f in arrow))
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return ArrayType(sql_type_of(arrow.value_type, column=column))
    raise SqlError(f"column {column!r} is of Arrow type {arrow}, which has no SQL type")


def value_type(arrow: pa.DataType) -> pa.DataType:
    """The type a column's values have (a dictionary's values' type)."""
    return arrow.value_type if pa.types.is_dictionary(arrow) else arrow


def type_name(arrow: pa.DataType) -> str:
    """An Arrow type in SQL's words, for messages."""
    arrow = value_type(arrow)
    if arrow in _NAMES:
        return _NAMES[arrow]
    if pa.types.is_decimal(arrow):
        return f"DECIMAL({arrow.precision}, {arrow.scale})"
    if pa.types.is_timestamp(arrow):
        digits = {"s": 0, "ms": 3, "us": 6, "ns": 9}[arrow.unit]
        return f"TIMESTAMP{'_LTZ' if arrow.tz else ''}({digits})"
    if pa.types.is_struct(arrow):
        return f"ROW<{', '.join(f'{f.name} {type_name(f.type)}' for f in arrow)}>"
    if pa.types.is_list(arrow):
        return f"ARRAY<{type_name(arrow.value_type)}>"
    return str(arrow)


def is_numeric(arrow: pa.DataType) -> bool:
    arrow = value_type(arrow)
    return pa.types.is_integer(arrow) or pa.types.is_floating(arrow) or pa.types.is_decimal(arrow)


def is_string(arrow: pa.DataType) -> bool:
    arrow = value_type(arrow)
    return pa.types.is_string(arrow) or pa.types.is_large_string(arrow) or arrow == pa.null()


def is_temporal(arrow: pa.DataType) -> bool:
    arrow = value_type(arrow)
    return pa.types.is_timestamp(arrow) or pa.types.is_date(arrow)


def assignable(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether a value of ``source`` may go into a column of ``target`` without a CAST
    (Flink's implicit casts on INSERT: within numbers, within strings, within times)."""
    source, target = value_type(source), value_type(target)
    if source == target or source == pa.null():
        return True
    if is_numeric(source) and is_numeric(target):
        return True
    if is_string(source) and is_string(target):
        return True
    if is_temporal(source) and is_temporal(target):
        return True
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        return source.num_fields == target.num_fields and all(
            assignable(s.type, t.type) for s, t in zip(source, target))
    return False
