"""SQL expressions compiled to functions of an Arrow batch (pyarrow.compute kernels, no
Python call per row), typed when they are compiled.

:func:`compile_expression` walks a sqlglot expression once, against the :class:`Scope` of
the relation it reads, and returns a :class:`Compiled`: its Arrow type and a function
from a batch to an array (or to a scalar, for a constant). Constants fold as it goes,
including the constant columns a connector declares: with ``event_type`` known to be 2,
``CASE WHEN event_type = 0 THEN person.dateTime ... ELSE bid.dateTime END`` compiles to
``bid.dateTime``. A type error is a :class:`~raystream.engine.errors.SqlError` naming the
expression and its operands' types, at planning time: each kernel is tried on empty
arrays of the operands' types as it is compiled.

    >>> import pyarrow as pa, sqlglot
    >>> from raystream.engine.sql.schema import Field, RelSchema
    >>> scope = Scope(RelSchema((Field("price", pa.int64()),)))
    >>> expr = sqlglot.parse_one("price * 2 + 1")
    >>> c = compile_expression(expr, scope)
    >>> c.type, c.evaluate(pa.record_batch({"price": [1, 5]})).to_pylist()
    (DataType(int64), [3, 11])
    >>> compile_expression(sqlglot.parse_one("price || 'x'"), scope)
    Traceback (most recent call last):
    ...
    raystream.engine.errors.SqlError: price || 'x': || takes strings, not BIGINT and STRING
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc
from sqlglot import exp

from raystream.engine.errors import BadRecordError, SqlError
from raystream.engine.sql.arrow_types import (arrow_type, is_numeric, is_string, is_temporal,
                                              type_name, value_type)
from raystream.engine.sql.column_types import sql_type
from raystream.engine.sql.compiled import (Compiled, Value, as_array, cast_to, combine,
                                           common_type, comparable, decimal_pair, field_of,
                                           literal, plain, probed, require, sql_text)
from raystream.engine.sql.functions import scalar_function
from raystream.engine.sql.intervals import interval_ms
from raystream.engine.sql.schema import RelSchema
from raystream.engine.sql.udf import ScalarFunction

@dataclass(frozen=True)
class Scope:
    """The names an expression may use: the relation's columns, its aliases (``B`` in
    ``FROM bid B``, or the table's own name), and the user functions."""

    schema: RelSchema
    aliases: frozenset[str] = frozenset()
    functions: dict[str, Any] = field(default_factory=dict)


def compile_expression(expr: exp.Expr, scope: Scope) -> Compiled:
    """``expr`` compiled against ``scope`` (see the module's docstring)."""
    return _Compiler(scope).compile(expr)


class _Compiler:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def compile(self, expr: exp.Expr) -> Compiled:
        if isinstance(expr, exp.Anonymous) and expr.name.lower() in self.scope.functions:
            return self._user_function(self.scope.functions[expr.name.lower()], expr)
        method = getattr(self, f"_{type(expr).__name__.lower()}", None)
        if method is None:
            function = scalar_function(expr)
            if function is None:
                raise SqlError(f"{sql_text(expr)}: raystream's SQL has no {_what(expr)}")
            return function(self.compile, expr)
        return method(expr)

    def _user_function(self, function: ScalarFunction, expr: exp.Anonymous) -> Compiled:
        arguments = [self.compile(a) for a in expr.expressions]
        result_type, sql = function.result_type, sql_text(expr)

        def evaluate(batch: pa.RecordBatch) -> Value:
            n = batch.num_rows
            out = function(*[plain(as_array(a.evaluate(batch), n)) for a in arguments])
            if not isinstance(out, (pa.Array, pa.ChunkedArray)) or len(out) != n:
                what = f"{len(out)} values" if isinstance(out, (pa.Array, pa.ChunkedArray)) \
                    else f"a {type(out).__name__}"
                raise BadRecordError(f"{sql}: {function.name} returned {what} for a batch of "
                                     f"{n} rows; it must return a pyarrow array of one value "
                                     f"per row")
            return out if out.type == result_type else pc.cast(out, result_type)  # pyright: ignore[reportAttributeAccessIssue]
        return Compiled(result_type, evaluate, sql)

    # -- names ------------------------------------------------------------------------------
    def _column(self, expr: exp.Column) -> Compiled:
        parts = [p.name for p in expr.parts]
        if len(parts) > 1 and parts[0] in self.scope.aliases:
            parts = parts[1:]
        return self._path(parts, sql_text(expr))

    def _dot(self, expr: exp.Dot) -> Compiled:
        parts = [p.name for p in expr.parts]
        if len(parts) > 1 and parts[0] in self.scope.aliases:
            parts = parts[1:]
        return self._path(parts, sql_text(expr))

    def _path(self, parts: list[str], sql: str) -> Compiled:
        schema, name = self.scope.schema, parts[0]
        if not schema.has(name):
            close = difflib.get_close_matches(name, schema.names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SqlError(f"{sql}: no column {name!r} (the columns: "
                           f"{', '.join(schema.names)}){hint}")
        column = schema.field(name)
        written = sql if len(parts) == 1 else name
        if column.is_constant:
            compiled = literal(column.constant, column.type, written)
        else:
            compiled = Compiled(column.type, lambda batch: batch.column(name), written,
                                nullable=column.nullable)
        for part in parts[1:]:
            compiled = field_of(compiled, part, f"{compiled.sql}.{part}")
        return compiled

    def _paren(self, expr: exp.Paren) -> Compiled:
        return self.compile(expr.this)

    def _alias(self, expr: exp.Alias) -> Compiled:
        return self.compile(expr.this)

    # -- literals -----------------------------------------------------------------------
    def _literal(self, expr: exp.Literal) -> Compiled:
        text = expr.name
        if expr.is_string:
            return literal(text, pa.string(), sql_text(expr))
        if expr.is_int:
            value = int(text)
            return literal(value, pa.int32() if -2**31 <= value < 2**31 else pa.int64(),
                           sql_text(expr))
        if "e" in text.lower():  # 1.5E3: a DOUBLE, as in Flink
            return literal(float(text), pa.float64(), sql_text(expr))
        value = Decimal(text)
        digits = len(value.as_tuple().digits)
        scale = max(0, -int(value.as_tuple().exponent))
        return literal(value, pa.decimal128(max(digits, scale, 1), scale), sql_text(expr))

    def _boolean(self, expr: exp.Boolean) -> Compiled:
        return literal(bool(expr.this), pa.bool_(), sql_text(expr))

    def _null(self, expr: exp.Null) -> Compiled:
        return literal(None, pa.null(), sql_text(expr))

    def _interval(self, expr: exp.Interval) -> Compiled:
        return literal(interval_ms(expr), pa.duration("ms"), sql_text(expr))

    # -- operators ------------------------------------------------------------------------
    def _add(self, expr: exp.Add) -> Compiled:
        return self._arithmetic(expr, "add", "+")

    def _sub(self, expr: exp.Sub) -> Compiled:
        return self._arithmetic(expr, "subtract", "-")

    def _mul(self, expr: exp.Mul) -> Compiled:
        return self._arithmetic(expr, "multiply", "*")

    def _div(self, expr: exp.Div) -> Compiled:
        return self._arithmetic(expr, "divide", "/")

    def _mod(self, expr: exp.Mod) -> Compiled:
        left, right = self.compile(expr.this), self.compile(expr.expression)
        require(expr, "MOD", "numbers", left, right, test=is_numeric)

        def mod(a: Value, b: Value) -> Value:  # SQL's MOD has the dividend's sign (as C's %)
            return pc.subtract(a, pc.multiply(pc.divide(a, b), b))  # pyright: ignore[reportAttributeAccessIssue]
        return combine(expr, mod, left, right)

    def _arithmetic(self, expr: exp.Binary, kernel: str, symbol: str) -> Compiled:
        left, right = self.compile(expr.this), self.compile(expr.expression)
        temporal = is_temporal(left.type) or pa.types.is_duration(value_type(left.type))
        if not temporal:
            require(expr, symbol, "numbers", left, right, test=is_numeric)
        left, right = decimal_pair(left, right)
        function = getattr(pc, kernel)
        return combine(expr, lambda a, b: function(a, b), left, right)

    def _neg(self, expr: exp.Neg) -> Compiled:
        operand = self.compile(expr.this)
        require(expr, "-", "a number", operand, test=is_numeric)
        return combine(expr, lambda a: pc.negate(a), operand)  # pyright: ignore[reportAttributeAccessIssue]

    def _dpipe(self, expr: exp.DPipe) -> Compiled:
        left, right = self.compile(expr.this), self.compile(expr.expression)
        require(expr, "||", "strings", left, right, test=is_string)
        return combine(expr, lambda a, b: pc.binary_join_element_wise(a, b, ""), left, right)  # pyright: ignore[reportAttributeAccessIssue]

    def _comparison(self, expr: exp.Binary, kernel: str) -> Compiled:
        left, right = self.compile(expr.this), self.compile(expr.expression)
        if not comparable(left.type, right.type):
            raise SqlError(f"{sql_text(expr)}: cannot compare {type_name(left.type)} with "
                           f"{type_name(right.type)}")
        left, right = decimal_pair(left, right)
        function = getattr(pc, kernel)
        return combine(expr, lambda a, b: function(a, b), left, right)

    def _eq(self, expr: exp.EQ) -> Compiled:
        return self._comparison(expr, "equal")

    def _neq(self, expr: exp.NEQ) -> Compiled:
        return self._comparison(expr, "not_equal")

    def _lt(self, expr: exp.LT) -> Compiled:
        return self._comparison(expr, "less")

    def _lte(self, expr: exp.LTE) -> Compiled:
        return self._comparison(expr, "less_equal")

    def _gt(self, expr: exp.GT) -> Compiled:
        return self._comparison(expr, "greater")

    def _gte(self, expr: exp.GTE) -> Compiled:
        return self._comparison(expr, "greater_equal")

    def _between(self, expr: exp.Between) -> Compiled:
        low = exp.GTE(this=expr.this, expression=expr.args["low"])
        high = exp.LTE(this=expr.this, expression=expr.args["high"])
        return self._and(exp.And(this=low, expression=high), sql=sql_text(expr))

    def _and(self, expr: exp.And, sql: str | None = None) -> Compiled:
        left, right = self._predicate(expr.this), self._predicate(expr.expression)
        if left.is_constant and left.constant is False or right.is_constant and right.constant is False:
            return literal(False, pa.bool_(), sql or sql_text(expr))
        if left.is_constant and left.constant is True:
            return right
        if right.is_constant and right.constant is True:
            return left
        return combine(expr, lambda a, b: pc.and_kleene(a, b), left, right, sql=sql)  # pyright: ignore[reportAttributeAccessIssue]

    def _or(self, expr: exp.Or) -> Compiled:
        left, right = self._predicate(expr.this), self._predicate(expr.expression)
        if left.is_constant and left.constant is True or right.is_constant and right.constant is True:
            return literal(True, pa.bool_(), sql_text(expr))
        if left.is_constant and left.constant is False:
            return right
        if right.is_constant and right.constant is False:
            return left
        return combine(expr, lambda a, b: pc.or_kleene(a, b), left, right)  # pyright: ignore[reportAttributeAccessIssue]

    def _not(self, expr: exp.Not) -> Compiled:
        operand = self._predicate(expr.this)
        return combine(expr, lambda a: pc.invert(a), operand)  # pyright: ignore[reportAttributeAccessIssue]

    def _predicate(self, expr: exp.Expr) -> Compiled:
        compiled = self.compile(expr)
        if value_type(compiled.type) not in (pa.bool_(), pa.null()):
            raise SqlError(f"{sql_text(expr)}: a condition must be BOOLEAN, not "
                           f"{type_name(compiled.type)}")
        return compiled

    def _is(self, expr: exp.Is) -> Compiled:
        if not isinstance(expr.expression, exp.Null):
            raise SqlError(f"{sql_text(expr)}: IS takes NULL (IS TRUE and the others: not yet)")
        operand = self.compile(expr.this)
        return combine(expr, lambda a: pc.is_null(a), operand, nullable=False)  # pyright: ignore[reportAttributeAccessIssue]

    def _in(self, expr: exp.In) -> Compiled:
        operand = self.compile(expr.this)
        if expr.args.get("query") is not None:
            raise SqlError(f"{sql_text(expr)}: IN (SELECT ...) is not in raystream's SQL yet")
        values = [self.compile(v) for v in expr.expressions]
        if all(v.is_constant for v in values):
            for v in values:
                if not comparable(operand.type, v.type):
                    raise SqlError(f"{sql_text(expr)}: cannot compare {type_name(operand.type)} "
                                   f"with {type_name(v.type)}")
            value_set = pa.array([v.constant for v in values]).cast(value_type(operand.type))
            return combine(expr, lambda a: pc.is_in(a, value_set=value_set), operand)  # pyright: ignore[reportAttributeAccessIssue]
        ors: exp.Expr = exp.EQ(this=expr.this, expression=expr.expressions[0])
        for v in expr.expressions[1:]:
            ors = exp.Or(this=ors, expression=exp.EQ(this=expr.this, expression=v))
        return self.compile(ors)

    def _like(self, expr: exp.Like) -> Compiled:
        operand, pattern = self.compile(expr.this), self.compile(expr.expression)
        if not pattern.is_constant:
            raise SqlError(f"{sql_text(expr)}: LIKE takes a constant pattern")
        require(expr, "LIKE", "strings", operand, pattern, test=is_string)
        return combine(expr, lambda a: pc.match_like(a, pattern.constant), operand)  # pyright: ignore[reportAttributeAccessIssue]

    # -- CASE, CAST, COALESCE ---------------------------------------------------------------
    def _case(self, expr: exp.Case) -> Compiled:
        if expr.this is not None:  # CASE x WHEN v THEN ...: CASE WHEN x = v THEN ...
            ifs = [exp.If(this=exp.EQ(this=expr.this, expression=i.this), true=i.args["true"])
                   for i in expr.args["ifs"]]
        else:
            ifs = list(expr.args["ifs"])
        branches = []
        for branch in ifs:
            condition = self._predicate(branch.this)
            if condition.is_constant and not condition.constant:
                continue  # never taken
            value = self.compile(branch.args["true"])
            if condition.is_constant:  # always taken: the branches after it never are
                if not branches:
                    return value
                branches.append((condition, value))
                break
            branches.append((condition, value))
        else:
            default = expr.args.get("default")
            if not branches:
                return self.compile(default) if default is not None else literal(None, pa.null(), sql_text(expr))
            if default is not None:
                branches.append((literal(True, pa.bool_(), "TRUE"), self.compile(default)))
        result_type = common_type(expr, [v.type for _, v in branches])
        conditions = [c for c, _ in branches]
        values = [cast_to(v, result_type) for _, v in branches]

        def case(batch: pa.RecordBatch) -> Value:
            n = batch.num_rows
            flags = pc.make_struct(*[as_array(c.evaluate(batch), n) for c in conditions])  # pyright: ignore[reportAttributeAccessIssue]
            return pc.case_when(flags, *[plain(v.evaluate(batch)) for v in values])  # pyright: ignore[reportAttributeAccessIssue]
        return probed(Compiled(result_type, case, sql_text(expr)), self.scope.schema)

    def _cast(self, expr: exp.Cast) -> Compiled:
        operand = self.compile(expr.this)
        target = arrow_type(sql_type(expr.to))
        return cast_to(operand, target, sql=sql_text(expr), explicit=True)

    def _coalesce(self, expr: exp.Coalesce) -> Compiled:
        operands = [self.compile(e) for e in [expr.this, *expr.expressions]]
        result_type = common_type(expr, [o.type for o in operands])
        operands = [cast_to(o, result_type) for o in operands]
        return combine(expr, lambda *a: pc.coalesce(*a), *operands)  # pyright: ignore[reportAttributeAccessIssue]


def _what(expr: exp.Expr) -> str:
    if isinstance(expr, exp.Anonymous):
        return f"function {expr.name.upper()}"
    if isinstance(expr, exp.Func):
        return f"function {expr.sql_name()}"
    return f"{type(expr).__name__} expression"
