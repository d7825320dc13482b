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
from raystream.engine.sql.schema import RelSchema


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
    """A window table function's windows over the rowtime column ``time``."""

    kind: WindowKind
    time: str
    size_ms: int | None = None
    slide_ms: int | None = None
    gap_ms: int | None = None
    offset_ms: int = 0

    def describe(self) -> str:
        sizes = {WindowKind.TUMBLE: f"size={self.size_ms} ms",
                 WindowKind.HOP: f"slide={self.slide_ms} ms, size={self.size_ms} ms",
                 WindowKind.SESSION: f"gap={self.gap_ms} ms"}.get(self.kind, "")
        return f"{self.kind.value}({self.time}, {sizes})"


@dataclass(frozen=True)
class WindowAggregate:
    """Per ``keys`` (columns of ``input``) and window, ``aggregates``; the rows are the
    keys, ``window_start``, ``window_end``, ``window_time`` (``window_end`` - 1 ms, the
    rowtime) and the aggregates, in ``schema``."""

    input: Node
    window: WindowSpec
    keys: tuple[str, ...]
    aggregates: tuple[AggregateCall, ...]
    schema: RelSchema


@dataclass(frozen=True)
class Union:
    """UNION ALL: every row of every input."""

    inputs: tuple[Node, ...]
    schema: RelSchema


Node = Scan | StreamScan | Calc | WindowAggregate | Union


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
        select = ", ".join(name if c.sql.strip('"`') == name else f"{c.sql} AS {name}"
                           for name, c in node.projections)
        where = "" if node.condition is None else f", where=[{node.condition.sql}]"
        line = f"{pad}Calc(select=[{select}]{where})"
    elif isinstance(node, WindowAggregate):
        aggs = ", ".join(f"{a.sql} AS {a.output}" for a in node.aggregates)
        line = (f"{pad}WindowAggregate(groupBy=[{', '.join(node.keys)}], "
                f"window=[{node.window.describe()}], select=[{aggs}])")
    else:
        line = f"{pad}Union(all=[true], fields=[{fields}])"
        return "\n".join([line, *(explain(i, depth + 1) for i in node.inputs)])
    return f"{line}\n{explain(node.input, depth + 1)}"
