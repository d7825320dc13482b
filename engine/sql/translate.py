"""A plan (:mod:`~raystream.engine.sql.plan`) as DataStream operators on an environment.

Consecutive Calcs become one ``map_batches`` (a view's projection and the query's run
as one function over each batch, chained to the operator before them); a window
aggregate becomes the DataStream API's window with built-in aggregates, pre-aggregated
before the shuffle. A join becomes the DataStream API's joins, its inputs' columns
renamed by position first (``__l0``, ``__r3``: no input column can clash with what the
join operator adds) and named as the plan says after:

* a window join: a window join over windows of 1 ms at each row's ``window_end - 1``,
  keyed by the join keys and ``window_start``: a pair meets in the window of its own
  window's end, which fires when the watermark passes that end, as Flink's does;
* an interval join: the interval join on the inputs' rowtimes;
* a regular join: the interval join with every row at one time, ``REGULAR_TIME``, and
  the interval [0, 0], so every pair of equal keys joins and no watermark while
  there is input reaches that time and clears a row (the end of input does).

A window aggregation over rows that have their windows already (``InputWindows``)
is a window of 1 ms at ``window_end - 1`` too, keyed by the group keys and
``window_start``. Operator names come from the sink's table and the node's place in
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
from raystream.engine.sql.compiled import Compiled, as_array, plain
from raystream.engine.sql.lookup import LookupJoin
from raystream.engine.sql.plan import (Calc, Expand, InputWindows, Join, JoinKind, Node, Scan, Sink,
                                       StreamScan, WindowAggregate, WindowSpec, WindowTopN)
from raystream.engine.sql.topn import RankedRows
from raystream.engine.windows.assigners import (CumulativeEventTimeWindows,
                                                EventTimeSessionWindows, SlidingEventTimeWindows,
                                                TumblingEventTimeWindows,
                                                TumblingProcessingTimeWindows, WindowAssigner)

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.sink_handle import SinkHandle
    from raystream.engine.windows.stream import WindowedStream


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
class Renamed:
    """The batch's columns under ``names``, in order (a join's input by position)."""

    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.rename_columns(list(self.names))


# a regular join's rows' time: above every watermark while there is input (they are
# event times in ms, ~2^40 today), with room below int64's end for the join's sums
REGULAR_TIME = 1 << 62
JOIN_TIME = "__t"


@dataclass(frozen=True)
class JoinTime:
    """The join time column ``__t``: ``end - 1`` of the column ``end`` (the row's window's
    last ms), or ``REGULAR_TIME`` with ``end`` None."""

    end: str | None

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.end is None:
            column = pa.repeat(pa.scalar(REGULAR_TIME, pa.int64()), batch.num_rows)
        else:
            end = batch.column(self.end)
            column = pc.subtract(end.cast(pa.int64()) if pa.types.is_timestamp(end.type)  # pyright: ignore[reportAttributeAccessIssue]
                                 else end, 1)
        return batch.append_column(JOIN_TIME, column)


@dataclass(frozen=True)
class Selected:
    """The columns ``sources`` of the batch, named ``names``."""

    sources: tuple[str, ...]
    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch.column(s) for s in self.sources],
                                          names=list(self.names))


@dataclass(frozen=True)
class Expanded:
    """The batch once per copy of ``copies`` (each a projection to ``schema``'s columns),
    one batch: a distinct count's Expand."""

    copies: tuple[tuple[tuple[str, Compiled], ...], ...]
    schema: pa.Schema

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        return pa.concat_batches([pa.RecordBatch.from_arrays(
            [_as(plain(as_array(c.evaluate(batch), n)), f.type)
             for (_, c), f in zip(copy, self.schema)], schema=self.schema)
            for copy in self.copies])


def _as(column: pa.Array | pa.ChunkedArray, type_: pa.DataType) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column if column.type == type_ else column.cast(type_)


Step = CalcStep | Renamed | JoinTime | Expanded


@dataclass(frozen=True)
class CalcChain:
    steps: tuple[Step, ...]

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
    start: str = "window_start"  # (the input's own column, for InputWindows)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        columns = []
        for name, type_ in zip(self.names, self.types):
            if name == "window_time":
                column = pc.subtract(batch.column("window_end"), 1)  # pyright: ignore[reportAttributeAccessIssue]
            elif name == "window_start":
                column = batch.column(self.start)
            elif name in self.keys:
                column = pc.if_else(batch.column(null_flag(name)),  # pyright: ignore[reportAttributeAccessIssue]
                                    pa.scalar(None, batch.column(name).type), batch.column(name))
            else:
                column = batch.column(name)
            columns.append(column if column.type == type_ else pc.cast(column, type_, safe=False))  # pyright: ignore[reportAttributeAccessIssue]
        return pa.RecordBatch.from_arrays(columns, names=list(self.names))


class Translator:
    """Adds a plan's operators to ``env``; ``prefix`` names them (the sink table)."""

    def __init__(self, env: "StreamEnvironment", prefix: str,
                 scans: dict[tuple, "DataStream"] | None = None) -> None:
        self.env, self.prefix = env, prefix
        # a table read twice the same way (q5's bids, or the same view in two INSERTs of
        # one job) is one source feeding both: ``scans`` is the job's, by table and read
        self._scans = {} if scans is None else scans

    def sink(self, sink: Sink) -> "SinkHandle":
        return sink.connector.sink(sink.table, self.stream(sink.input))

    def stream(self, node: Node) -> "DataStream":
        if isinstance(node, Scan):
            key = (node.table, node.spec.description, node.schema)
            if key not in self._scans:
                self._scans[key] = node.spec.build(self.env)
            return self._scans[key]
        if isinstance(node, StreamScan):
            return node.entry.stream
        if isinstance(node, Calc):
            return self._calcs(node, ())
        if isinstance(node, Expand):
            return self._calcs(node.input, (Expanded(node.copies, node.schema.arrow()),))
        if isinstance(node, WindowAggregate):
            return self._window(node)
        if isinstance(node, WindowTopN):
            return self._top_n(node)
        if isinstance(node, Join):
            return self._join(node)
        streams = [self.stream(i) for i in node.inputs]
        return streams[0].union(*streams[1:])

    def _calcs(self, node: Node, after: tuple[Step, ...]) -> "DataStream":
        """``node`` with ``after`` run on its rows: one ``map_batches`` with the Calcs
        it ends in."""
        chain, below = _chain(node, after)
        return self.stream(below).map_batches(chain, name=f"{self.prefix}.calc")

    def _join(self, node: Join) -> "DataStream":
        sides = (node.left, node.right)
        names = [tuple(f"__{p}{i}" for i in range(len(s.schema.fields))) for p, s in zip("lr", sides)]
        position = [dict(zip(s.schema.names, n)) for s, n in zip(sides, names)]
        keys = [[position[i][pair[i]] for pair in node.keys] for i in (0, 1)]
        if node.kind is JoinKind.WINDOW:
            assert node.windows is not None
            times = [JoinTime(position[i][node.windows[i].end]) for i in (0, 1)]
            keys = [[*keys[i], position[i][node.windows[i].start]] for i in (0, 1)]
        else:
            times = [JoinTime(None)] * 2
        if node.kind is JoinKind.LOOKUP:
            return self._lookup(node, names, position, keys)
        left, right = (self._calcs(s, (Renamed(n), t)) for s, n, t in zip(sides, names, times))
        if not keys[0]:  # (no equality: every row of a side has the same key)
            keys = [[JOIN_TIME], [JOIN_TIME]]
        if node.kind is JoinKind.WINDOW:
            joined = left.join(right).where(keys[0]).equal_to(keys[1]).window(
                TumblingEventTimeWindows(size_ms=1), timestamp=JOIN_TIME).join(
                    name=f"{self.prefix}.window-join")
        else:
            interval = node.interval
            stamps = ((position[0][sides[0].schema.rowtime or ""], position[1][sides[1].schema.rowtime or ""])
                      if interval is not None else (JOIN_TIME, JOIN_TIME))
            joined = left.key_by(keys[0]).interval_join(
                right.key_by(keys[1]), left_timestamp=stamps[0], right_timestamp=stamps[1]
            ).between(interval.lower_ms if interval else 0, interval.upper_ms if interval else 0,
                      lower_inclusive=interval.lower_inclusive if interval else True,
                      upper_inclusive=interval.upper_inclusive if interval else True
                      ).join(name=f"{self.prefix}.{node.kind.value}-join",
                             watermark_delay_ms=interval.watermark_delay_ms if interval else 0)
        columns = node.columns()
        return joined.map_batches(Selected(tuple(position[i][c] for i, c, _ in columns),
                                           tuple(name for _, _, name in columns)),
                                  name=f"{self.prefix}.join-output")

    def _lookup(self, node: Join, names: list[tuple[str, ...]], position: list[dict[str, str]],
                keys: list[list[str]]) -> "DataStream":
        """A lookup join: the left input's rows, each batch joined with the right input
        (a bounded table's Calcs over its scan) that every subtask reads whole."""
        shape, below = _chain(node.right, (Renamed(names[1]),))
        assert isinstance(below, Scan) and below.spec.lookup is not None  # (planned so)
        schema = pa.schema([pa.field(n, f.type) for n, f in zip(names[1], node.right.schema.fields)])
        joined = self._calcs(node.left, (Renamed(names[0]),)).map_batches(
            LookupJoin(below.spec.lookup, shape, schema, keys[0], keys[1]),
            name=f"{self.prefix}.lookup-join")
        columns = node.columns()
        return joined.map_batches(Selected(tuple(position[i][c] for i, c, _ in columns),
                                           tuple(name for _, _, name in columns)),
                                  name=f"{self.prefix}.join-output")

    def _windowed(self, node: WindowAggregate | WindowTopN
                  ) -> tuple["WindowedStream", tuple[str, ...]]:
        """``node``'s input in its windows, keyed by its keys (NULL-safe: see
        :class:`NullSafeKeys`), and the keys sent with a NULL flag."""
        stream = self.stream(node.input)
        schema = node.input.schema
        window = node.window
        if isinstance(window, InputWindows):
            stream = stream.map_batches(JoinTime(window.end), name=f"{self.prefix}.windows")
            assigner, time = TumblingEventTimeWindows(size_ms=1), JOIN_TIME
        else:
            assigner, time = _assigner(window), window.time
        nullable = tuple(k for k in node.keys if schema.field(k).nullable)
        dictionary = tuple(k for k in node.keys if pa.types.is_dictionary(schema.field(k).type))
        if node.keys:
            if nullable or dictionary:
                stream = stream.map_batches(NullSafeKeys(nullable, dictionary),
                                            name=f"{self.prefix}.keys")
        keys = [k for key in node.keys
                for k in ((key, null_flag(key)) if key in nullable else (key,))]
        if isinstance(window, InputWindows):
            keys.append(window.start)
        if keys:
            return stream.key_by(keys).window(assigner, timestamp=time), nullable
        return stream.window_all(assigner, timestamp=time), nullable

    def _top_n(self, node: WindowTopN) -> "DataStream":
        windowed, nullable = self._windowed(node)
        ordered = {c for c, _ in node.order}
        ties = tuple(f.name for f in node.input.schema.fields
                     if f.name not in ordered and not pa.types.is_nested(f.type))
        schema = node.schema.arrow()
        return windowed.process(
            RankedRows(node.order, ties, node.limit, node.rank, schema, nullable,
                       windowed=isinstance(node.window, WindowSpec)),
            name=f"{self.prefix}.top-n", schema=schema)

    def _window(self, node: WindowAggregate) -> "DataStream":
        window = node.window
        windowed, nullable = self._windowed(node)
        aggregates = {a.output: (a.kind.value, a.column) for a in node.aggregates} or {
            "__rows": ("count", None)}  # (a GROUP BY without aggregates: its groups)
        result = windowed.agg(name=f"{self.prefix}.window", **aggregates)
        fields = node.schema.fields
        start = window.start if isinstance(window, InputWindows) else "window_start"
        return result.map_batches(WindowColumns(tuple(f.name for f in fields),
                                                tuple(f.type for f in fields), nullable, start),
                                  name=f"{self.prefix}.window-output")


def _chain(node: Node, after: tuple[Step, ...]) -> tuple[CalcChain, Node]:
    """The Calcs ``node`` ends in, then ``after``, as one chain; and the node below them."""
    steps: list[Step] = list(after)
    while isinstance(node, Calc):
        steps.insert(0, CalcStep(node.condition, node.projections))
        node = node.input
    return CalcChain(tuple(steps)), node


def _assigner(window: WindowSpec) -> WindowAssigner:
    if window.processing_time:  # (the planner allows TUMBLE only)
        return TumblingProcessingTimeWindows(size_ms=window.size_ms or 0,
                                             offset_ms=window.offset_ms)
    if window.kind is WindowKind.TUMBLE:
        return TumblingEventTimeWindows(size_ms=window.size_ms or 0, offset_ms=window.offset_ms)
    if window.kind is WindowKind.HOP:
        return SlidingEventTimeWindows(size_ms=window.size_ms or 0, slide_ms=window.slide_ms or 0,
                                       offset_ms=window.offset_ms)
    if window.kind is WindowKind.CUMULATE:
        return CumulativeEventTimeWindows(max_size_ms=window.size_ms or 0,
                                          step_ms=window.step_ms or 0, offset_ms=window.offset_ms)
    return EventTimeSessionWindows(gap_ms=window.gap_ms or 0)
