"""The plan a SQL statement becomes: a tree of typed, frozen nodes, each with the
:class:`~raystream.engine.sql.schema.RelSchema` of its rows, that
:mod:`~raystream.engine.sql.translate` turns into DataStream operators and
:func:`explain` prints (``EXPLAIN``, ``Table.explain()``).

Expressions in a node are compiled already (:class:`~raystream.engine.sql.compiled.Compiled`,
pyarrow kernels): nothing after planning reads SQL text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import pyarrow as pa

from raystream.engine.sql.ast import WindowKind
from raystream.engine.sql.catalog import StreamEntry, TableEntry
from raystream.engine.sql.compiled import Compiled
from raystream.engine.sql.connector_base import Connector, ScanSpec
from raystream.engine.sql.schema import RelSchema, WindowAttributes


@dataclass(frozen=True)
class Scan:
    """A table read through its connector (with the conditions it took)."""

    table: str
    spec: ScanSpec

    @property
    def schema(self) -> RelSchema:
        return self.spec.schema


@dataclass(frozen=True)
class StreamScan:
    """A DataStream registered as a table."""

    entry: StreamEntry

    @property
    def schema(self) -> RelSchema:
        return self.entry.schema


@dataclass(frozen=True)
class Calc:
    """Rows of ``input`` where ``condition`` holds (None: all), as ``projections``
    (Flink's Calc: a filter and a projection in one operator)."""

    input: Node
    condition: Compiled | None
    projections: tuple[tuple[str, Compiled], ...]
    schema: RelSchema


class AggregateKind(Enum):
    """The built-in window aggregates (``engine/windows/aggregates.py``'s kinds)."""

    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    MEAN = "mean"


@dataclass(frozen=True)
class AggregateCall:
    """``output`` = ``kind`` of column ``column`` (None: rows) of the aggregate's input;
    ``type``: the result's SQL type (the aggregate's own is cast to it)."""

    output: str
    kind: AggregateKind
    column: str | None
    type: pa.DataType
    sql: str


@dataclass(frozen=True)
class WindowSpec:
    """A window table function's windows over the rowtime column ``time`` (or the
    processing-time one)."""

    kind: WindowKind
    time: str
    size_ms: int | None = None
    slide_ms: int | None = None
    gap_ms: int | None = None
    offset_ms: int = 0
    processing_time: bool = False  # ``time`` is a PROCTIME() column: windows of the clock
    step_ms: int | None = None  # CUMULATE: how much longer each window of a cumulation is

    def describe(self) -> str:
        sizes = {WindowKind.TUMBLE: f"size={self.size_ms} ms",
                 WindowKind.HOP: f"slide={self.slide_ms} ms, size={self.size_ms} ms",
                 WindowKind.CUMULATE: f"step={self.step_ms} ms, size={self.size_ms} ms",
                 WindowKind.SESSION: f"gap={self.gap_ms} ms"}.get(self.kind, "")
        clock = " (processing time)" if self.processing_time else ""
        return f"{self.kind.value}({self.time}{clock}, {sizes})"


@dataclass(frozen=True)
class InputWindows:
    """The windows the input's rows have already (columns ``start`` and ``end``): a
    window aggregation over a window aggregation's or a window join's rows (Flink's
    cascading window aggregation)."""

    start: str
    end: str

    def describe(self) -> str:
        return f"WINDOWED(start={self.start}, end={self.end})"


@dataclass(frozen=True)
class WindowAggregate:
    """Per ``keys`` (columns of ``input``) and window, ``aggregates``; the rows are the
    keys, ``window_start``, ``window_end``, ``window_time`` (``window_end`` - 1 ms, the
    rowtime) and the aggregates, in ``schema``."""

    input: Node
    window: WindowSpec | InputWindows
    keys: tuple[str, ...]
    aggregates: tuple[AggregateCall, ...]
    schema: RelSchema


@dataclass(frozen=True)
class Expand:
    """Each row of ``input`` once per copy of ``copies`` (each the same columns, in
    ``schema``), Flink's Expand: a distinct count's first aggregation reads them (see
    :mod:`~raystream.engine.sql.aggregates`)."""

    input: Node
    copies: tuple[tuple[tuple[str, Compiled], ...], ...]
    schema: RelSchema


@dataclass(frozen=True)
class WindowTopN:
    """Per window and ``keys``, the first ``limit`` rows of ``input`` by ``order`` (each
    a column and whether it sorts descending), numbered in column ``rank`` from 1
    (Flink's window Top-N, ``ROW_NUMBER() OVER (PARTITION BY window_start, window_end,
    ...) ... WHERE rn <= N``): one final result per window, when it ends. ``window``: a
    window table function's windows over ``input``'s rowtime (its rows get the window
    columns too) or the windows ``input``'s rows have already."""

    input: Node
    window: WindowSpec | InputWindows
    keys: tuple[str, ...]
    order: tuple[tuple[str, bool], ...]
    limit: int
    rank: str
    schema: RelSchema


JOIN_KEY_PREFIX = "__jk"  # a join input's key columns: __jk0, __jk1, ...


class JoinKind(Enum):
    """How a join keeps its state (see :mod:`~raystream.engine.sql.joins`)."""

    REGULAR = "regular"
    INTERVAL = "interval"
    WINDOW = "window"
    LOOKUP = "lookup"  # the right input a bounded table each subtask holds whole


@dataclass(frozen=True)
class Interval:
    """An interval join's bounds on right rowtime - left rowtime, in ms."""

    lower_ms: int
    upper_ms: int
    lower_inclusive: bool = True
    upper_inclusive: bool = True

    @property
    def watermark_delay_ms(self) -> int:
        """How far the join's output watermark stays behind its inputs' so that neither
        rowtime of a pair is late downstream (Flink's: the interval's larger side)."""
        return max(0, self.upper_ms, -self.lower_ms)

    def describe(self) -> str:
        return (f"{'[' if self.lower_inclusive else '('}{self.lower_ms} ms, "
                f"{self.upper_ms} ms{']' if self.upper_inclusive else ')'}")


@dataclass(frozen=True)
class Join:
    """An inner join of two insert-only inputs on equal ``keys`` (pairs of a left and a
    right column), per window (``windows``: each input's window columns) or within
    ``interval`` or regular; the rows are the left input's columns, then the right's
    (the key columns left out), in ``schema``."""

    left: Node
    right: Node
    kind: JoinKind
    keys: tuple[tuple[str, str], ...]
    interval: Interval | None
    windows: tuple[WindowAttributes, WindowAttributes] | None
    schema: RelSchema
    described: tuple[str, ...] = ()

    def columns(self) -> list[tuple[int, str, str]]:
        """(input 0 or 1, its column, the result's name) of each column of the result:
        the inputs' columns but their key columns, in order."""
        data = [(i, name) for i, side in enumerate((self.left, self.right))
                for name in side.schema.names if not name.startswith(JOIN_KEY_PREFIX)]
        return [(i, name, f.name) for (i, name), f in zip(data, self.schema.fields)]


@dataclass(frozen=True)
class Union:
    """UNION ALL: every row of every input."""

    inputs: tuple[Node, ...]
    schema: RelSchema


Node = Scan | StreamScan | Calc | Expand | WindowAggregate | WindowTopN | Join | Union


@dataclass(frozen=True)
class Sink:
    """``INSERT INTO table``: ``input``'s rows, cast to the table's columns."""

    table: TableEntry
    connector: Connector
    input: Node


def explain(node: Node | Sink, depth: int = 0) -> str:
    """The plan as indented lines, one node per line (what EXPLAIN prints).

        >>> import pyarrow as pa
        >>> from raystream.engine.sql.catalog import StreamEntry
        >>> from raystream.engine.sql.schema import Field, RelSchema
        >>> scan = StreamScan(StreamEntry("clicks", None, RelSchema((Field("a", pa.int64()),))))
        >>> print(explain(scan))
        DataStreamScan(table=[clicks], fields=[a])
    """
    pad = "  " * depth
    if isinstance(node, Sink):
        return f"{pad}Sink(table=[{node.table.name}], connector=[{node.connector.name}])\n" + \
            explain(node.input, depth + 1)
    fields = ", ".join(node.schema.names)
    if isinstance(node, Scan):
        return f"{pad}TableSourceScan(table=[{node.table}], {node.spec.description}, fields=[{fields}])"
    if isinstance(node, StreamScan):
        return f"{pad}DataStreamScan(table=[{node.entry.name}], fields=[{fields}])"
    if isinstance(node, Calc):
        where = "" if node.condition is None else f", where=[{node.condition.sql}]"
        line = f"{pad}Calc(select=[{_selected(node.projections)}]{where})"
    elif isinstance(node, Expand):
        copies = ", ".join(f"[{_selected(c)}]" for c in node.copies)
        line = f"{pad}Expand(copies=[{copies}])"
    elif isinstance(node, WindowAggregate):
        aggs = ", ".join(f"{a.sql} AS {a.output}" for a in node.aggregates)
        line = (f"{pad}WindowAggregate(groupBy=[{', '.join(node.keys)}], "
                f"window=[{node.window.describe()}], select=[{aggs}])")
    elif isinstance(node, WindowTopN):
        order = ", ".join(f"{c} {'DESC' if d else 'ASC'}" for c, d in node.order)
        line = (f"{pad}WindowRank(rankType=[ROW_NUMBER], rankRange=[rankStart=1, "
                f"rankEnd={node.limit}], partitionBy=[{', '.join(node.keys)}], "
                f"orderBy=[{order}], window=[{node.window.describe()}], select=[*, {node.rank}])")
    elif isinstance(node, Join):
        extra = f", interval=[{node.interval.describe()}]" if node.interval else ""
        if node.windows is not None:
            extra += f", window=[{node.windows[0].start}, {node.windows[0].end}]"
        line = f"{pad}Join(kind=[{node.kind.value}], keys=[{', '.join(node.described)}]{extra})"
        return "\n".join([line, explain(node.left, depth + 1), explain(node.right, depth + 1)])
    else:
        line = f"{pad}Union(all=[true], fields=[{fields}])"
        return "\n".join([line, *(explain(i, depth + 1) for i in node.inputs)])
    return f"{line}\n{explain(node.input, depth + 1)}"


def _selected(projections: tuple[tuple[str, Compiled], ...]) -> str:
    return ", ".join(name if c.sql.strip('"`') == name else f"{c.sql} AS {name}"
                     for name, c in projections)
