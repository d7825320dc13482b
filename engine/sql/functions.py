"""Flink SQL's scalar functions, each a pyarrow.compute kernel (or a few) over whole
columns. :func:`scalar_function` finds the one a parsed call names; a user function
(``CREATE FUNCTION``, ``env.create_temporary_function``) is looked up by the compiler
before these.

String functions on a dictionary column (the Nexmark generator's ``channel`` and
``url``) run on its dictionary only and keep its indices: a column of a few distinct
values costs a few calls, whatever its length.

    >>> import pyarrow as pa, sqlglot
    >>> from raystream.engine.sql.expressions import Scope, compile_expression
    >>> from raystream.engine.sql.schema import Field, RelSchema
    >>> scope = Scope(RelSchema((Field("url", pa.string()),)))
    >>> f = compile_expression(sqlglot.parse_one("SPLIT_INDEX(url, '/', 3)"), scope)
    >>> f.evaluate(pa.record_batch({"url": ["https://a/b/c/d", "x/y"]})).to_pylist()
    ['b', None]
"""

from __future__ import annotations

import re
import time
from typing import Callable, TypeAlias

import numpy as np
import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.arrow_types import is_numeric, is_string, is_temporal
from raystream.engine.sql.compiled import Compiled, Value, combine, require, sql_text

Compile: TypeAlias = Callable[[exp.Expr], Compiled]
Function: TypeAlias = Callable[[Compile, exp.Expr], Compiled]


def _arguments(expr: exp.Expr) -> list[exp.Expr]:
    if isinstance(expr, exp.Anonymous):
        return list(expr.expressions)
    return [v for k, v in expr.args.items() if v is not None and k != "safe"
            for v in (v if isinstance(v, list) else [v]) if isinstance(v, exp.Expr)]


def _constant_argument(compiled: Compiled, expr: exp.Expr, what: str) -> object:
    if not compiled.is_constant:
        raise SqlError(f"{sql_text(expr)}: {what} must be a constant")
    return compiled.constant


def _on_strings(kernel: Callable[[pa.Array], pa.Array]) -> Callable[[Value], Value]:
    """A one-string kernel that maps a dictionary column's dictionary only."""
    def apply(value: Value) -> Value:
        if isinstance(value, pa.DictionaryArray):
            return pa.DictionaryArray.from_arrays(value.indices, kernel(value.dictionary))
        if isinstance(value, pa.ChunkedArray):
            return pa.chunked_array([apply(chunk) for chunk in value.chunks], type=None)
        return kernel(value)
    return apply


def _string_function(name: str, kernel: Callable[[pa.Array], pa.Array]) -> Function:
    def function(compile: Compile, expr: exp.Expr) -> Compiled:
        arguments = _arguments(expr)
        if len(arguments) != 1:
            raise SqlError(f"{sql_text(expr)}: {name} takes one argument")
        operand = compile(arguments[0])
        require(expr, name, "a string", operand, test=is_string)
        return _unplain(expr, _on_strings(kernel), operand)
    return function


def _unplain(expr: exp.Expr, kernel: Callable[[Value], Value], operand: Compiled) -> Compiled:
    """Like ``combine`` for a kernel that takes dictionaries itself (not decoded)."""
    if operand.is_constant:
        return combine(expr, kernel, operand)
    inner = operand.evaluate
    probe = kernel(pa.array([], operand.type))  # (a dictionary stays one: typed as it runs)
    return Compiled(probe.type, lambda batch: kernel(inner(batch)), sql_text(expr))


def _time_part(name: str, kernel: Callable[[Value], Value]) -> Function:
    def function(compile: Compile, expr: exp.Expr) -> Compiled:
        operand = compile(_arguments(expr)[0])
        require(expr, name, "a timestamp", operand, test=is_temporal)
        return combine(expr, lambda a: pc.cast(kernel(a), pa.int64()), operand)  # pyright: ignore[reportAttributeAccessIssue]
    return function


def _numeric(name: str, kernel: Callable[[Value], Value]) -> Function:
    def function(compile: Compile, expr: exp.Expr) -> Compiled:
        operand = compile(_arguments(expr)[0])
        require(expr, name, "a number", operand, test=is_numeric)
        return combine(expr, kernel, operand)
    return function


def _regexp_extract(compile: Compile, expr: exp.Expr) -> Compiled:
    subject, pattern = compile(expr.this), compile(expr.expression)
    group_expr = expr.args.get("group")
    group = 0 if group_expr is None else _constant_argument(compile(group_expr), expr,
                                                           "REGEXP_EXTRACT's group")
    regex = _constant_argument(pattern, expr, "REGEXP_EXTRACT's pattern")
    require(expr, "REGEXP_EXTRACT", "strings", subject, pattern, test=is_string)
    named = _only_group(str(regex), int(str(group or 0)), expr)

    def extract(strings: pa.Array) -> pa.Array:
        return pc.struct_field(pc.extract_regex(strings, named), [0])  # pyright: ignore[reportAttributeAccessIssue]
    return _unplain(expr, _on_strings(extract), subject)


def _only_group(regex: str, group: int, expr: exp.Expr) -> str:
    """``regex`` with capturing group ``group`` named and the others not capturing (Arrow's
    ``extract_regex`` returns named groups; Java's regexes number them)."""
    out, count, i, in_class = [], 0, 0, False
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(" and not regex.startswith("(?", i):
            count += 1
            out.append("(?P<g>" if count == group else "(?:")
            i += 1
            continue
        out.append(char)
        i += 1
    if group == 0:
        return f"(?P<g>{''.join(out)})"
    if group > count:
        raise SqlError(f"{sql_text(expr)}: the pattern has {count} groups, not {group}")
    return "".join(out)


def _split_index(compile: Compile, expr: exp.Expr) -> Compiled:
    arguments = [compile(a) for a in _arguments(expr)]
    if len(arguments) != 3:
        raise SqlError(f"{sql_text(expr)}: SPLIT_INDEX takes a string, a separator and an index")
    subject, separator, index = arguments
    sep = str(_constant_argument(separator, expr, "SPLIT_INDEX's separator"))
    at = int(_constant_argument(index, expr, "SPLIT_INDEX's index"))  # pyright: ignore[reportArgumentType]
    require(expr, "SPLIT_INDEX", "a string", subject, test=is_string)

    def split(strings: pa.Array) -> pa.Array:
        lists = pc.split_pattern(strings, sep)  # pyright: ignore[reportAttributeAccessIssue]
        if isinstance(lists, pa.ChunkedArray):
            lists = lists.combine_chunks()
        offsets = lists.offsets.to_numpy()
        position = offsets[:-1] + at
        inside = (position < offsets[1:]) & (at >= 0)
        values = lists.values.take(pa.array(np.where(inside, position, 0))) if len(
            lists.values) else pa.nulls(len(strings), pa.string())
        mask = pa.array(~inside) if not lists.null_count else pc.or_(  # pyright: ignore[reportAttributeAccessIssue]
            pa.array(~inside), lists.is_null())
        return pc.if_else(mask, pa.scalar(None, pa.string()), values)  # pyright: ignore[reportAttributeAccessIssue]
    return _unplain(expr, _on_strings(split), subject)


def _concat(compile: Compile, expr: exp.Expr) -> Compiled:
    operands = [compile(a) for a in _arguments(expr)]
    require(expr, "CONCAT", "strings", *operands, test=is_string)
    return combine(expr, lambda *a: pc.binary_join_element_wise(*a, ""), *operands)  # pyright: ignore[reportAttributeAccessIssue]


def _substring(compile: Compile, expr: exp.Expr) -> Compiled:
    subject = compile(expr.this)
    start = int(_constant_argument(compile(expr.args["start"]), expr, "SUBSTRING's start"))  # pyright: ignore[reportArgumentType]
    length_expr = expr.args.get("length")
    length = None if length_expr is None else int(_constant_argument(  # pyright: ignore[reportArgumentType]
        compile(length_expr), expr, "SUBSTRING's length"))
    require(expr, "SUBSTRING", "a string", subject, test=is_string)
    begin = max(start - 1, 0)  # SQL counts from 1
    stop = None if length is None else begin + length

    def substring(strings: pa.Array) -> pa.Array:
        return pc.utf8_slice_codeunits(strings, begin, stop)  # pyright: ignore[reportAttributeAccessIssue]
    return _unplain(expr, _on_strings(substring), subject)


def _replace(compile: Compile, expr: exp.Expr) -> Compiled:
    subject = compile(expr.this)
    old = str(_constant_argument(compile(expr.expression), expr, "REPLACE's search string"))
    new = str(_constant_argument(compile(expr.args["replacement"]), expr, "REPLACE's replacement"))
    require(expr, "REPLACE", "a string", subject, test=is_string)
    return _unplain(expr, _on_strings(
        lambda s: pc.replace_substring(s, old, new)), subject)  # pyright: ignore[reportAttributeAccessIssue]


def _extract(compile: Compile, expr: exp.Expr) -> Compiled:
    part = expr.this.name.upper()
    kernel = _TIME_PARTS.get(part)
    if kernel is None:
        raise SqlError(f"{sql_text(expr)}: EXTRACT has no {part}")
    operand = compile(expr.expression)
    require(expr, "EXTRACT", "a timestamp", operand, test=is_temporal)
    return combine(expr, lambda a: pc.cast(kernel(a), pa.int64()), operand)  # pyright: ignore[reportAttributeAccessIssue]


# Java's SimpleDateFormat letters (Flink's DATE_FORMAT patterns) -> strftime's
_DATE_LETTERS = {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M",
                 "ss": "%S", "SSS": None}  # (SSS: the milliseconds, not a strftime field)
_DATE_PATTERN = re.compile(r"'([^']*)'|(" + "|".join(sorted(_DATE_LETTERS, key=len, reverse=True))
                           + r")|([A-Za-z])|([^A-Za-z']+)")


def _date_format(compile: Compile, expr: exp.Expr) -> Compiled:
    """``DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm')``: whole seconds through strftime (Arrow's %S
    of a millisecond timestamp would carry the fraction), ``SSS`` from the milliseconds."""
    arguments = _arguments(expr)
    if len(arguments) != 2:
        raise SqlError(f"{sql_text(expr)}: DATE_FORMAT takes a timestamp and a pattern")
    operand = compile(arguments[0])
    require(expr, "DATE_FORMAT", "a timestamp", operand, test=is_temporal)
    pattern = str(_constant_argument(compile(arguments[1]), expr, "DATE_FORMAT's pattern"))
    pieces: list[str | None] = []  # strftime text, or None for the milliseconds
    for quoted, field, other, text in _DATE_PATTERN.findall(pattern):
        if other:
            raise SqlError(f"{sql_text(expr)}: DATE_FORMAT's pattern letter {other!r} is not "
                           f"one raystream formats (its letters: {', '.join(_DATE_LETTERS)})")
        piece = _DATE_LETTERS[field] if field else (quoted or text).replace("%", "%%")
        if piece is None or not pieces or pieces[-1] is None:
            pieces.append(piece)
        else:
            pieces[-1] += piece

    def kernel(ts: Value) -> Value:
        millis = pc.cast(ts, pa.timestamp("ms", getattr(ts.type, "tz", None)), safe=False)  # pyright: ignore[reportAttributeAccessIssue]
        floored = pc.floor_temporal(millis, unit="second")  # pyright: ignore[reportAttributeAccessIssue]
        seconds = pc.cast(floored, pa.timestamp("s", getattr(ts.type, "tz", None)))  # pyright: ignore[reportAttributeAccessIssue]
        parts = []
        for piece in pieces:
            if piece is not None:
                parts.append(pc.strftime(seconds, format=piece))  # pyright: ignore[reportAttributeAccessIssue]
            else:
                ms = pc.subtract(pc.cast(millis, pa.int64()), pc.cast(floored, pa.int64()))  # pyright: ignore[reportAttributeAccessIssue]
                parts.append(pc.utf8_lpad(pc.cast(ms, pa.string()), width=3, padding="0"))  # pyright: ignore[reportAttributeAccessIssue]
        if len(parts) == 1:
            return parts[0]
        return pc.binary_join_element_wise(*parts, "")  # pyright: ignore[reportAttributeAccessIssue]
    return combine(expr, kernel, operand)


PROCTIME_TYPE = pa.timestamp("ms", tz="UTC")  # TIMESTAMP_LTZ(3), as Flink's PROCTIME()


def _proctime(compile: Compile, expr: exp.Expr) -> Compiled:
    """``PROCTIME()``: the wall clock when the row is computed (never folded)."""
    if _arguments(expr):
        raise SqlError(f"{sql_text(expr)}: PROCTIME takes no argument")
    return Compiled(PROCTIME_TYPE, lambda batch: pa.scalar(time.time_ns() // 1_000_000,
                                                           PROCTIME_TYPE),
                    sql_text(expr), nullable=False)


def is_proctime(expr: exp.Expr) -> bool:
    """Is ``expr`` (or what it names with AS) a call of PROCTIME()?"""
    inner = expr.this if isinstance(expr, exp.Alias) else expr
    return isinstance(inner, exp.Anonymous) and inner.name.upper() == "PROCTIME"


def _if(compile: Compile, expr: exp.Expr) -> Compiled:
    case = exp.Case(ifs=[exp.If(this=expr.this, true=expr.args["true"])],
                    default=expr.args.get("false"))
    return compile(case)


_TIME_PARTS: dict[str, Callable[[Value], Value]] = {
    "YEAR": pc.year, "MONTH": pc.month, "DAY": pc.day, "HOUR": pc.hour,  # pyright: ignore[reportAttributeAccessIssue]
    "MINUTE": pc.minute, "SECOND": pc.second, "DOW": pc.day_of_week,  # pyright: ignore[reportAttributeAccessIssue]
    "DOY": pc.day_of_year, "WEEK": pc.iso_week, "QUARTER": pc.quarter,  # pyright: ignore[reportAttributeAccessIssue]
}

_BY_CLASS: dict[type, Function] = {
    exp.Lower: _string_function("LOWER", pc.utf8_lower),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Upper: _string_function("UPPER", pc.utf8_upper),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Trim: _string_function("TRIM", pc.utf8_trim_whitespace),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Length: _string_function("CHAR_LENGTH", lambda s: pc.cast(pc.utf8_length(s), pa.int32())),  # pyright: ignore[reportAttributeAccessIssue]
    exp.RegexpExtract: _regexp_extract,
    exp.Concat: _concat,
    exp.Substring: _substring,
    exp.Replace: _replace,
    exp.Extract: _extract,
    exp.If: _if,
    exp.Abs: _numeric("ABS", pc.abs),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Floor: _numeric("FLOOR", pc.floor),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Ceil: _numeric("CEIL", pc.ceil),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Hour: _time_part("HOUR", pc.hour),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Minute: _time_part("MINUTE", pc.minute),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Year: _time_part("YEAR", pc.year),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Month: _time_part("MONTH", pc.month),  # pyright: ignore[reportAttributeAccessIssue]
    exp.Day: _time_part("DAYOFMONTH", pc.day),  # pyright: ignore[reportAttributeAccessIssue]
}

_BY_NAME: dict[str, Function] = {
    "SPLIT_INDEX": _split_index,
    "DATE_FORMAT": _date_format,
    "PROCTIME": _proctime,
    "SECOND": _time_part("SECOND", pc.second),  # pyright: ignore[reportAttributeAccessIssue]
}


def scalar_function(expr: exp.Expr) -> Function | None:
    """The built-in function ``expr`` calls, if raystream's SQL has it."""
    if isinstance(expr, exp.Anonymous):
        return _BY_NAME.get(expr.name.upper())
    return _BY_CLASS.get(type(expr))

