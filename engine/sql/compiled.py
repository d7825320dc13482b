"""A compiled SQL expression (:class:`Compiled`) and the helpers that build one from
others: typing by a trial run on empty arrays, constant folding, implicit casts. The
expression compiler (:mod:`~raystream.engine.sql.expressions`) and the function table
(:mod:`~raystream.engine.sql.functions`) both build on it.

    >>> import pyarrow as pa, pyarrow.compute as pc, sqlglot
    >>> one = literal(1, pa.int64(), "1")
    >>> combine(sqlglot.parse_one("1 + 1"), pc.add, one, one).constant
    2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeAlias

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.dialect import Flink
from raystream.engine.sql.arrow_types import (is_numeric, is_string, is_temporal, type_name,
                                              value_type)
from raystream.engine.sql.schema import RelSchema

Value: TypeAlias = pa.Array | pa.ChunkedArray | pa.Scalar
Evaluate: TypeAlias = Callable[[pa.RecordBatch], Value]

NO_VALUE = object()


@dataclass(frozen=True)
class Compiled:
    """An expression ready to run: ``evaluate(batch)`` is an array of ``batch``'s length
    or a scalar; ``constant`` is its value where it is known (``NO_VALUE`` if not);
    ``nullable``: False where it is never NULL."""

    type: pa.DataType
    evaluate: Evaluate
    sql: str
    constant: Any = NO_VALUE
    nullable: bool = True

    @property
    def is_constant(self) -> bool:
        return self.constant is not NO_VALUE


_FLINK = Flink()


def sql_text(expr: exp.Expr) -> str:
    """An expression as Flink SQL (backticks, for messages and EXPLAIN)."""
    return expr.sql(dialect=_FLINK)


def column_ref(name: str) -> exp.Column:
    """A reference to column ``name`` (quoted only where it must be)."""
    return exp.column(name, quoted=not name.isidentifier())


def as_array(value: Value, length: int) -> pa.Array | pa.ChunkedArray:
    """A kernel's result as a column of ``length`` rows (a scalar repeated)."""
    if isinstance(value, pa.Scalar):
        return pa.repeat(value, length) if value.is_valid else pa.nulls(length, value.type)
    return value


def literal(value: Any, type_: pa.DataType, sql: str) -> Compiled:
    scalar = pa.scalar(value, type_)
    return Compiled(type_, lambda batch: scalar, sql, value, nullable=value is None)


def plain(value: Value) -> Value:
    """A dictionary column decoded (most kernels take plain strings only)."""
    if isinstance(value, pa.Scalar):
        return value.value if isinstance(value, pa.DictionaryScalar) else value
    if pa.types.is_dictionary(value.type):
        return value.dictionary_decode() if isinstance(value, pa.Array) else pc.cast(  # pyright: ignore[reportAttributeAccessIssue]
            value, value.type.value_type)
    return value


def field_of(compiled: Compiled, name: str, sql: str) -> Compiled:
    struct = value_type(compiled.type)
    if not pa.types.is_struct(struct):
        raise SqlError(f"{sql}: {compiled.sql} is {type_name(compiled.type)}, which has no "
                       f"field {name!r}")
    index = struct.get_field_index(name)
    if index < 0:
        raise SqlError(f"{sql}: {compiled.sql} has no field {name!r} (its fields: "
                       f"{', '.join(f.name for f in struct)})")
    field_type = struct.field(index).type
    nullable = compiled.nullable or struct.field(index).nullable
    if compiled.is_constant:
        value = None if compiled.constant is None else compiled.constant.get(name)
        return literal(value, field_type, sql)
    outer = compiled.evaluate
    return Compiled(field_type, lambda batch: pc.struct_field(outer(batch), [index]),  # pyright: ignore[reportAttributeAccessIssue]
                    sql, nullable=nullable)


def require(expr: exp.Expr, what: str, kinds: str, *operands: Compiled,
            test: Callable[[pa.DataType], bool]) -> None:
    if not all(test(o.type) or value_type(o.type) == pa.null() for o in operands):
        types = " and ".join(type_name(o.type) for o in operands)
        raise SqlError(f"{sql_text(expr)}: {what} takes {kinds}, not {types}")


def comparable(a: pa.DataType, b: pa.DataType) -> bool:
    a, b = value_type(a), value_type(b)
    return (a == b or pa.null() in (a, b) or (is_numeric(a) and is_numeric(b))
            or (is_string(a) and is_string(b)) or (is_temporal(a) and is_temporal(b)))


def decimal_pair(left: Compiled, right: Compiled) -> tuple[Compiled, Compiled]:
    """A decimal and an integer: the integer as a decimal (Arrow's decimal kernels take
    decimals only, as SQL's arithmetic does)."""
    lt, rt = value_type(left.type), value_type(right.type)
    if pa.types.is_decimal(lt) and pa.types.is_integer(rt):
        return left, cast_to(right, pa.decimal128(19 if rt.bit_width == 64 else 10, 0))
    if pa.types.is_decimal(rt) and pa.types.is_integer(lt):
        return cast_to(left, pa.decimal128(19 if lt.bit_width == 64 else 10, 0)), right
    if pa.types.is_decimal(lt) and pa.types.is_floating(rt):
        return cast_to(left, pa.float64()), right
    if pa.types.is_decimal(rt) and pa.types.is_floating(lt):
        return left, cast_to(right, pa.float64())
    return left, right


def common_type(expr: exp.Expr, types: list[pa.DataType]) -> pa.DataType:
    """The type CASE's or COALESCE's operands all become."""
    known = [value_type(t) for t in types if value_type(t) != pa.null()]
    if not known:
        return pa.null()
    if all(t == known[0] for t in known):
        return known[0]
    if all(is_string(t) for t in known):
        return pa.string()
    if all(is_numeric(t) for t in known):
        if any(pa.types.is_floating(t) for t in known):
            return pa.float64()
        if any(pa.types.is_decimal(t) for t in known):
            scale = max((t.scale for t in known if pa.types.is_decimal(t)), default=0)
            return pa.decimal128(38, scale)
        return max(known, key=lambda t: t.bit_width)
    raise SqlError(f"{sql_text(expr)}: its values have no common type "
                   f"({', '.join(type_name(t) for t in types)})")


def cast_to(compiled: Compiled, target: pa.DataType, *, sql: str | None = None,
            explicit: bool = False) -> Compiled:
    source = compiled.type
    if value_type(source) == target and not explicit:
        return compiled
    sql = sql or compiled.sql
    if compiled.is_constant:
        try:
            value = pa.scalar(compiled.constant, value_type(source)).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise SqlError(f"{sql}: cannot cast {compiled.sql} to {type_name(target)}: "
                           f"{error}") from None
        return literal(value.as_py(), target, sql)
    inner = compiled.evaluate
    cast = Compiled(target, lambda batch: pc.cast(plain(inner(batch)), target), sql)  # pyright: ignore[reportAttributeAccessIssue]
    try:
        pc.cast(pa.array([], value_type(source)), target)  # pyright: ignore[reportAttributeAccessIssue]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise SqlError(f"{sql}: cannot cast {type_name(source)} to {type_name(target)}") from None
    return cast


def combine(expr: exp.Expr, kernel: Callable[..., Value], *operands: Compiled,
            sql: str | None = None, nullable: bool | None = None) -> Compiled:
    """``kernel`` over ``operands``' values (dictionaries decoded), typed by trying it on
    empty arrays; folded when every operand is a constant."""
    sql = sql or sql_text(expr)
    evaluates = [o.evaluate for o in operands]
    try:
        probe = kernel(*[pa.array([], value_type(o.type)) for o in operands])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        types = ", ".join(type_name(o.type) for o in operands)
        raise SqlError(f"{sql}: no such operation on {types} ({error})") from None
    if all(o.is_constant for o in operands):
        value = kernel(*[pa.scalar(o.constant, value_type(o.type)) for o in operands])
        return literal(value.as_py(), value.type, sql)

    def evaluate(batch: pa.RecordBatch) -> Value:
        return kernel(*[plain(e(batch)) for e in evaluates])
    # (a NULL in, a NULL out: most kernels; those that make NULLs of values say so)
    nulls = any(o.nullable for o in operands) if nullable is None else nullable
    return Compiled(probe.type, evaluate, sql, nullable=nulls)


def probed(compiled: Compiled, schema: RelSchema) -> Compiled:
    """``compiled`` after a run on an empty batch of ``schema``'s columns (a type error
    raises here, at planning, naming the expression)."""
    empty = pa.RecordBatch.from_pylist([], schema=schema.arrow())
    try:
        compiled.evaluate(empty)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
        raise SqlError(f"{compiled.sql}: {error}") from None
    return compiled

