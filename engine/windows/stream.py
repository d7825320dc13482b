"""``key_by(...).window(...)``: the windowed stream and its aggregations.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> clicks = env.from_collection([{"user": "a", "ts": 1_000}, {"user": "a", "ts": 1_500},
    ...                               {"user": "b", "ts": 2_500}])
    >>> per_second = clicks.key_by("user").window(rs.TumblingEventTimeWindows(size_ms=1000),
    ...                                           timestamp="ts").count()
    >>> sink = per_second.collect()
    >>> sorted(env.execute("count").table(sink).to_pylist(), key=str)  # doctest: +SKIP
    [{'user': 'a', 'window_start': 1000, 'window_end': 2000, 'count': 2},
     {'user': 'b', 'window_start': 2000, 'window_end': 3000, 'count': 1}]

Every result row has the key column(s) (``key`` for a key function; none for
``window_all``), ``window_start``, ``window_end`` (ms, end exclusive) and the
aggregates. A result's event time is ``window_end - 1`` (Flink's): a
``window(...)`` on a window's results without ``timestamp=`` uses it
(:data:`~raystream.engine.windows.operator.WINDOW_TIME`, ``rs.WINDOW_TIME``),
so windowed stages chain:

    >>> per_minute = per_second.key_by("user").window(
    ...     rs.TumblingEventTimeWindows(size_ms=60_000)).sum("count")
    >>> everyone = per_second.window_all(rs.TumblingEventTimeWindows(size_ms=60_000)).sum("count")
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from raystream.checkpoint.state import AggregateFunction
from raystream.actors.partitioners import PartitionSpec
from raystream.engine.columns import require
from raystream.engine.graph import InputEdge
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.assigners import (DynamicEventTimeSessionWindows, GlobalWindows,
                                                WindowAssigner)
from raystream.engine.windows.count import CountWindowOperator
from raystream.engine.windows.functions import (BuiltinAggregates, ProcessWindow,
                                                ProcessWindowFunction, UserAggregate,
                                                WindowFunction)
from raystream.engine.windows.operator import WINDOW_TIME, WindowOperator
from raystream.engine.windows.pre_aggregate import WindowPreAggregator
from raystream.engine.windows.triggers import Trigger, default_trigger

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream, KeyedStream

ALL_KEY = "__window_all"  # the constant key column window_all adds (never in its results)


def with_all_key(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with the constant key column of ``window_all``."""
    return batch.append_column(ALL_KEY, pa.array(np.zeros(batch.num_rows, dtype=np.int64)))


class _Shorthands(ABC):
    """``count``/``sum``/``min``/``max``/``mean`` as one-aggregate calls of ``agg``, written
    once for the time and the count windowed streams."""

    @abstractmethod
    def agg(self, *, name: str | None = None, **named: tuple) -> "DataStream":
        """Several built-in aggregates by output name (each window kind builds its operator)."""

    def count(self, *, output: str = "count", name: str | None = None) -> "DataStream":
        """Rows per (key, window)."""
        return self.agg(name=name, **{output: ("count", None)})

    def sum(self, column: str, *, output: str | None = None, name: str | None = None) -> "DataStream":
        return self.agg(name=name, **{output or column: ("sum", column)})

    def min(self, column: str, *, output: str | None = None, name: str | None = None) -> "DataStream":
        return self.agg(name=name, **{output or column: ("min", column)})

    def max(self, column: str, *, output: str | None = None, name: str | None = None) -> "DataStream":
        return self.agg(name=name, **{output or column: ("max", column)})

    def mean(self, column: str, *, output: str | None = None, name: str | None = None) -> "DataStream":
        return self.agg(name=name, **{output or column: ("mean", column)})


class WindowedStream(_Shorthands):
    """A keyed stream cut into windows; finish it with an aggregation or ``process``.

    ``timestamp``: the event-time column (int64 ms or a timestamp type) for
    event-time windows. ``allowed_lateness_ms``: how long after a window fired
    late records still update it (and re-fire it). ``late_output``: a side
    output tag for records too late for every window they belong to (read it
    with ``side_output(tag)`` on the stream the window returns); without one they are dropped and
    counted in the operator's metrics (``late_records_dropped``), as in Flink.
    ``pre_aggregate``: combine per (key, window) before the shuffle where
    possible (built-in aggregates, tumbling, sliding or cumulating event time, column
    keys, no late output, the default trigger). ``trigger``: when a window fires
    (:mod:`raystream.engine.windows.triggers`; by default once the watermark, or for
    processing-time windows the clock, passes its end; global windows need one).

    ``timestamp`` defaults to ``rs.WINDOW_TIME`` (``window_end - 1``) when the
    stream holds a window's results. For ``window_all`` (``all_windows``) the
    window operator runs at parallelism 1 and its results have no key column.
    """

    def __init__(self, keyed: "KeyedStream", assigner: WindowAssigner, *, timestamp: str | None,
                 allowed_lateness_ms: int, late_output: str | None, pre_aggregate: bool,
                 all_windows: bool = False, trigger: Trigger | None = None) -> None:
        if trigger is not None and not isinstance(trigger, Trigger):
            raise TypeError(f"window(trigger=...) takes a trigger (rs.CountTrigger(count=10), "
                            f"rs.ContinuousEventTimeTrigger(interval_ms=1000), ...), got "
                            f"{trigger!r}")
        default = default_trigger(assigner)
        if assigner.merging and trigger is not None and trigger != default:
            raise ValueError(f"window(trigger={trigger}): session windows keep their default "
                             f"trigger ({default})")
        self.trigger = trigger
        # a trigger of its own, or a global window: no pre-aggregation (a trigger counts
        # and times records, not partials)
        self.triggered = isinstance(assigner, GlobalWindows) or (trigger or default) != default
        self.keyed = keyed
        self.assigner = assigner
        self.timestamp = timestamp
        self.allowed_lateness_ms = allowed_lateness_ms
        self.late_output = late_output
        self.pre_aggregate = pre_aggregate
        self.all_windows = all_windows

    # -- built-in aggregates (vectorized): count/sum/min/max/mean come from _Shorthands
    def max_by(self, value: str, by: str, *, output: str | None = None,
               name: str | None = None) -> "DataStream":
        """``value`` of the row with the largest ``by`` per (key, window) (Flink/Spark
        ``max_by``), vectorized and pre-aggregated. Rows where either column is null are
        skipped (no such row: null); ties on ``by`` go to the smallest ``value``, so the
        result does not depend on the order records arrive in.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> bids = env.from_collection([{"item": 1, "ts": 5, "bidder": 7, "price": 3.0}])
            >>> winners = bids.key_by("item").window(rs.TumblingEventTimeWindows(size_ms=1000),
            ...                                      timestamp="ts").max_by("bidder", "price")
        """
        return self.agg(name=name, **{output or value: ("max_by", (value, by))})

    def top_k(self, column: str, k: int, *, output: str | None = None,
              name: str | None = None) -> "DataStream":
        """The ``k`` largest non-null values of ``column`` per (key, window), largest
        first, as a list column (shorter when the window has fewer values; equal values
        count as often as they occur). Vectorized and pre-aggregated.

            >>> import raystream as rs
            >>> env = rs.StreamEnvironment(parallelism=1)
            >>> bids = env.from_collection([{"item": 1, "ts": 5, "price": 3.0}])
            >>> best3 = bids.window_all(rs.TumblingEventTimeWindows(size_ms=1000),
            ...                         timestamp="ts").top_k("price", 3)
        """
        return self.agg(name=name, **{output or column: ("top_k", (column, k))})

    def agg(self, *, name: str | None = None, **named: tuple[str, Any]) -> "DataStream":
        """Several built-in aggregates at once: ``agg(clicks=("count", None),
        dwell=("sum", "dwell_ms"), longest=("max", "dwell_ms"))``; also
        ``("max_by", (value, by))`` and ``("top_k", (column, k))``."""
        spec = AggregateSpec.of(named)
        return self._window(BuiltinAggregates(spec), name, spec=spec)

    # -- user functions --------------------------------------------------------------------
    def aggregate(self, fn: AggregateFunction, *, output: str = "result", name: str | None = None,
                  schema: pa.Schema | None = None) -> "DataStream":
        """A user ``AggregateFunction`` (``create_accumulator``/``add``/``merge``/
        ``get_result``): a dict result becomes columns, any other value column ``output``."""
        return self._window(UserAggregate(fn, output), name, schema=schema)

    def process(self, fn: ProcessWindowFunction, *, name: str | None = None,
                schema: pa.Schema | None = None) -> "DataStream":
        """Call ``fn.process(key, window, rows: pyarrow.Table)`` once per fired window."""
        return self._window(ProcessWindow(fn), name, schema=schema)

    # -- building ----------------------------------------------------------------------------
    def _window(self, function: WindowFunction, name: str | None, *,
                spec: AggregateSpec | None = None, schema: pa.Schema | None = None) -> "DataStream":
        keyed, assigner = self.keyed, self.assigner
        keys = keyed.keys
        options: dict[str, Any] = dict(
            timestamp=self.timestamp, allowed_lateness_ms=self.allowed_lateness_ms,
            late_output=self.late_output, schema=schema, emit_keys=not self.all_windows,
            trigger=self.trigger)
        name = name or ("window_all" if self.all_windows else "window")
        parallelism = 1 if self.all_windows else None
        timestamp, columns = self.timestamp, keys.columns
        self._check_columns(spec)
        emitted_keys = [] if self.all_windows else list(columns or ["key"])
        if spec is not None:
            spec.check_outputs([*emitted_keys, "window_start", "window_end"],
                               where=f"{name} aggregates")
        if (spec is not None and self.pre_aggregate and assigner.event_time
                and not assigner.merging and not self.triggered and self.late_output is None and columns
                and timestamp is not None):  # (without one the window operator raises)
            upstream = keyed.plain()
            pre = upstream._add(
                "operator", f"{name}-pre-aggregate",
                lambda n: WindowPreAggregator(n, list(columns), assigner,
                                              timestamp=timestamp, spec=spec),
                parallelism=keyed.transformation.parallelism)
            result = pre._add(
                "operator", name,
                lambda n: WindowOperator(n, keys, assigner, function=function,
                                         partial_input=True, **options),
                parallelism=parallelism,
                inputs=[InputEdge(pre.transformation.id, PartitionSpec("hash", keys))])
        else:
            gap = assigner.gap if isinstance(assigner, DynamicEventTimeSessionWindows) else ""
            if spec is not None and self.late_output is None and columns and isinstance(gap, str):
                # a gap function may read any column: the rows stay whole for it
                keyed = _pruned(keyed, name, [*columns, *_time_columns(timestamp),
                                              *spec.input_columns, *([gap] if gap else [])])
            result = keyed._add("operator", name,
                                lambda n: WindowOperator(n, keys, assigner, function=function,
                                                         **options),
                                parallelism=parallelism)
        if assigner.event_time:  # results carry event time window_end - 1 (Flink's)
            result.default_timestamp = WINDOW_TIME
        result.transformation.columns = (
            (*emitted_keys, "window_start", "window_end", *(a.output for a in spec.aggregates))
            if spec is not None else None if schema is None else tuple(schema.names))
        return result

    def _check_columns(self, spec: AggregateSpec | None) -> None:
        """The event-time column and the aggregates' columns are the stream's, where its
        columns are known."""
        keyed, stream = self.keyed, self.keyed.transformation.name
        if self.timestamp is not None:
            require(_time_columns(self.timestamp), keyed.columns,
                    call=f"window(timestamp={self.timestamp!r})", stream=stream)
        if spec is not None:
            _require_aggregated(spec, keyed)


@dataclass(frozen=True)
class KeepColumns:
    """A batch's columns among ``names`` (the others are dropped; a missing one is left
    for the window operator to report).

        >>> import pyarrow as pa
        >>> KeepColumns(("k", "ts"))(pa.record_batch({"k": [1], "x": [2], "ts": [3]})).schema.names
        ['k', 'ts']
    """

    names: tuple[str, ...]

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        present = set(batch.schema.names)
        return batch.select([n for n in self.names if n in present])


def _require_aggregated(spec: AggregateSpec, keyed: "KeyedStream") -> None:
    """The columns ``spec``'s aggregates read are ``keyed``'s, where its columns are known."""
    for a in spec.aggregates:
        require([c for c in (a.column, a.by) if c is not None], keyed.columns,
                call=f"agg({a.output}=({a.kind!r}, {a.column!r}))",
                stream=keyed.transformation.name)


def _time_columns(timestamp: str | None) -> list[str]:
    """The columns an event-time column name reads (``WINDOW_TIME`` reads ``window_end``)."""
    if timestamp is None:
        return []
    return ["window_end"] if timestamp == WINDOW_TIME else [timestamp]


def _pruned(keyed: "KeyedStream", name: str, needed: list[str]) -> "KeyedStream":
    """``keyed`` with only the ``needed`` columns, dropped before the shuffle (chained
    with the upstream operator): a window of built-in aggregates without a late side
    output reads nothing else, so the other columns need not cross the network."""
    names = tuple(dict.fromkeys(needed))
    upstream = keyed.plain()
    pruned = upstream.map_batches(KeepColumns(names), name=f"{name}-columns",
                                  parallelism=keyed.transformation.parallelism)
    return pruned.key_by(keyed.keys)


class CountWindowedStream(_Shorthands):
    """``key_by(k).count_window(size, slide=None)``: per key, a window every ``size``
    records (tumbling) or every ``slide`` records over the last ``size`` (sliding);
    finish it with built-in aggregates (see :mod:`raystream.engine.windows.count`).
    Results have the key column(s) and the aggregates."""

    def __init__(self, keyed: "KeyedStream", size: int, slide: int | None) -> None:
        if int(size) <= 0 or (slide is not None and int(slide) <= 0):
            raise ValueError(f"count_window: size and slide must be positive numbers of "
                             f"records, got size={size!r}, slide={slide!r}")
        self.keyed, self.size, self.slide = keyed, size, slide

    def agg(self, *, name: str | None = None, **named: tuple) -> "DataStream":
        """Several built-in aggregates, as :meth:`WindowedStream.agg` (also ``max_by``
        and ``top_k``)."""
        spec = AggregateSpec.of(named)
        keys, size, slide = self.keyed.keys, self.size, self.slide
        spec.check_outputs(keys.columns or ["key"], where=f"{name or 'count_window'} aggregates")
        _require_aggregated(spec, self.keyed)
        return self.keyed._add("operator", name or "count_window",
                               lambda n: CountWindowOperator(n, keys, size=size, slide=slide,
                                                             spec=spec),
                               columns=(*(keys.columns or ["key"]),
                                        *(a.output for a in spec.aggregates)))
