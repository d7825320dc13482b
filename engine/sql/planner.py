"""SELECT statements into plans (:mod:`~raystream.engine.sql.plan`): names bound against
the catalog, views inlined, conditions pushed into the scans that take them, window
aggregations recognised (the window table functions ``TUMBLE``, ``HOP`` and ``SESSION``
with ``GROUP BY window_start, window_end``, the group windows ``GROUP BY
TUMBLE(ts, ...)`` with ``TUMBLE_START``/``TUMBLE_END``, and a GROUP BY of rows' own
window columns), their aggregate calls and distinct counts handed to
:mod:`~raystream.engine.sql.aggregates`, window Top-N recognised (planned as
:mod:`~raystream.engine.sql.topn` says), joins handed to :mod:`~raystream.engine.sql.joins`
(several per SELECT, left-deep), expressions compiled.

What raystream's SQL does not have yet is a ``SqlError`` that says so (an outer join, a
GROUP BY without a window, which makes an updating result, ...), raised at planning.

    >>> import pyarrow as pa, raystream as rs
    >>> env = rs.StreamEnvironment()
    >>> clicks = env.from_collection([{"user": "a", "ts": 1000}])
    >>> env.create_temporary_view("clicks", clicks, schema=pa.schema(
    ...     [("user", pa.string()), ("ts", pa.timestamp("ms"))]), rowtime="ts")
    >>> print(env.sql_query('''SELECT user, COUNT(*) AS n, window_end FROM TABLE(
    ...     TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
    ...     GROUP BY user, window_start, window_end''').explain())
    Calc(select=[user, __a0 AS n, window_end])
      WindowAggregate(groupBy=[user], window=[TUMBLE(ts, size=60000 ms)], select=[COUNT(*) AS __a0])
        Calc(select=[user, ts])
          DataStreamScan(table=[clicks], fields=[user, ts])
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.arrow_types import type_name, value_type
from raystream.engine.sql.aggregates import WINDOW_COLUMNS, aggregate_calls, window_aggregate
from raystream.engine.sql.ast import WindowKind, WindowTvf
from raystream.engine.sql.catalog import Catalog, StreamEntry, TableEntry, ViewEntry
from raystream.engine.sql.compiled import Compiled, column_ref, sql_text
from raystream.engine.sql.connectors import connector_of
from raystream.engine.sql.dialect import WindowTableFunction
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.functions import is_proctime
from raystream.engine.sql.intervals import interval_ms
from raystream.engine.sql.joins import JoinInput, conjunction, conjuncts, plan_join
from raystream.engine.sql.plan import (Calc, InputWindows, Node, WindowTopN,
                                       Scan, StreamScan, Union, WindowSpec)
from raystream.engine.sql.schema import Field, RelSchema, WindowAttributes
from raystream.engine.sql.topn import TopNQuery, ranked_schema, sort_keys, top_n_query

_GROUP_WINDOWS = {"TUMBLE": WindowKind.TUMBLE, "HOP": WindowKind.HOP,
                  "SESSION": WindowKind.SESSION}


@dataclass(frozen=True)
class _From:
    """A FROM clause planned: its node, the names it may be qualified by, and its window
    table function, if it is one."""

    node: Node
    aliases: frozenset[str]
    window: WindowTvf | None = None


class Planner:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def query(self, query: exp.Expr) -> Node:
        """The plan of a SELECT (or a UNION ALL of them)."""
        if isinstance(query, exp.Union):
            if query.args.get("distinct"):
                raise SqlError(f"{_short(query)}: UNION (distinct) makes an updating result; "
                               f"raystream's SQL has UNION ALL")
            inputs = (self.query(query.this), self.query(query.expression))
            left, right = (i.schema for i in inputs)
            if [value_type(f.type) for f in left.fields] != [value_type(f.type) for f in right.fields]:
                raise SqlError(f"{_short(query)}: UNION ALL's inputs have different columns "
                               f"({_columns(left)} and {_columns(right)})")
            return Union(inputs, RelSchema(tuple(
                Field(f.name, f.type, nullable=f.nullable or g.nullable)
                for f, g in zip(left.fields, right.fields))))
        if isinstance(query, exp.Subquery):
            return self.query(query.this)
        if not isinstance(query, exp.Select):
            raise SqlError(f"{_short(query)}: raystream's SQL has no {type(query).__name__} query")
        return self._select(query)

    # -- SELECT ---------------------------------------------------------------------------
    def _select(self, select: exp.Select) -> Node:
        for unsupported in ("order", "limit", "qualify", "windows"):
            if select.args.get(unsupported):
                what = {"order": "ORDER BY", "limit": "LIMIT",
                        "qualify": "QUALIFY", "windows": "WINDOW"}[unsupported]
                raise SqlError(f"{_short(select)}: raystream's SQL has no {what} yet")
        if select.args.get("distinct"):
            raise SqlError(f"{_short(select)}: SELECT DISTINCT makes an updating result, which "
                           f"raystream's SQL does not have yet")
        where = select.args.get("where")
        conditions = tuple(conjuncts(where.this)) if where is not None else ()
        from_ = select.args.get("from_") or select.args.get("from")
        ranked = None if select.args.get("joins") else self._ranked(from_, conditions)
        if select.args.get("joins"):
            source, select = self._joined(select, from_, list(conditions))
            where = None  # (the join took its conjuncts)
        elif ranked is not None:  # (the Top-N took its bound on the row number)
            source, rest = ranked
            where = exp.Where(this=conjunction(rest)) if rest else None
        else:
            source = self._from(from_, conditions)
        scope = Scope(source.node.schema, source.aliases, self.catalog.functions)
        node = source.node
        if where is not None:
            condition = _predicate(where.this, scope)
            if not (condition.is_constant and condition.constant is True):
                node = Calc(node, condition, _identity(node.schema), node.schema)
        group = select.args.get("group")
        aggregates = [a for e in select.expressions for a in e.find_all(exp.AggFunc)]
        group_window = _group_window(group, source.node.schema) if group is not None else None
        if source.window is not None and (group is not None or aggregates):
            return self._window_aggregate(select, node, source, _window_spec(
                source.window, source.node.schema), group, tvf=True)
        if group_window is not None:
            return self._window_aggregate(select, node, source, group_window, group, tvf=False)
        windows = node.schema.window
        if group is not None and windows is not None and {windows.start, windows.end} <= {
                e.name for e in group.expressions if isinstance(e, exp.Column)}:
            return self._window_aggregate(select, node, source,
                                          InputWindows(windows.start, windows.end), group,
                                          tvf=True)
        if group is not None or aggregates:
            raise SqlError(f"{_short(select)}: a GROUP BY without a window makes an updating "
                           f"result, which raystream's SQL does not have yet (group by "
                           f"window_start, window_end of a TUMBLE, HOP or SESSION)")
        if select.args.get("having") is not None:
            raise SqlError(f"{_short(select)}: HAVING needs a GROUP BY")
        if source.window is not None:
            raise SqlError(f"{_short(select)}: a window table function without a GROUP BY "
                           f"is not in raystream's SQL yet")
        scope = Scope(node.schema, source.aliases, self.catalog.functions)
        projections = _projections(select.expressions, scope)
        return Calc(node, None, projections,
                    _schema(projections, select.expressions, node.schema))

    def _joined(self, select: exp.Select, from_: exp.From | None, where: list[exp.Expr]
                ) -> tuple[_From, exp.Select]:
        """The FROM's joins, planned left-deep (``a JOIN b ON ... JOIN c ON ...`` is ``(a
        JOIN b) JOIN c``, each join one operator), and the SELECT over the joined rows'
        names. A WHERE conjunct goes to the first join that has all its tables."""
        if from_ is None:
            raise SqlError("a SELECT without FROM is not in raystream's SQL")
        joins = select.args["joins"]
        items = [self._from_item(from_.this, ()), *(self._from_item(j.this, ()) for j in joins)]
        for join, item in zip([None, *joins], items):
            if item.window is not None:
                named = sql_text(join.this if join is not None else from_.this)
                raise SqlError(f"JOIN {named}: join a window table function's rows through "
                               f"a subquery that aggregates them")
        levels = [_join_level(c, items) for c in where]
        left = JoinInput(items[0].node, items[0].aliases)
        planned = None
        for level, (join, item) in enumerate(zip(joins, items[1:])):
            version = join.this.args.get("version")
            if version is not None:
                _check_lookup(join.this, version, left.node.schema, item.node)
            last = level == len(joins) - 1
            mine = [c for c, at in zip(where, levels) if at == level or last and at > level]
            planned = plan_join(left, JoinInput(item.node, item.aliases), join, mine,
                                self.catalog.functions, lookup=version is not None)
            left = planned.as_input()
        assert planned is not None
        rewritten = select.copy()
        rewritten.set("joins", None)
        rewritten.set("where", None)
        for e in rewritten.expressions:
            if isinstance(e, exp.Column) and isinstance(e.this, exp.Star) and e.table:
                raise SqlError(f"{sql_text(e)}: name the columns (a qualified * over a join is "
                               f"not in raystream's SQL yet)")
        rewritten.set("expressions", [planned.rewrite(e) for e in rewritten.expressions])
        for part in ("group", "having"):
            if rewritten.args.get(part) is not None:
                rewritten.set(part, planned.rewrite(rewritten.args[part]))
        return _From(planned.node, frozenset()), rewritten

    # -- window Top-N ---------------------------------------------------------------------
    def _ranked(self, from_: exp.From | None, conditions: tuple[exp.Expr, ...]
                ) -> tuple[_From, tuple[exp.Expr, ...]] | None:
        """``FROM (SELECT ..., ROW_NUMBER() OVER (...) AS rn ...) WHERE rn <= N`` as a
        window Top-N (see :mod:`~raystream.engine.sql.topn`), and the WHERE's other
        conjuncts; None where the FROM is not one."""
        top = top_n_query(from_, conditions)
        if top is None:
            return None
        assert from_ is not None
        inner = top.inner
        alias = from_.this.alias
        inner_from = inner.args.get("from_") or inner.args.get("from")
        aggregates = [a for e in inner.expressions for a in e.find_all(exp.AggFunc)]
        if (inner_from is not None and isinstance(inner_from.this, WindowTableFunction)
                and inner.args.get("group") is None and not aggregates
                and not inner.args.get("joins")):
            node = self._ranked_tvf(top, inner_from.this)
        else:
            node = self._ranked_rows(top)
        return _From(node, frozenset([alias] if alias else [])), top.rest

    def _ranked_tvf(self, top: TopNQuery, item: WindowTableFunction) -> Node:
        """A Top-N over a window table function's rows: the window operator's windows."""
        inner, over = top.inner, top.over
        where = inner.args.get("where")
        source = self._from_item(item, tuple(conjuncts(where.this)) if where is not None else ())
        node = source.node
        assert source.window is not None
        spec = _window_spec(source.window, node.schema)
        if spec.kind not in (WindowKind.TUMBLE, WindowKind.HOP) or spec.processing_time:
            raise SqlError(f"{sql_text(over)}: a Top-N over a window table function's rows "
                           f"is over TUMBLE or HOP windows of a rowtime in raystream's SQL")
        if where is not None:
            scope = Scope(node.schema, source.aliases, self.catalog.functions)
            node = Calc(node, _predicate(where.this, scope), _identity(node.schema), node.schema)
        own = ("window_start", "window_end")
        partition = [_ranked_column(e, None, node.schema, over, allowed=own)
                     for e in over.args.get("partition_by") or []]
        if not set(own) <= set(partition):
            raise SqlError(f"{sql_text(over)}: a window Top-N is PARTITION BY window_start, "
                           f"window_end (and other columns)")
        order = tuple((_ranked_column(e, None, node.schema, over), d) for e, d in sort_keys(over))
        schema = ranked_schema(node.schema, top.rank, windowed=True)
        ranked = WindowTopN(node, spec, tuple(k for k in partition if k not in own), order,
                            top.limit, top.rank,
                            RelSchema(schema.fields, rowtime="window_time",
                                      window=WindowAttributes(*own)))
        # the inner SELECT list over the ranked rows: its ROW_NUMBER() is the row number
        expressions = []
        for i, e in enumerate(inner.expressions):
            if i == top.position:
                expressions.append(exp.alias_(column_ref(top.rank), top.rank))
            elif isinstance(e, exp.Star):
                expressions += [column_ref(f.name) for f in schema.fields if f.name != top.rank]
            else:
                expressions.append(e)
        scope = Scope(ranked.schema, source.aliases, self.catalog.functions)
        projections = _projections(expressions, scope)
        return Calc(ranked, None, projections, _schema(projections, expressions, ranked.schema))

    def _ranked_rows(self, top: TopNQuery) -> Node:
        """A Top-N over windowed rows (a window aggregation's): the windows they have."""
        inner, over = top.inner, top.over
        rows = inner.copy()
        rows.set("expressions", [e for i, e in enumerate(rows.expressions) if i != top.position])
        below = self.query(rows)
        window = below.schema.window
        if window is None:
            raise SqlError(f"{sql_text(over)}: a ROW_NUMBER() is a window Top-N in raystream's "
                           f"SQL: rank a window aggregation's rows or a window table "
                           f"function's (an updating Top-N is not there yet)")
        partition = [_ranked_column(e, rows, below.schema, over)
                     for e in over.args.get("partition_by") or []]
        if not {window.start, window.end} <= set(partition):
            raise SqlError(f"{sql_text(over)}: a window Top-N is PARTITION BY the rows' "
                           f"window_start and window_end (and other columns)")
        order = tuple((_ranked_column(e, rows, below.schema, over), d) for e, d in sort_keys(over))
        schema = ranked_schema(below.schema, top.rank, windowed=False)
        ranked = WindowTopN(below, InputWindows(window.start, window.end),
                            tuple(k for k in partition if k not in (window.start, window.end)),
                            order, top.limit, top.rank,
                            RelSchema(schema.fields, rowtime=below.schema.rowtime, window=window))
        names = list(below.schema.names)
        names.insert(top.position if len(names) == len(rows.expressions) else len(names), top.rank)
        expressions: list[exp.Expr] = [column_ref(n) for n in names]
        projections = _projections(expressions, Scope(ranked.schema))
        return Calc(ranked, None, projections, _schema(projections, expressions, ranked.schema))

    def _from(self, from_: exp.From | None, conditions: tuple[exp.Expr, ...]) -> _From:
        if from_ is None:
            raise SqlError("a SELECT without FROM is not in raystream's SQL")
        return self._from_item(from_.this, conditions)

    def _from_item(self, item: exp.Expr, conditions: tuple[exp.Expr, ...]) -> _From:
        if isinstance(item, WindowTableFunction):
            window = item.window
            inner = self._table(window.table, conditions)
            alias = item.args.get("alias")
            names = {window.table, *([alias.name] if alias is not None else [])}
            return _From(inner, frozenset(names), window)
        if isinstance(item, exp.Subquery):
            alias = item.alias
            return _From(self.query(item.this), frozenset([alias] if alias else []))
        if isinstance(item, exp.Table):
            name = ".".join(p.name for p in item.parts)
            names = {name, *([item.alias] if item.alias else [])}
            return _From(self._table(name, conditions), frozenset(names))
        raise SqlError(f"FROM {sql_text(item)}: raystream's SQL reads tables, views and subqueries")

    def _table(self, name: str, conditions: tuple[exp.Expr, ...]) -> Node:
        entry = self.catalog.get(name)
        if isinstance(entry, ViewEntry):
            return self.query(entry.query)
        if isinstance(entry, StreamEntry):
            return StreamScan(entry)
        assert isinstance(entry, TableEntry)
        return Scan(name, connector_of(entry).scan(entry, conditions))

    # -- window aggregation -----------------------------------------------------------------
    def _window_aggregate(self, select: exp.Select, node: Node, source: _From,
                          window: WindowSpec | InputWindows, group: exp.Group | None, *,
                          tvf: bool) -> Node:
        scope = Scope(node.schema, source.aliases, self.catalog.functions)
        group_exprs = list(group.expressions) if group is not None else []
        rewrites: dict[str, exp.Expr] = {}
        if isinstance(window, InputWindows):  # its columns become the aggregate's own
            own = (window.start, window.end)
            keys = [e for e in group_exprs if not (isinstance(e, exp.Column) and e.name in own)]
            for name, target in zip(own, WINDOW_COLUMNS):
                rewrites[_normal(column_ref(name), source.aliases)] = column_ref(target)
        elif tvf:
            named = {e.name for e in group_exprs if isinstance(e, exp.Column)}
            if not {"window_start", "window_end"} <= named and window.kind is not WindowKind.SESSION:
                raise SqlError(f"{_short(select)}: a window aggregation groups by window_start "
                               f"and window_end")
            keys = [e for e in group_exprs
                    if not (isinstance(e, exp.Column) and e.name in WINDOW_COLUMNS)]
        else:
            keys = [e for e in group_exprs if _group_window_call(e) is None]
        # the aggregate's input: the keys, the aggregated values, the rowtime
        pre: list[tuple[str, Compiled]] = []
        key_names: list[str] = []
        for key in keys:
            compiled = compile_expression(key, scope)
            name = key.name if isinstance(key, exp.Column) and key.name not in WINDOW_COLUMNS \
                else f"__k{len(key_names)}"
            if name in key_names:
                continue
            pre.append((name, compiled))
            key_names.append(name)
            rewrites[_normal(key, source.aliases)] = column_ref(name)
        having = select.args.get("having")
        found = [a for e in [*select.expressions, *([having.this] if having is not None else [])]
                 for a in aggregate_calls(e)]
        calls: list[tuple[str, exp.Expr]] = []
        for call in found:
            normal = _normal(call, source.aliases)
            if normal in rewrites:
                continue
            output = f"__a{len(calls)}"
            calls.append((output, call))
            rewrites[normal] = column_ref(output)
        times = (window.start, window.end) if isinstance(window, InputWindows) else (window.time,)
        aggregated = window_aggregate(
            node, scope, window, pre, [(t, compile_expression(column_ref(t), scope)) for t in times],
            calls)
        # the SELECT list over the aggregate's rows
        if not tvf:  # TUMBLE_START(ts, ...) and the like: the window's columns
            for e in [*select.expressions, *([having.this] if having is not None else [])]:
                for call in e.find_all(exp.Anonymous):
                    column = _window_function_column(call)
                    if column is not None:
                        rewrites[_normal(call, source.aliases)] = exp.column(column)
        post_scope = Scope(aggregated.schema, frozenset(), self.catalog.functions)
        expressions = [_rewritten(e, rewrites, source.aliases) for e in select.expressions]
        for original, e in zip(select.expressions, expressions):
            _check_grouped(original, e, aggregated.schema)
        projections = _projections(expressions, post_scope, originals=select.expressions)
        condition = None
        if having is not None:
            condition = _predicate(_rewritten(having.this, rewrites, source.aliases), post_scope)
        return Calc(aggregated, condition, projections,
                    _schema(projections, expressions, aggregated.schema,
                            originals=select.expressions))


def _window_spec(tvf: WindowTvf, schema: RelSchema) -> WindowSpec:
    where = f"{tvf.kind.value}(... DESCRIPTOR({tvf.time_column}))"
    if tvf.time_column == schema.proctime and tvf.time_column != schema.rowtime:
        if tvf.kind is not WindowKind.TUMBLE:
            raise SqlError(f"{where}: windows over processing time are TUMBLE windows in "
                           f"raystream's SQL (HOP, SESSION and CUMULATE need a rowtime)")
        return WindowSpec(tvf.kind, tvf.time_column, size_ms=tvf.size_ms,
                          offset_ms=tvf.offset_ms, processing_time=True)
    _check_rowtime(tvf.time_column, schema, where)
    if tvf.kind is WindowKind.CUMULATE and (tvf.size_ms or 0) % (tvf.step_ms or 1):
        raise SqlError(f"{where}: a CUMULATE window's size ({tvf.size_ms} ms) must be a "
                       f"multiple of its step ({tvf.step_ms} ms)")
    return WindowSpec(tvf.kind, tvf.time_column, size_ms=tvf.size_ms, slide_ms=tvf.slide_ms,
                      gap_ms=tvf.gap_ms, offset_ms=tvf.offset_ms, step_ms=tvf.step_ms)


def _ranked_column(expr: exp.Expr, select: exp.Select | None, schema: RelSchema,
                   over: exp.Window, *, allowed: tuple[str, ...] = ()) -> str:
    """The column of the ranked rows that a PARTITION BY or ORDER BY expression of
    ``over`` names: a column of theirs, or an expression of ``select``'s list (by its
    name there: ``ORDER BY COUNT(*)`` of ``COUNT(*) AS n`` is ``n``)."""
    if isinstance(expr, exp.Column) and (schema.has(expr.name) or expr.name in allowed):
        return expr.name
    for index, e in enumerate(select.expressions if select is not None else []):
        inner = e.this if isinstance(e, exp.Alias) else e
        if _normal(inner, frozenset([inner.table] if isinstance(inner, exp.Column) else [])) \
                == _normal(expr, frozenset([expr.table] if isinstance(expr, exp.Column) else [])):
            return _output_name(e, index)
    raise SqlError(f"{sql_text(over)}: {sql_text(expr)} is not a column of the rows it ranks "
                   f"(rank by a column, or by an expression of the SELECT list)")


def _join_level(conjunct: exp.Expr, items: list[_From]) -> int:
    """The join of a FROM's ``items`` (0: the first) that a WHERE conjunct goes to: the
    first where all the tables it names are joined; the last where a name is unknown or
    ambiguous (that join says so)."""
    last = len(items) - 1
    found = 0
    for column in conjunct.find_all(exp.Column):
        if column.table:
            owners = [i for i, item in enumerate(items) if column.table in item.aliases]
        else:
            owners = [i for i, item in enumerate(items)
                      if item.node.schema.has(column.name) and not column.name.startswith("__")]
        found = max(found, owners[0] if len(owners) == 1 else last)
    return max(found - 1, 0)


def _check_lookup(table: exp.Expr, version: exp.Expr, left: RelSchema, right: Node) -> None:
    """``JOIN t FOR SYSTEM_TIME AS OF l.p``: ``p`` is the left input's PROCTIME() column and
    ``t`` a bounded table (a lookup join, Flink's on processing time)."""
    where = f"JOIN {sql_text(table)}"
    at = version.args.get("expression")
    if not (isinstance(at, exp.Column) and at.name == left.proctime and left.proctime):
        raise SqlError(f"{where}: a lookup join is FOR SYSTEM_TIME AS OF the left input's "
                       f"PROCTIME() column (a join with a versioned table, as of a rowtime, "
                       f"is not in raystream's SQL)")
    if not (isinstance(right, Scan) and right.spec.lookup is not None):
        raise SqlError(f"{where}: a lookup join looks up a bounded table of a connector "
                       f"that reads it whole (the filesystem connector without "
                       f"'source.monitor-interval')")


def _check_rowtime(column: str, schema: RelSchema, where: str) -> None:
    if column != schema.rowtime:
        have = f"its rowtime is {schema.rowtime!r}" if schema.rowtime else "it has no rowtime (no WATERMARK)"
        raise SqlError(f"{where}: {column!r} is not the table's rowtime attribute ({have})")


def _group_window_call(expr: exp.Expr) -> exp.Expr | None:
    name = expr.name.upper() if isinstance(expr, exp.Anonymous) else (
        "SESSION" if type(expr).__name__ == "Session" else None)
    return expr if name in _GROUP_WINDOWS else None


def _group_window(group: exp.Group, schema: RelSchema) -> WindowSpec | None:
    """The group window of ``GROUP BY ..., TUMBLE(ts, INTERVAL ...)`` (or HOP, SESSION)."""
    calls = [e for e in group.expressions if _group_window_call(e) is not None]
    if not calls:
        return None
    if len(calls) > 1:
        raise SqlError(f"GROUP BY {sql_text(group)}: one group window at most")
    call = calls[0]
    name = call.name.upper() if isinstance(call, exp.Anonymous) else "SESSION"
    arguments = list(call.expressions) if isinstance(call, exp.Anonymous) else [
        call.this, *call.expressions]
    time = arguments[0]
    if not isinstance(time, exp.Column):
        raise SqlError(f"{sql_text(call)}: the first argument is the rowtime column")
    durations = [interval_ms(a) for a in arguments[1:] if isinstance(a, exp.Interval)]
    kind = _GROUP_WINDOWS[name]
    _check_rowtime(time.name, schema, sql_text(call))
    if kind is WindowKind.HOP:
        if len(durations) != 2:
            raise SqlError(f"{sql_text(call)}: HOP takes the rowtime, a slide and a size")
        return WindowSpec(kind, time.name, slide_ms=durations[0], size_ms=durations[1])
    if len(durations) != 1:
        raise SqlError(f"{sql_text(call)}: {name} takes the rowtime and an interval")
    if kind is WindowKind.SESSION:
        return WindowSpec(kind, time.name, gap_ms=durations[0])
    return WindowSpec(kind, time.name, size_ms=durations[0])


def _window_function_column(call: exp.Anonymous) -> str | None:
    """The window column ``TUMBLE_START(...)``, ``SESSION_END(...)`` and the like read."""
    name = call.name.upper()
    for prefix in _GROUP_WINDOWS:
        if name == f"{prefix}_START":
            return "window_start"
        if name == f"{prefix}_END":
            return "window_end"
        if name == f"{prefix}_ROWTIME":
            return "window_time"
    return None


# -- expressions and names --------------------------------------------------------------------
def _predicate(expr: exp.Expr, scope: Scope) -> Compiled:
    compiled = compile_expression(expr, scope)
    if value_type(compiled.type) not in (pa.bool_(), pa.null()):
        raise SqlError(f"WHERE {sql_text(expr)}: a condition must be BOOLEAN, not "
                       f"{type_name(compiled.type)}")
    return compiled


def _identity(schema: RelSchema) -> tuple[tuple[str, Compiled], ...]:
    scope = Scope(schema)
    return tuple((f.name, compile_expression(column_ref(f.name), scope))
                 for f in schema.fields)


def _output_name(expr: exp.Expr, index: int) -> str:
    if isinstance(expr, exp.Alias):
        return expr.alias
    if isinstance(expr, (exp.Column, exp.Dot)):
        return expr.name
    return f"EXPR${index}"


def _projections(expressions: list[exp.Expr], scope: Scope, *,
                 originals: list[exp.Expr] | None = None) -> tuple[tuple[str, Compiled], ...]:
    out: list[tuple[str, Compiled]] = []
    for index, (expr, original) in enumerate(zip(expressions, originals or expressions)):
        if isinstance(expr, exp.Star) or (isinstance(expr, exp.Column) and isinstance(expr.this, exp.Star)):
            out += [(f.name, compile_expression(column_ref(f.name), scope))
                    for f in scope.schema.fields]
            continue
        name = _output_name(original, index)
        if any(name == n for n, _ in out):
            raise SqlError(f"{sql_text(original)}: the SELECT has two columns named {name!r} "
                           f"(name one with AS)")
        out.append((name, compile_expression(expr, scope)))
    return tuple(out)


def _schema(projections: tuple[tuple[str, Compiled], ...], expressions: list[exp.Expr],
            source: RelSchema, *, originals: list[exp.Expr] | None = None) -> RelSchema:
    """The SELECT's rows: the rowtime and the window columns of ``source`` go on as
    such where the SELECT keeps them as they are (renamed or not); ``originals``: the
    expressions as written, where ``expressions`` are them over an aggregate's rows."""
    named = originals or expressions
    window = None
    if source.window is not None:
        start, end = (_kept(expressions, named, c) for c in (source.window.start, source.window.end))
        window = WindowAttributes(start, end) if start and end else None
    rowtime = _kept(expressions, named, source.rowtime) if source.rowtime else None
    proctime = _kept(expressions, named, source.proctime) if source.proctime else None
    if proctime is None:  # a PROCTIME() of this SELECT's
        proctime = next((_output_name(original, index) for index, (expr, original)
                         in enumerate(zip(expressions, named)) if is_proctime(expr)), None)
    return RelSchema(tuple(Field(name, c.type, nullable=c.nullable) for name, c in projections),
                     rowtime=rowtime, window=window, proctime=proctime)


def _kept(expressions: list[exp.Expr], named: list[exp.Expr], column: str) -> str | None:
    """The output name of ``column``, where the SELECT keeps it as it is."""
    for index, (expr, original) in enumerate(zip(expressions, named)):
        inner = expr.this if isinstance(expr, exp.Alias) else expr
        if isinstance(inner, exp.Column) and inner.name == column:
            return _output_name(original, index)
        if isinstance(inner, exp.Star) or (isinstance(inner, exp.Column)
                                           and isinstance(inner.this, exp.Star)):
            return column
    return None


def _normal(expr: exp.Expr, aliases: frozenset[str]) -> str:
    """``expr`` as text without table qualifiers that are ``aliases`` (``B.bidder`` and
    ``bidder`` are one group key)."""
    def strip(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table in aliases:
            return column_ref(node.name)
        if isinstance(node, exp.Column):
            return exp.column(node.name, table=node.table or None, quoted=not node.name.isidentifier())
        return node
    return expr.copy().transform(strip).sql()


def _rewritten(expr: exp.Expr, rewrites: dict[str, exp.Expr], aliases: frozenset[str]) -> exp.Expr:
    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Alias):
            return node
        target = rewrites.get(_normal(node, aliases))
        return target.copy() if target is not None else node
    return expr.copy().transform(replace)


def _check_grouped(original: exp.Expr, rewritten: exp.Expr, schema: RelSchema) -> None:
    for column in rewritten.find_all(exp.Column):
        if not schema.has(column.name) and column.name not in WINDOW_COLUMNS:
            raise SqlError(f"{sql_text(original)}: {sql_text(column)} is neither grouped by nor "
                           f"aggregated")


def _columns(schema: RelSchema) -> str:
    return ", ".join(f"{f.name} {type_name(f.type)}" for f in schema.fields)


def _short(expr: exp.Expr) -> str:
    text = " ".join(sql_text(expr).split())
    return text if len(text) <= 60 else text[:57] + "..."
