"""``left.key_by(k).interval_join(right.key_by(k), timestamp=...)``: the interval join's
steps of the job API (:class:`IntervalJoin`, then :class:`IntervalJoined` with its
bounds), apart from :mod:`raystream.engine.datastream` so that module stays one page.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=1)
    >>> a = env.from_collection([{"k": 1, "ts": 10, "x": 1}]).key_by("k")
    >>> b = env.from_collection([{"k": 1, "ts": 12, "y": 2}]).key_by("k")
    >>> a.interval_join(b, timestamp="ts").between(0, 5).bounds.upper_ms
    5
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from raystream.engine.operators.interval_join import (IntervalBounds, IntervalJoinOperator,
                                                      IntervalJoinSpec, ProcessJoinFunction)

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream, KeyedStream


class IntervalJoin:
    """``left.interval_join(right)`` waiting for its interval: call :meth:`between`."""

    def __init__(self, left: "KeyedStream", right: "KeyedStream", timestamps: tuple[str, str]) -> None:
        self.left, self.right, self.timestamps = left, right, timestamps

    def between(self, lower_ms: int, upper_ms: int, *, lower_inclusive: bool = True,
                upper_inclusive: bool = True) -> "IntervalJoined":
        """Right rows join a left row at ``ts`` when their timestamp lies in
        ``[ts + lower_ms, ts + upper_ms]`` (an end excluded when its flag is False)."""
        bounds = IntervalBounds(lower_ms, upper_ms, lower_inclusive, upper_inclusive)
        return IntervalJoined(self, bounds)


class IntervalJoined:
    """An interval join with its bounds: emit pairs with :meth:`join` (vectorized) or
    run a :class:`~raystream.ProcessJoinFunction` on them with :meth:`process`."""

    def __init__(self, join: IntervalJoin, bounds: IntervalBounds) -> None:
        self._join = join
        self.bounds = bounds

    def _add(self, default_name: str, fn: ProcessJoinFunction | None, right_suffix: str,
             name: str | None, schema: pa.Schema | None, parallelism: int | None,
             watermark_delay_ms: int = 0) -> "DataStream":
        join = self._join
        spec = IntervalJoinSpec(self.bounds, (join.left.keys, join.right.keys), join.timestamps,
                                right_suffix, watermark_delay_ms)
        inputs = [join.left._edge(0), join.right._edge(1)]
        return join.left._add("operator", default_name,
                              lambda n: IntervalJoinOperator(n, spec, fn, schema=schema),
                              name=name, parallelism=parallelism, inputs=inputs)

    def join(self, *, right_suffix: str = "_right", name: str | None = None,
             parallelism: int | None = None, watermark_delay_ms: int = 0) -> "DataStream":
        """Every joined pair as one row: the left columns, then the right columns, a right
        column named like a left one (the key, the timestamp, ...) suffixed with
        ``right_suffix``. Vectorized: no Python per record. ``watermark_delay_ms``: how
        far the output's watermark stays behind the inputs' (the interval's width keeps
        both timestamps of every pair on time downstream, as Flink SQL's interval join)."""
        if not right_suffix:
            raise ValueError("interval join: right_suffix must not be empty")
        if watermark_delay_ms < 0:
            raise ValueError(f"interval join: watermark_delay_ms is >= 0, got {watermark_delay_ms}")
        return self._add("interval_join", None, right_suffix, name, None, parallelism,
                         watermark_delay_ms)

    def process(self, fn: ProcessJoinFunction, *, name: str | None = None,
                schema: pa.Schema | None = None, parallelism: int | None = None) -> "DataStream":
        """Call ``fn.process_element(left, right, ctx)`` on every joined pair (dict rows)
        and emit what it returns or yields."""
        if not isinstance(fn, ProcessJoinFunction):
            raise TypeError(f"interval_join(...).process needs a rs.ProcessJoinFunction, "
                            f"got {type(fn).__name__}")
        return self._add("interval_join", fn, "_right", name, schema, parallelism)
