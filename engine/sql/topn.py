"""Window Top-N: ``SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY
window_start, window_end[, k] ORDER BY x DESC) AS rn FROM ...) WHERE rn <= N``, as
Flink's window Top-N: append-only, one final result per window, when the watermark
passes its end. Two forms, as Flink has:

* over a window aggregation's rows (or anything that keeps their window columns):
  the windows they have already, a window of 1 ms at each row's ``window_end - 1``
  keyed by ``k`` and ``window_start`` (as a cascaded window aggregation);
* over a window table function directly (``FROM TABLE(TUMBLE(...))`` or ``HOP``,
  no GROUP BY): the window operator's own windows over the rowtime, late rows dropped
  by the DataStream API's rule; the rows get ``window_start``, ``window_end`` and
  ``window_time``.

Each partition's window is ranked when it fires by one ``sort_indices`` of its rows
(:class:`RankedRows`, the window operator's process path: one call per partition and
window, not per row). Ties: Flink's ROW_NUMBER numbers rows of equal sort keys in their
arrival order, which differs between runs at parallelism > 1; here they are ordered by
their other columns (ascending, in the order of the columns), so a replay after a
failure ranks them the same.

    >>> import pyarrow as pa, raystream as rs
    >>> env = rs.StreamEnvironment()
    >>> bids = env.from_collection([{"item": 1, "price": 5, "ts": 1000}])
    >>> env.create_temporary_view("bids", bids, schema=pa.schema([("item", pa.int64()),
    ...     ("price", pa.int64()), ("ts", pa.timestamp("ms"))]), rowtime="ts")
    >>> print(env.sql_query('''SELECT * FROM (SELECT item, price, window_start,
    ...     ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY price DESC) AS rn
    ...     FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '1' MINUTE))) WHERE rn <= 3
    ...     ''').explain())
    Calc(select=[item, price, window_start, rn])
      Calc(select=[item, price, window_start, rn])
        WindowRank(rankType=[ROW_NUMBER], rankRange=[rankStart=1, rankEnd=3], partitionBy=[], orderBy=[price DESC], window=[TUMBLE(ts, size=60000 ms)], select=[*, rn])
          DataStreamScan(table=[bids], fields=[item, price, ts])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sql.compiled import sql_text
from raystream.engine.sql.schema import Field, RelSchema
from raystream.engine.windows.functions import ProcessWindowFunction, Window


@dataclass(frozen=True)
class TopNQuery:
    """A Top-N's parts: the inner SELECT, its ROW_NUMBER() call (with its place in the
    select list and its name), N, and the outer WHERE's other conjuncts."""

    inner: exp.Select
    over: exp.Window
    position: int
    rank: str
    limit: int
    rest: tuple[exp.Expr, ...]


def top_n_query(from_: exp.From | None, conditions: tuple[exp.Expr, ...]) -> TopNQuery | None:
    """The Top-N that ``FROM (...) WHERE conditions`` is, if it is one."""
    item = from_.this if from_ is not None else None
    if not (isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select)):
        return None
    inner = item.this
    found = [(i, e) for i, e in enumerate(inner.expressions)
             if isinstance(e.this if isinstance(e, exp.Alias) else e, exp.Window)]
    if not found:
        return None
    if len(found) > 1:
        raise SqlError(f"{sql_text(found[1][1])}: one ROW_NUMBER() per SELECT in raystream's SQL")
    position, alias = found[0]
    over = alias.this if isinstance(alias, exp.Alias) else alias
    assert isinstance(over, exp.Window)
    if not isinstance(over.this, exp.RowNumber):
        raise SqlError(f"{sql_text(over)}: raystream's SQL ranks with ROW_NUMBER() only "
                       f"(RANK and DENSE_RANK are not there yet)")
    if not isinstance(alias, exp.Alias):
        raise SqlError(f"{sql_text(over)}: name the row number (AS rn) and bound it in the "
                       f"outer WHERE (rn <= N)")
    rank = alias.alias
    limits = [(c, n) for c in conditions if (n := _limit(c, rank)) is not None]
    if not limits:
        raise SqlError(f"{sql_text(over)}: a ROW_NUMBER() is a window Top-N in raystream's SQL: "
                       f"bound it in the outer WHERE ({rank} <= N)")
    limit = min(n for _, n in limits)
    if limit < 1:
        raise SqlError(f"WHERE {sql_text(limits[0][0])}: a Top-N keeps at least one row")
    rest = tuple(c for c in conditions if all(c is not bound for bound, _ in limits))
    return TopNQuery(inner, over, position, rank, limit, rest)


def _limit(condition: exp.Expr, rank: str) -> int | None:
    """N of ``rn <= N``, ``rn < N + 1``, ``N >= rn``, ``rn = 1`` (None: not a bound on rn)."""
    if not isinstance(condition, (exp.LTE, exp.LT, exp.GTE, exp.GT, exp.EQ)):
        return None
    a, b = condition.this, condition.expression
    flipped = {exp.GTE: exp.LTE, exp.GT: exp.LT, exp.EQ: exp.EQ}
    if isinstance(b, exp.Column) and b.name == rank and type(condition) in flipped:
        a, b, kind = b, a, flipped[type(condition)]
    else:
        kind = type(condition)
    if not (isinstance(a, exp.Column) and a.name == rank and isinstance(b, exp.Literal)
            and not b.is_string and kind in (exp.LTE, exp.LT, exp.EQ)):
        return None
    n = int(b.this)
    if kind is exp.EQ and n != 1:
        raise SqlError(f"WHERE {sql_text(condition)}: a Top-N keeps the first rows "
                       f"({a.name} <= N or {a.name} = 1)")
    return n - 1 if kind is exp.LT else n


def sort_keys(over: exp.Window) -> list[tuple[exp.Expr, bool]]:
    """The ORDER BY of ``over``: (expression, descending)."""
    order = over.args.get("order")
    if order is None:
        raise SqlError(f"{sql_text(over)}: a Top-N's ROW_NUMBER() has an ORDER BY")
    return [(o.this, bool(o.args.get("desc"))) for o in order.expressions]


class RankedRows(ProcessWindowFunction):
    """A fired partition window's first ``limit`` rows by ``order`` (ties by
    ``ties``), numbered in ``rank``, as the columns of ``schema``; ``nullable``: key
    columns sent with a NULL flag (``key$null``), made NULL again; ``windowed``: the
    rows get the window's columns."""

    def __init__(self, order: tuple[tuple[str, bool], ...], ties: tuple[str, ...], limit: int,
                 rank: str, schema: pa.Schema, nullable: tuple[str, ...], windowed: bool) -> None:
        self.order, self.ties, self.limit, self.rank = order, ties, limit, rank
        self.schema, self.nullable, self.windowed = schema, nullable, windowed

    def process(self, key: Any, window: Window, rows: pa.Table) -> list[dict]:
        keys = [(c, "descending" if d else "ascending") for c, d in self.order]
        keys += [(c, "ascending") for c in self.ties]
        index = pc.sort_indices(rows, sort_keys=keys, null_placement="at_end")  # pyright: ignore[reportAttributeAccessIssue]
        top = rows.take(index[:self.limit])
        n = top.num_rows
        columns = {name: top.column(name) for name in top.column_names}
        for name in self.nullable:
            columns[name] = pc.if_else(columns[f"{name}$null"], pa.scalar(None, columns[name].type),  # pyright: ignore[reportAttributeAccessIssue]
                                       columns[name])
        if self.windowed:
            for name, value in (("window_start", window.start), ("window_end", window.end),
                                ("window_time", window.end - 1)):
                columns[name] = pa.array(np.full(n, value, np.int64)).cast(pa.timestamp("ms"))
        columns[self.rank] = pa.array(np.arange(1, n + 1, dtype=np.int64))
        return pa.table([columns[f.name] for f in self.schema], schema=self.schema).to_pylist()


def ranked_schema(input_: RelSchema, rank: str, windowed: bool) -> RelSchema:
    """The Top-N's rows: the input's columns (and the window's, ``windowed``), then the
    row number."""
    fields = list(input_.fields)
    if windowed:
        fields += [Field(c, pa.timestamp("ms"), nullable=False)
                   for c in ("window_start", "window_end", "window_time")]
    fields.append(Field(rank, pa.int64(), nullable=False))
    return RelSchema(tuple(fields))
