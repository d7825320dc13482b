"""``FROM a JOIN b ON ...`` into a :class:`~raystream.engine.sql.plan.Join`: the
condition's conjuncts (with the WHERE's: an inner join may take them) sorted into what
each side filters on its own, the equality keys, the bounds of an interval join, and the
rest, checked on the joined rows.

Which join it is, as Flink's planner decides:

* **window join**: both inputs have window attributes (a window aggregation's rows, say)
  and the condition equates their ``window_start`` and ``window_end``. A pair is joined
  when its window ends; state lives as long as the window.
* **interval join**: both inputs have a rowtime and the condition bounds one by the
  other from both sides (``a.ts BETWEEN b.ts - INTERVAL '5' SECOND AND b.ts``). State
  lives as long as the interval.
* **regular join**: anything else. Every row of both inputs is kept (no watermark
  ever makes a row useless), so state grows with the input.

Only inner joins of insert-only inputs are planned, so the result is insert-only too.
``FROM a JOIN b ON ... JOIN c ON ...`` is planned left-deep: the left input of the
second join is the first (a :class:`JoinInput` with its :class:`JoinedNames`, so that
``b.ts`` still names its column). The left input's rowtime goes on through window,
interval and lookup joins (an interval join holds its watermark back by the interval,
so none of its rows is late), not through regular joins.

    >>> import pyarrow as pa, raystream as rs
    >>> env = rs.StreamEnvironment()
    >>> a = env.from_collection([{"k": 1, "x": 2}])
    >>> b = env.from_collection([{"k": 1, "y": 3}])
    >>> env.create_temporary_view("a", a, schema=pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    >>> env.create_temporary_view("b", b, schema=pa.schema([("k", pa.int64()), ("y", pa.int64())]))
    >>> print(env.sql_query("SELECT a.k, x, y FROM a JOIN b ON a.k = b.k WHERE y > 1").explain())
    Calc(select=[k, x, y])
      Join(kind=[regular], keys=[a.k = b.k])
        Calc(select=[k, x, k AS __jk0], where=[NOT k IS NULL])
          DataStreamScan(table=[a], fields=[k, x])
        Calc(select=[k, y, k AS __jk0], where=[y > 1 AND NOT k IS NULL])
          DataStreamScan(table=[b], fields=[k, y])
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

import pyarrow as pa
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.arrow_types import type_name, value_type
from raystream.engine.sql.compiled import (Compiled, cast_to, column_ref, common_type, plain,
                                           sql_text)
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.intervals import interval_ms
from raystream.engine.sql.plan import JOIN_KEY_PREFIX, Calc, Interval, Join, JoinKind, Node
from raystream.engine.sql.schema import Field, RelSchema, WindowAttributes

@dataclass(frozen=True)
class JoinInput:
    """One input of a join: its plan, the names that may qualify its columns and, where
    it is a join itself (``FROM a JOIN b ON ... JOIN c ON ...``: ``a JOIN b``), the names
    of that join's rows (``b.ts`` is its ``ts0``)."""

    node: Node
    aliases: frozenset[str]
    names: "JoinedNames | None" = None

    def owns(self, name: str) -> bool:
        """Whether the unqualified column ``name`` is one of this input's tables'."""
        if self.names is None:
            return name in _data_names(self.node.schema)
        return any(i.owns(name) for i in self.names.inputs)

    def local_name(self, column: exp.Column) -> str:
        """``column`` (of this input) by its name in this input's rows."""
        if self.names is None:
            if not self.node.schema.has(column.name):
                raise SqlError(f"{sql_text(column)}: {column.table!r} has no column "
                               f"{column.name!r}{_hint(column.name, self.node.schema.names)}")
            return column.name
        side, name = self.names.side(column)
        return self.names.joined[side][name]


@dataclass(frozen=True)
class Planned:
    """A join planned: its node (the join, under a Calc for what only the joined rows
    can check) and a function that rewrites an expression over both inputs' columns
    into one over the joined rows' (``B.dateTime`` into ``dateTime0``)."""

    node: Node
    names: "JoinedNames"

    def rewrite(self, expr: exp.Expr) -> exp.Expr:
        return self.names.rewrite(expr)

    def as_input(self) -> JoinInput:
        """The joined rows as the left input of the next join (planned left-deep)."""
        left, right = self.names.inputs
        return JoinInput(self.node, left.aliases | right.aliases, self.names)


class JoinedNames:
    """The joined rows' columns: the left input's, then the right's, a name both have
    numbered on the right (Flink's ``dateTime0``); which input a column reference means."""

    def __init__(self, left: JoinInput, right: JoinInput) -> None:
        self.inputs = (left, right)
        taken = set(_data_names(left.node.schema))
        self.joined: tuple[dict[str, str], dict[str, str]] = (
            {n: n for n in _data_names(left.node.schema)}, {})
        for name in _data_names(right.node.schema):
            new, i = name, 0
            while new in taken:
                new, i = f"{name}{i}", i + 1
            taken.add(new)
            self.joined[1][name] = new

    def side(self, column: exp.Column) -> tuple[int, str]:
        """Which input ``column`` names (0 left, 1 right) and its name there."""
        name, table = column.name, column.table
        if table:
            sides = [i for i, j in enumerate(self.inputs) if table in j.aliases]
            if not sides:
                raise SqlError(f"{sql_text(column)}: no table {table!r} in the FROM "
                               f"(it has {', '.join(sorted(self._aliases()))})")
            return sides[0], self.inputs[sides[0]].local_name(column)
        sides = [i for i, j in enumerate(self.inputs) if j.owns(name)]
        if len(sides) > 1:
            raise SqlError(f"{sql_text(column)}: both joined inputs have a column {name!r}; "
                           f"qualify it ({' or '.join(f'{a}.{name}' for a in self._firsts())})")
        if not sides:
            everything = [*_data_names(self.inputs[0].node.schema),
                          *_data_names(self.inputs[1].node.schema)]
            raise SqlError(f"{sql_text(column)}: no column {name!r} in the joined inputs"
                           f"{_hint(name, everything)}")
        return sides[0], self.inputs[sides[0]].local_name(column)

    def sides_of(self, expr: exp.Expr) -> set[int]:
        return {self.side(c)[0] for c in expr.find_all(exp.Column)}

    def local(self, expr: exp.Expr) -> exp.Expr:
        """``expr`` (of one input's columns) over that input's own names."""
        return _transform_columns(expr, lambda c: column_ref(self.side(c)[1]))

    def rewrite(self, expr: exp.Expr) -> exp.Expr:
        """``expr`` over the joined rows' names."""
        def joined(column: exp.Column) -> exp.Expr:
            side, name = self.side(column)
            return column_ref(self.joined[side][name])
        return _transform_columns(expr, joined)

    def _aliases(self) -> set[str]:
        return {a for j in self.inputs for a in j.aliases}

    def _firsts(self) -> list[str]:
        return [sorted(j.aliases)[0] if j.aliases else "?" for j in self.inputs]


def plan_join(left: JoinInput, right: JoinInput, join: exp.Join,
              where: list[exp.Expr], functions: dict, *, lookup: bool = False) -> Planned:
    """The join of ``left`` and ``right`` under ``join``'s condition and the WHERE's
    conjuncts ``where`` (an inner join checks them all: below it where one input's
    columns decide, on the joined rows where both inputs' do); ``lookup``: ``right`` is
    a table looked up by the equalities (``FOR SYSTEM_TIME AS OF`` a processing time)."""
    side = join.args.get("side") or ""
    kind = join.args.get("kind") or ""
    if kind.upper() == "CROSS":
        raise SqlError("CROSS JOIN: a cross join is not in raystream's SQL (join on an "
                       "equality or a time bound)")
    if side or kind.upper() not in ("", "INNER"):
        what = " ".join(p for p in (side, kind) if p).upper()
        raise SqlError(f"{what} JOIN: raystream's SQL has inner joins; an outer join makes "
                       f"an updating result, which it does not have yet")
    if join.args.get("using"):
        raise SqlError("JOIN ... USING: write the condition with ON")
    on = join.args.get("on")  # (None: FROM a, b WHERE ...)
    names = JoinedNames(left, right)
    pushed: tuple[list[exp.Expr], list[exp.Expr]] = ([], [])
    pairs: list[tuple[exp.Expr, exp.Expr]] = []
    both: list[exp.Expr] = []
    for conjunct in [*(conjuncts(on) if on is not None else []), *where]:
        sides = names.sides_of(conjunct)
        if len(sides) == 1:
            pushed[sides.pop()].append(names.local(conjunct))
        elif not sides:
            both.append(conjunct)
        elif (pair := _equality(conjunct, names)) is not None:
            pairs.append(pair)
        else:
            both.append(conjunct)
    schemas = (left.node.schema, right.node.schema)
    if lookup and not pairs:
        raise SqlError(f"JOIN {sql_text(join.this)}: a lookup join needs an equality of the "
                       f"two inputs' columns")
    windows = None if lookup else _window_keys(pairs, names, schemas)
    interval = None
    if windows is None and not lookup:
        interval, both = _interval(both, names, schemas)
    if windows is None and interval is None and not pairs:
        condition = sql_text(on) if on is not None else "(no condition)"
        raise SqlError(f"JOIN ... ON {condition}: a join needs an equality of the two "
                       f"inputs' columns, a time bound or a window (a cross join is not "
                       f"in raystream's SQL)")
    kind_ = (JoinKind.LOOKUP if lookup else JoinKind.WINDOW if windows
             else JoinKind.INTERVAL if interval else JoinKind.REGULAR)
    key_pairs = [p for p in pairs if windows is None or all(p is not w for w in windows[1])]
    sides = [_keyed_side(j, [names.local(p[i]) for p in key_pairs], pushed[i], functions,
                         other=[names.local(p[1 - i]) for p in key_pairs],
                         other_schema=schemas[1 - i])
             for i, j in enumerate((left, right))]
    keys = tuple((f"{JOIN_KEY_PREFIX}{i}", f"{JOIN_KEY_PREFIX}{i}") for i in range(len(key_pairs)))
    fields = [replace(f, name=names.joined[s][f.name])
              for s in (0, 1) for f in schemas[s].fields if f.name in names.joined[s]]
    window = None if windows is None else WindowAttributes(
        names.joined[0][windows[0][0].start], names.joined[0][windows[0][0].end])
    # the left input's time attributes go on where no joined row can be late for them
    # (a regular join's rows come whenever; see the module's docs)
    rowtime = proctime = None
    if kind_ is not JoinKind.REGULAR and schemas[0].rowtime in names.joined[0]:
        rowtime = names.joined[0][schemas[0].rowtime]
    if kind_ is JoinKind.LOOKUP and schemas[0].proctime in names.joined[0]:
        proctime = names.joined[0][schemas[0].proctime]
    schema = RelSchema(tuple(fields), rowtime=rowtime, window=window, proctime=proctime)
    described = tuple(f"{sql_text(a)} = {sql_text(b)}" for a, b in key_pairs)
    node: Node = Join(sides[0], sides[1], kind_, keys, interval,
                      None if windows is None else windows[0], schema, described)
    if both:
        scope = Scope(schema, frozenset(), functions)
        condition = compile_expression(conjunction(names.rewrite(c) for c in both), scope)
        identity = tuple((f.name, compile_expression(column_ref(f.name), scope))
                         for f in schema.fields)
        node = Calc(node, condition, identity, schema)
    return Planned(node, names)


def _keyed_side(side: JoinInput, keys: list[exp.Expr], pushed: list[exp.Expr],
                functions: dict, *, other: list[exp.Expr], other_schema: RelSchema) -> Calc:
    """The input with its own conditions applied, its NULL keys dropped (NULL equals
    nothing) and the key columns ``__jk<i>`` beside its columns, cast to the type both
    sides' keys share."""
    schema = side.node.schema
    scope = Scope(schema, frozenset(), functions)
    other_scope = Scope(other_schema, frozenset(), functions)
    projections = [(f.name, compile_expression(column_ref(f.name), scope)) for f in schema.fields]
    conditions = list(pushed)
    for i, (key, theirs) in enumerate(zip(keys, other)):
        mine = compile_expression(key, scope)
        target = common_type(key, [mine.type, compile_expression(theirs, other_scope).type])
        if target == pa.null():
            raise SqlError(f"{sql_text(key)}: a join key of type NULL never matches")
        if pa.types.is_nested(target):
            raise SqlError(f"{sql_text(key)}: a join key must be a single value, not "
                           f"{type_name(target)}")
        projections.append((f"{JOIN_KEY_PREFIX}{i}", _decoded(cast_to(mine, target))))
        if mine.nullable:
            conditions.append(exp.Not(this=exp.Is(this=key.copy(), expression=exp.Null())))
    condition = compile_expression(conjunction(conditions), scope) if conditions else None
    fields = [*schema.fields, *(Field(n, value_type(c.type), nullable=False)
                                for n, c in projections[len(schema.fields):])]
    return Calc(side.node, condition, tuple(projections), replace(schema, fields=tuple(fields)))


# -- the condition ------------------------------------------------------------------------
def _equality(conjunct: exp.Expr, names: JoinedNames) -> tuple[exp.Expr, exp.Expr] | None:
    """``l = r`` with ``l`` over the left input only and ``r`` over the right only."""
    if not isinstance(conjunct, exp.EQ):
        return None
    a, b = conjunct.this, conjunct.expression
    sa, sb = names.sides_of(a), names.sides_of(b)
    if sa == {0} and sb == {1}:
        return a, b
    if sa == {1} and sb == {0}:
        return b, a
    return None


def _window_keys(pairs: list[tuple[exp.Expr, exp.Expr]], names: JoinedNames,
                 schemas: tuple[RelSchema, RelSchema]
                 ) -> tuple[tuple[WindowAttributes, WindowAttributes],
                            list[tuple[exp.Expr, exp.Expr]]] | None:
    """Both inputs' windows, where the equalities equate their starts and their ends
    (with those two equalities)."""
    left, right = schemas[0].window, schemas[1].window
    if left is None or right is None:
        return None
    found: dict[str, tuple[exp.Expr, exp.Expr]] = {}
    for pair in pairs:
        a, b = pair
        if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
            continue
        ours, theirs = names.side(a)[1], names.side(b)[1]
        if (ours, theirs) == (left.start, right.start):
            found["start"] = pair
        elif (ours, theirs) == (left.end, right.end):
            found["end"] = pair
    if len(found) < 2:
        return None
    return (left, right), [found["start"], found["end"]]


def _interval(conjuncts: list[exp.Expr], names: JoinedNames,
              schemas: tuple[RelSchema, RelSchema]) -> tuple[Interval | None, list[exp.Expr]]:
    """The bounds ``conjuncts`` put on right rowtime - left rowtime, from both sides,
    and the conjuncts that are not bounds of it."""
    if schemas[0].rowtime is None or schemas[1].rowtime is None:
        return None, conjuncts
    lower: tuple[int, bool] | None = None
    upper: tuple[int, bool] | None = None
    rest: list[exp.Expr] = []
    for conjunct in [c for e in conjuncts for c in _between_split(e)]:
        bound = _bound(conjunct, names, schemas)
        if bound is None:
            rest.append(conjunct)
            continue
        is_lower, value, inclusive = bound
        if is_lower and lower is None:
            lower = (value, inclusive)
        elif not is_lower and upper is None:
            upper = (value, inclusive)
        else:
            rest.append(conjunct)
    if lower is None or upper is None:
        return None, conjuncts
    return Interval(lower[0], upper[0], lower[1], upper[1]), rest


_MIRRORED = {exp.GTE: exp.LTE, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.LT: exp.GT}


def _bound(conjunct: exp.Expr, names: JoinedNames, schemas: tuple[RelSchema, RelSchema]
           ) -> tuple[bool, int, bool] | None:
    """``conjunct`` as a bound on right rowtime - left rowtime: (is it a lower bound,
    the value in ms, inclusive)."""
    if type(conjunct) not in _MIRRORED:
        return None
    a, b = _time_term(conjunct.this, names, schemas), _time_term(conjunct.expression, names, schemas)
    if a is None or b is None or a[0] == b[0]:
        return None
    op = type(conjunct)
    if a[0] == 0:  # L + oa  op  R + ob  <=>  R - L  mirrored(op)  oa - ob
        op, value = _MIRRORED[op], a[1] - b[1]
    else:          # R + oa  op  L + ob  <=>  R - L  op  ob - oa
        value = b[1] - a[1]
    return op in (exp.GTE, exp.GT), value, op in (exp.GTE, exp.LTE)


def _time_term(expr: exp.Expr, names: JoinedNames, schemas: tuple[RelSchema, RelSchema]
               ) -> tuple[int, int] | None:
    """``expr`` as (side, offset in ms) where it is a side's rowtime plus or minus an
    interval."""
    offset = 0
    while isinstance(expr, exp.Paren):
        expr = expr.this
    if isinstance(expr, (exp.Add, exp.Sub)) and isinstance(expr.expression, exp.Interval):
        offset = interval_ms(expr.expression) * (1 if isinstance(expr, exp.Add) else -1)
        expr = expr.this
    elif isinstance(expr, exp.Add) and isinstance(expr.this, exp.Interval):
        offset, expr = interval_ms(expr.this), expr.expression
    if not isinstance(expr, exp.Column):
        return None
    side, name = names.side(expr)
    return (side, offset) if name == schemas[side].rowtime else None


def _between_split(expr: exp.Expr) -> list[exp.Expr]:
    if isinstance(expr, exp.Between):
        return [exp.GTE(this=expr.this.copy(), expression=expr.args["low"].copy()),
                exp.LTE(this=expr.this.copy(), expression=expr.args["high"].copy())]
    return [expr]


def conjuncts(expr: exp.Expr) -> list[exp.Expr]:
    """The operands of ``expr``'s top-level ANDs."""
    if isinstance(expr, exp.And):
        return [*conjuncts(expr.this), *conjuncts(expr.expression)]
    if isinstance(expr, exp.Paren):
        return conjuncts(expr.this)
    return [expr]


def conjunction(conjuncts) -> exp.Expr:
    """The AND of ``conjuncts`` (at least one)."""
    out = None
    for c in conjuncts:
        out = c if out is None else exp.And(this=out, expression=c)
    assert out is not None
    return out


# -- compiled pieces ----------------------------------------------------------------------
def _decoded(compiled: Compiled) -> Compiled:
    """A key column as plain values (a dictionary decoded: keys hash by value)."""
    if not pa.types.is_dictionary(compiled.type):
        return compiled
    inner = compiled.evaluate
    return Compiled(compiled.type.value_type, lambda batch: plain(inner(batch)), compiled.sql,
                    nullable=compiled.nullable)


def _data_names(schema: RelSchema) -> list[str]:
    return [f.name for f in schema.fields if not f.name.startswith(JOIN_KEY_PREFIX)]


def _transform_columns(expr: exp.Expr, fn) -> exp.Expr:
    return expr.copy().transform(lambda node: fn(node) if isinstance(node, exp.Column) else node)


def _hint(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
