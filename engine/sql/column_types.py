"""sqlglot's data types as raystream's column types (:mod:`raystream.engine.sql.ast`)."""

from __future__ import annotations

from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.ast import (ArrayType, MapType, RowField, RowType, ScalarType, SqlType,
                                      TypeName)

_SCALARS = {
    exp.DType.BOOLEAN: TypeName.BOOLEAN,
    exp.DType.TINYINT: TypeName.TINYINT,
    exp.DType.SMALLINT: TypeName.SMALLINT,
    exp.DType.INT: TypeName.INT,
    exp.DType.BIGINT: TypeName.BIGINT,
    exp.DType.FLOAT: TypeName.FLOAT,
    exp.DType.DOUBLE: TypeName.DOUBLE,
    exp.DType.DECIMAL: TypeName.DECIMAL,
    exp.DType.VARCHAR: TypeName.VARCHAR,
    exp.DType.TEXT: TypeName.VARCHAR,  # STRING
    exp.DType.VARBINARY: TypeName.BYTES,
    exp.DType.BINARY: TypeName.BYTES,
    exp.DType.DATE: TypeName.DATE,
    exp.DType.TIMESTAMP: TypeName.TIMESTAMP,
    exp.DType.TIMESTAMPLTZ: TypeName.TIMESTAMP_LTZ,
}
# Flink's precision (and scale) where none is written
_DEFAULTS = {TypeName.DECIMAL: (10, 0), TypeName.TIMESTAMP: (6, None),
             TypeName.TIMESTAMP_LTZ: (6, None)}


def sql_type(data_type: exp.DataType) -> SqlType:
    """The column type of a parsed data type; one raystream does not have is a
    ``SqlError`` naming it.

    >>> import sqlglot
    >>> from raystream.engine.sql.column_types import sql_type
    >>> sql_type(sqlglot.exp.DataType.build("DECIMAL(23, 3)"))
    ScalarType(name=<TypeName.DECIMAL: 'DECIMAL'>, precision=23, scale=3)
    >>> sql_type(sqlglot.exp.DataType.build("TIME"))
    Traceback (most recent call last):
    ...
    raystream.engine.errors.SqlError: unknown column type TIME
    """
    kind = data_type.this
    inner = data_type.expressions
    if kind == exp.DType.STRUCT:
        return RowType(tuple(RowField(field.name, sql_type(_field_type(field)))
                             for field in inner))
    if kind == exp.DType.ARRAY and len(inner) == 1:
        return ArrayType(sql_type(_nested(inner[0])))
    if kind == exp.DType.MAP and len(inner) == 2:
        return MapType(sql_type(_nested(inner[0])), sql_type(_nested(inner[1])))
    name = _SCALARS.get(kind)
    if kind == exp.DType.USERDEFINED and str(data_type.args.get("kind")).upper() == "BYTES":
        name = TypeName.BYTES
    if name is None:
        raise SqlError(f"unknown column type {_written(data_type)}")
    params = [_integer(param, data_type) for param in inner]
    default_precision, default_scale = _DEFAULTS.get(name, (None, None))
    if len(params) > (2 if name is TypeName.DECIMAL else 1) or (
            params and name not in (TypeName.DECIMAL, TypeName.VARCHAR, TypeName.BYTES,
                                    TypeName.TIMESTAMP, TypeName.TIMESTAMP_LTZ)):
        raise SqlError(f"unknown column type {_written(data_type)}")
    precision = params[0] if params else default_precision
    scale = params[1] if len(params) > 1 else (0 if params else default_scale)
    return ScalarType(name, precision, scale if name is TypeName.DECIMAL else None)


def _field_type(field: exp.Expr) -> exp.DataType:
    kind = field.args.get("kind") if isinstance(field, exp.ColumnDef) else None
    if not isinstance(kind, exp.DataType):
        raise SqlError(f"a ROW field needs a name and a type, not {field.sql()!r}")
    return kind


def _nested(value: exp.Expr) -> exp.DataType:
    if not isinstance(value, exp.DataType):
        raise SqlError(f"unknown column type {value.sql()}")
    return value


def _integer(param: exp.Expr, data_type: exp.DataType) -> int:
    value = param.this if isinstance(param, exp.DataTypeParam) else param
    if not (isinstance(value, exp.Literal) and value.is_int):
        raise SqlError(f"unknown column type {_written(data_type)}")
    return int(value.name)


def _written(data_type: exp.DataType) -> str:
    """The type as the user wrote it (an unknown name, ``TIME``, ``VARCHAR(a)``)."""
    if data_type.this == exp.DType.USERDEFINED:
        return str(data_type.args.get("kind") or data_type.sql())
    return data_type.sql()
