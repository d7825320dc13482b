"""A plan (:mod:`~raystream.engine.sql.plan`) as DataStream operators on an environment.

Consecutive Calcs become one ``map_batches`` (a view's projection and the query's run
as one function over each batch, chained to the operator before them); a window
aggregate becomes the DataStream API's window with built-in aggregates, pre-aggregated
before the shuffle. Operator names come from the sink's table and the node's place in
the plan, so the same statement gives the same names (a savepoint of a SQL job restores
into the same statement run again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc

from raystream.engine.sql.ast import WindowKind
from raystream.engine.sql.compiled import Compiled, as_array
from raystream.engine.sql.plan import (Calc, Node, Scan, Sink, StreamScan, WindowAggregate,
                                       WindowSpec)
from raystream.engine.windows.assigners import (EventTimeSessionWindows, SlidingEventTimeWindows,
                                                TumblingEventTimeWindows)

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.sink_handle import SinkHandle


@dataclass(frozen=True)
class CalcStep:
    """One Calc over a batch: the rows where ``condition`` is TRUE, as ``projections``."""

    condition: Compiled | None
    projections: tuple[tuple[str, Compiled], ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.condition is not None:
            mask = as_array(self.condition.evaluate(batch), batch.num_rows)
            batch = batch.filter(mask)  # (a NULL condition drops the row, as SQL's WHERE)
        n = batch.num_rows
        return pa.RecordBatch.from_arrays(
            [as_array(c.evaluate(batch), n) for _, c in self.projections],
            names=[name for name, _ in self.projections])


@dataclass(frozen=True)
class CalcChain:
    steps: tuple[CalcStep, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        for step in self.steps:
            batch = step(batch)
        return batch


def null_flag(key: str) -> str:
    return f"{key}$null"


def _zero(type_: pa.DataType) -> pa.Scalar:
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return pa.scalar("", type_)
    if pa.types.is_boolean(type_):
        return pa.scalar(False)
    return pa.scalar(0, pa.int64()).cast(type_)


@dataclass(frozen=True)
class NullSafeKeys:
    """SQL groups NULL keys together; the DataStream API's keys are never null. So each
    ``nullable`` key column goes to the shuffle with its NULLs as a zero and a flag column
    beside it (``key$null``), which :class:`WindowColumns` turns back into NULLs; a
    ``dictionary`` key goes decoded."""

    nullable: tuple[str, ...]
    dictionary: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        for key in dict.fromkeys((*self.dictionary, *self.nullable)):
            index = batch.schema.get_field_index(key)
            column = batch.column(index)
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            if key in self.nullable:
                flag = column.is_null()
                if column.null_count:
                    column = pc.fill_null(column, _zero(column.type))  # pyright: ignore[reportAttributeAccessIssue]
                batch = batch.append_column(null_flag(key), flag)
            batch = batch.set_column(index, key, column)
        return batch


@dataclass(frozen=True)
class WindowColumns:
    """A window operator's rows with SQL's window columns: ``window_start`` and
    ``window_end`` as TIMESTAMP(3), ``window_time`` (end - 1 ms), the aggregates cast to
    their SQL types, in the order of ``names``."""

    names: tuple[str, ...]
    types: tuple[pa.DataType, ...]
    keys: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = []
        for name, type_ in zip(self.names, self.types):
            if name == "window_time":
                column = pc.subtract(batch.column("window_end"), 1)  # pyright: ignore[reportAttributeAccessIssue]
            elif name in self.keys:
                column = pc.if_else(batch.column(null_flag(name)),  # pyright: ignore[reportAttributeAccessIssue]
                                    pa.scalar(None, batch.column(name).type), batch.column(name))
            else:
                column = batch.column(name)
            columns.append(column if column.type == type_ else pc.cast(column, type_, safe=False))  # pyright: ignore[reportAttributeAccessIssue]
        return pa.RecordBatch.from_arrays(columns, names=list(self.names))


class Translator:
    """Adds a plan's operators to ``env``; ``prefix`` names them (the sink table)."""

    def __init__(self, env: "StreamEnvironment", prefix: str) -> None:
        self.env, self.prefix = env, prefix

    def sink(self, sink: Sink) -> "SinkHandle":
        return sink.connector.sink(sink.table, self.stream(sink.input))

    def stream(self, node: Node) -> "DataStream":
        if isinstance(node, Scan):
            return node.spec.build(self.env)
        if isinstance(node, StreamScan):
            return node.entry.stream
        if isinstance(node, Calc):
            steps: list[CalcStep] = []
            below: Node = node
            while isinstance(below, Calc):
                steps.insert(0, CalcStep(below.condition, below.projections))
                below = below.input
            return self.stream(below).map_batches(CalcChain(tuple(steps)),
                                                  name=f"{self.prefix}.calc")
        if isinstance(node, WindowAggregate):
            return self._window(node)
        streams = [self.stream(i) for i in node.inputs]
        return streams[0].union(*streams[1:])

    def _window(self, node: WindowAggregate) -> "DataStream":
        stream = self.stream(node.input)
        assigner = _assigner(node.window)
        schema = node.input.schema
        nullable = tuple(k for k in node.keys if schema.field(k).nullable)
        dictionary = tuple(k for k in node.keys if pa.types.is_dictionary(schema.field(k).type))
        if node.keys:
            if nullable or dictionary:
                stream = stream.map_batches(NullSafeKeys(nullable, dictionary),
                                            name=f"{self.prefix}.keys")
            keys = [k for key in node.keys
                    for k in ((key, null_flag(key)) if key in nullable else (key,))]
            windowed = stream.key_by(keys).window(assigner, timestamp=node.window.time)
        else:
            windowed = stream.window_all(assigner, timestamp=node.window.time)
        aggregates = {a.output: (a.kind.value, a.column) for a in node.aggregates}
        result = windowed.agg(name=f"{self.prefix}.window", **aggregates)
        fields = node.schema.fields
        return result.map_batches(WindowColumns(tuple(f.name for f in fields),
                                                tuple(f.type for f in fields), nullable),
                                  name=f"{self.prefix}.window-output")


def _assigner(window: WindowSpec) -> "TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows":
    if window.kind is WindowKind.TUMBLE:
        return TumblingEventTimeWindows(size_ms=window.size_ms or 0, offset_ms=window.offset_ms)
    if window.kind is WindowKind.HOP:
        return SlidingEventTimeWindows(size_ms=window.size_ms or 0, slide_ms=window.slide_ms or 0,
                                       offset_ms=window.offset_ms)
    return EventTimeSessionWindows(gap_ms=window.gap_ms or 0)
