"""The aggregate calls of a window aggregation as the window operator's built-in
aggregates (:class:`~raystream.engine.sql.plan.AggregateCall`), and ``COUNT(DISTINCT x)``
as two window aggregations, Flink's split distinct aggregation
(``table.optimizer.distinct-agg.split.enabled``) without its hash buckets:

1. an :class:`~raystream.engine.sql.plan.Expand` makes each row one copy per distinct
   argument (``x`` in its column ``__v<i>``, the other copies' columns NULL) and one for
   the plain aggregates (COUNT(*), SUM, ...);
2. a window aggregation per group key, window and ``__v0, __v1, ...`` keeps, per
   ``COUNT(DISTINCT x) FILTER (WHERE c)``, a flag: 1 where ``x`` is not NULL and ``c``
   held for one of its rows (MAX of 0/1), and the plain aggregates' partials;
3. a window aggregation of those rows' windows (a cascaded one, over ``window_start,
   window_end``) per group key sums the flags (the distinct count) and merges the
   partials (SUM of counts and sums, MIN of minimums, MAX of maximums).

So no set is kept anywhere: the distinct values are group keys of the window operator,
pre-aggregated before its shuffle and in keyed state on either state backend, as any
window aggregation's. Rows of other copies do not disturb a group: their flags and
partial inputs are NULL, which the built-in aggregates skip. AVG beside a distinct
count, a distinct SUM and distinct counts in SESSION windows (a session per value is
not the group's session) are a SqlError.

    >>> import pyarrow as pa, raystream as rs
    >>> env = rs.StreamEnvironment()
    >>> bids = env.from_collection([{"bidder": 1, "price": 5, "ts": 1000}])
    >>> env.create_temporary_view("bids", bids, schema=pa.schema([("bidder", pa.int64()),
    ...     ("price", pa.int64()), ("ts", pa.timestamp("ms"))]), rowtime="ts")
    >>> print(env.sql_query('''SELECT COUNT(*) AS n, COUNT(DISTINCT bidder) AS bidders
    ...     FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
    ...     GROUP BY window_start, window_end''').explain())
    Calc(select=[__a0 AS n, __a1 AS bidders])
      WindowAggregate(groupBy=[], window=[WINDOWED(start=__first_start, end=__first_end)], select=[COUNT(*) AS __a0, COUNT(DISTINCT bidder) AS __a1])
        Calc(select=[__v0, window_start AS __first_start, window_end AS __first_end, window_time, __a0_p, __a1_p])
          WindowAggregate(groupBy=[__v0], window=[TUMBLE(ts, size=60000 ms)], select=[SUM(__a0_in) AS __a0_p, MAX(__a1_in) AS __a1_p])
            Expand(copies=[[NULL AS __v0, 1 AS __a0_in, NULL AS __a1_in, ts], [bidder AS __v0, NULL AS __a0_in, CAST(CASE WHEN NOT bidder IS NULL THEN 1 ELSE 0 END AS BIGINT) AS __a1_in, ts]])
              DataStreamScan(table=[bids], fields=[bidder, price, ts])
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.arrow_types import is_numeric, is_temporal, type_name, value_type
from raystream.engine.sql.ast import WindowKind
from raystream.engine.sql.compiled import Compiled, Evaluate, column_ref, literal, sql_text
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.plan import (AggregateCall, AggregateKind, Calc, Expand, InputWindows,
                                       Node, WindowAggregate, WindowSpec)
from raystream.engine.sql.schema import Field, RelSchema, WindowAttributes

WINDOW_COLUMNS = ("window_start", "window_end", "window_time")
_AGGREGATES = {exp.Count: AggregateKind.COUNT, exp.Sum: AggregateKind.SUM,
               exp.Min: AggregateKind.MIN, exp.Max: AggregateKind.MAX,
               exp.Avg: AggregateKind.MEAN}
# how the second aggregation merges the first one's partials of each kind
_MERGED = {AggregateKind.COUNT: AggregateKind.SUM, AggregateKind.SUM: AggregateKind.SUM,
           AggregateKind.MIN: AggregateKind.MIN, AggregateKind.MAX: AggregateKind.MAX}

# the first aggregation's window columns, as the second one reads them
_OWN = {"window_start": "__first_start", "window_end": "__first_end"}

Columns = list[tuple[str, Compiled]]


def aggregate_calls(expr: exp.Expr) -> list[exp.Expr]:
    """The aggregate calls in ``expr``, outermost first: ``COUNT(*) FILTER (WHERE ...)`` is
    one call (the FILTER with its aggregate)."""
    if isinstance(expr, exp.Filter) and isinstance(expr.this, exp.AggFunc) or isinstance(
            expr, exp.AggFunc):
        return [expr]
    return [call for child in expr.iter_expressions() for call in aggregate_calls(child)]


def window_aggregate(node: Node, scope: Scope, window: WindowSpec | InputWindows,
                     keys: Columns, times: Columns, calls: list[tuple[str, exp.Expr]]
                     ) -> WindowAggregate:
    """Per ``keys`` (computed over ``node``'s rows) and window, each call of ``calls``
    (its output's name, the call) as the output column; ``times``: the columns the
    windows read (the rowtime, or the input's window columns)."""
    if any(_distinct(call) is not None for _, call in calls):
        return _split_distinct(node, scope, window, keys, times, calls)
    pre = list(keys)
    planned: list[AggregateCall] = []
    for output, call in calls:
        column, kind, result = _aggregate_input(call, scope, f"{output}_in")
        if column is not None:
            pre.append(column)
        planned.append(AggregateCall(output, kind, column[0] if column else None, result,
                                     sql_text(call)))
    pre += times
    schema = RelSchema(tuple(Field(name, c.type, nullable=c.nullable) for name, c in pre),
                       rowtime=None if isinstance(window, InputWindows) else window.time)
    return _aggregate(Calc(node, None, tuple(pre), schema), window,
                      [name for name, _ in keys], planned)


def _aggregate(node: Node, window: WindowSpec | InputWindows, keys: list[str],
               calls: list[AggregateCall]) -> WindowAggregate:
    fields = [Field(k, node.schema.field(k).type, nullable=node.schema.field(k).nullable)
              for k in keys]
    fields += [Field(c, pa.timestamp("ms"), nullable=False) for c in WINDOW_COLUMNS]
    fields += [Field(c.output, c.type, nullable=c.kind not in (AggregateKind.COUNT,
                                                               AggregateKind.SUM))
               for c in calls]
    return WindowAggregate(node, window, tuple(keys), tuple(calls),
                           RelSchema(tuple(fields), rowtime="window_time",
                                     window=WindowAttributes("window_start", "window_end")))


def _split_distinct(node: Node, scope: Scope, window: WindowSpec | InputWindows,
                    keys: Columns, times: Columns, calls: list[tuple[str, exp.Expr]]
                    ) -> WindowAggregate:
    """The two window aggregations of a distinct count (see the module's docs)."""
    first = next(sql_text(c) for _, c in calls if _distinct(c) is not None)
    if isinstance(window, WindowSpec) and window.kind is WindowKind.SESSION:
        raise SqlError(f"{first}: a distinct count in SESSION windows is not in raystream's "
                       f"SQL yet (TUMBLE and HOP windows have it)")
    if isinstance(window, WindowSpec) and window.processing_time:
        raise SqlError(f"{first}: a distinct count in windows of processing time is not in "
                       f"raystream's SQL yet (windows of a rowtime have it)")
    values: dict[str, tuple[str, Compiled]] = {}  # an argument's SQL: its column __v<i>
    plain: Columns = []                              # the plain aggregates' inputs
    flags: list[tuple[str, Compiled, str]] = []      # a distinct count's input, its value column
    partials: list[AggregateCall] = []
    merged: list[AggregateCall] = []
    for output, call in calls:
        distinct = _distinct(call)
        name, partial = f"{output}_in", f"{output}_p"
        if distinct is not None:
            argument, where = distinct
            compiled = compile_expression(argument, scope)
            column = values.setdefault(sql_text(argument), (f"__v{len(values)}", compiled))[0]
            held: exp.Expr = exp.Not(this=exp.Is(this=argument.copy(), expression=exp.Null()))
            if where is not None:
                held = exp.And(this=held, expression=exp.Paren(this=where.copy()))
            flag = compile_expression(exp.Cast(this=exp.If(
                this=held, true=exp.Literal.number(1), false=exp.Literal.number(0)),
                to=exp.DataType.build("BIGINT")), scope)
            flags.append((name, flag, column))
            partials.append(AggregateCall(partial, AggregateKind.MAX, name, pa.int64(),
                                          f"MAX({name})"))
            merged.append(AggregateCall(output, AggregateKind.SUM, partial, pa.int64(),
                                        sql_text(call)))
            continue
        input_, kind, result = _aggregate_input(call, scope, name)
        if kind is AggregateKind.MEAN:
            raise SqlError(f"{sql_text(call)}: AVG beside a distinct count is not in "
                           f"raystream's SQL yet (SUM(x) / COUNT(x) is)")
        if input_ is None:  # COUNT(*): the rows of the plain copy
            input_, kind = (name, literal(1, pa.int64(), "1")), AggregateKind.SUM
        plain.append(input_)
        partials.append(AggregateCall(partial, kind, name, result, f"{kind.name}({name})"))
        merged.append(AggregateCall(output, _MERGED[kind], partial, result, sql_text(call)))
    columns = [*((c, v) for c, v in values.values()), *plain, *((n, f) for n, f, _ in flags)]
    copies = []
    if plain:
        copies.append(_copy(keys, times, columns, {n for n, _ in plain}))
    for column, _ in values.values():
        copies.append(_copy(keys, times, columns, {column, *(n for n, _, c in flags if c == column)}))
    fields = tuple(Field(name, value_type(c.type)) for name, c in copies[0])
    rowtime = None if isinstance(window, InputWindows) else window.time
    expanded = Expand(node, tuple(copies), RelSchema(fields, rowtime=rowtime))
    keyed = [name for name, _ in keys]
    by_value = _aggregate(expanded, window, [*keyed, *(c for c, _ in values.values())], partials)
    # its window columns renamed: the second aggregation's rows have their own
    scope = Scope(by_value.schema)
    renamed = tuple((_OWN.get(f.name, f.name), compile_expression(column_ref(f.name), scope))
                    for f in by_value.schema.fields)
    windowed = Calc(by_value, None, renamed, RelSchema(
        tuple(replace(f, name=_OWN.get(f.name, f.name)) for f in by_value.schema.fields),
        window=WindowAttributes(*_OWN.values())))
    return _aggregate(windowed, InputWindows(*_OWN.values()), keyed, merged)


def _copy(keys: Columns, times: Columns, columns: Columns, real: set[str]
          ) -> tuple[tuple[str, Compiled], ...]:
    """One copy of the Expand: the keys, the ``real`` columns (the others NULL), the
    times."""
    return (*keys, *((n, c if n in real else literal(None, value_type(c.type), "NULL"))
                     for n, c in columns), *times)


def _distinct(call: exp.Expr) -> tuple[exp.Expr, exp.Expr | None] | None:
    """``COUNT(DISTINCT x) [FILTER (WHERE c)]``'s ``x`` and ``c``; None for another call."""
    where = None
    if isinstance(call, exp.Filter):
        where, call = call.expression.this, call.this
    argument = call.this
    if not isinstance(argument, exp.Distinct):
        return None
    if not isinstance(call, exp.Count):
        raise SqlError(f"{sql_text(call)}: {_function_name(call)}(DISTINCT ...) is not in "
                       f"raystream's SQL yet (COUNT(DISTINCT ...) is)")
    if len(argument.expressions) != 1:
        raise SqlError(f"{sql_text(call)}: COUNT(DISTINCT ...) of one expression in "
                       f"raystream's SQL (a distinct count of several is not there yet)")
    return argument.expressions[0], where


def _aggregate_input(call: exp.Expr, scope: Scope, name: str
                     ) -> tuple[tuple[str, Compiled] | None, AggregateKind, pa.DataType]:
    """The column an aggregate call reads (computed into the aggregate's input as ``name``;
    None for COUNT(*)), its kind, and its result's type (Flink's)."""
    where = None
    if isinstance(call, exp.Filter):  # COUNT(*) FILTER (WHERE ...): rows without it are NULL
        where, call = call.expression.this, call.this
    kind = _AGGREGATES.get(type(call))
    if kind is None:
        raise SqlError(f"{sql_text(call)}: raystream's SQL has no aggregate {_function_name(call)} yet")
    argument = call.this
    star = isinstance(argument, exp.Star) or argument is None
    if kind is AggregateKind.COUNT and star and where is None:
        return None, kind, pa.int64()
    if kind is AggregateKind.COUNT:  # rows with a value (where the FILTER holds): a sum of 1s
        value: exp.Expr = exp.Literal.number(1) if star else exp.If(
            this=exp.Not(this=exp.Is(this=argument, expression=exp.Null())),
            true=exp.Literal.number(1), false=exp.Literal.number(0))
        if where is not None:
            value = exp.If(this=where, true=value, false=exp.Literal.number(0))
        compiled = compile_expression(exp.Cast(this=value, to=exp.DataType.build("BIGINT")), scope)
        return (name, compiled), AggregateKind.SUM, pa.int64()
    if where is not None:
        argument = exp.If(this=where, true=argument, false=exp.Null())
    if argument is None:
        raise SqlError(f"{sql_text(call)}: {_function_name(call)} takes a column")
    compiled = compile_expression(argument, scope)
    operand = value_type(compiled.type)
    if kind in (AggregateKind.SUM, AggregateKind.MEAN) and not is_numeric(operand):
        raise SqlError(f"{sql_text(call)}: {_function_name(call)} takes a number, not {type_name(operand)}")
    if pa.types.is_decimal(operand) and kind in (AggregateKind.SUM, AggregateKind.MEAN):
        compiled = Compiled(pa.float64(), _as_double(compiled), compiled.sql)
        operand = pa.float64()  # (the window aggregates sum in numpy: DOUBLE)
    if kind is AggregateKind.SUM:
        result = pa.int64() if pa.types.is_integer(operand) else pa.float64()
    elif kind is AggregateKind.MEAN:  # Flink's AVG has its operand's type
        result = operand if pa.types.is_integer(operand) or pa.types.is_floating(operand) else pa.float64()
    else:
        if not (is_numeric(operand) or is_temporal(operand)):
            raise SqlError(f"{sql_text(call)}: {_function_name(call)} takes a number or a time here, "
                           f"not {type_name(operand)}")
        result = operand
    return (name, compiled), kind, result


def _as_double(compiled: Compiled) -> Evaluate:
    inner = compiled.evaluate
    return lambda batch: pc.cast(inner(batch), pa.float64())  # pyright: ignore[reportAttributeAccessIssue]


def _function_name(call: exp.Expr) -> str:
    return call.sql_name() if isinstance(call, exp.Func) else type(call).__name__.upper()
