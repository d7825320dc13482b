"""Interval join of two keyed streams (Flink's ``IntervalJoinOperator``).

``left.key_by(k).interval_join(right.key_by(k), timestamp="ts").between(lower, upper)``
pairs every left row ``l`` with every right row ``r`` of the same key where
``l.ts + lower <= r.ts <= l.ts + upper`` (each bound optionally exclusive).

How it runs (vectorized; no Python per record on the built-in path):

* Each side's rows are buffered as Arrow tables, with their timestamps and the
  timer service's key ids as numpy arrays beside them, in segments of up to
  ``SEGMENT_ROWS`` rows in arrival order (the newest merged while of similar size).
* A new batch is joined against the *other* side's buffer: each segment is
  sorted by (key id, ts) once (when first probed), each batch row finds
  the range of its matches in it with two ``searchsorted`` calls, and the pairs are
  expanded with ``repeat``/``arange``: only real pairs are materialized. The
  output is the ``take`` of both sides' rows. No step re-sorts or copies the
  whole buffer, so a batch costs the same however much the buffer holds (when
  one input lags in event time the other's buffer holds everything since).
* Rows late for the watermark (``ts < watermark``, Flink's ``isLate``) are
  dropped and counted (``late_records_dropped`` in the operator's metrics).
* A watermark ``W`` drops the buffered rows no on-time row can still match:
  left rows with ``ts + upper < W``, right rows with ``ts - lower < W`` (whole
  segments, and the rows of the one or two that straddle the limit).
* Buffers are keyed state: snapshotted per key group (part ``"join"``, one
  Arrow IPC stream per side), so they survive failover and rescaling.
* On the disk state backend the buffers live in the instance's RocksDB instead
  (:mod:`raystream.engine.operators.disk_join`), carried by that backend's snapshots;
  the results are the same.

The default output (``.join()``) has the left columns, then the right columns;
a right column whose name is also a left column's (the key, the timestamp...)
gets ``right_suffix`` (default ``"_right"``). With ``.process(fn)`` a
:class:`ProcessJoinFunction` gets every pair as two dict rows.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> clicks = env.from_collection([{"user": 1, "ts": 100}])
    >>> views = env.from_collection([{"user": 1, "ts": 90, "page": "home"}])
    >>> pairs = clicks.key_by("user").interval_join(views.key_by("user"), timestamp="ts") \\
    ...     .between(-20, 0).join()     # columns: user, ts, user_right, ts_right, page
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from raystream.actors.messages import MAX_WATERMARK, MIN_WATERMARK
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.batches import capture_row, rows_to_batch
from raystream.engine.keys import KeySelector
from raystream.engine.operators import disk_join
from raystream.engine.operators.disk_join import MIN_BUCKET_MS, DiskJoinRows
from raystream.engine.operators.functions import close_function, emit_rows
from raystream.engine.operators.interval_index import SortedRows
from raystream.engine.operators.keyed_rows import (BufferedJoinOperator, JoinSide, RowBuffer,
                                                   joined_names)
from raystream.engine.operators.keyed_rows import KeyedRows as _Rows
from raystream.engine.watermarks import MAX_SPAN_MS, timestamps_ms
from raystream.timers.disk_service import DiskTimerService

@dataclass(frozen=True)
class IntervalBounds:
    """Right rows join a left row at ``ts`` when their timestamp is within
    ``[ts + lower_ms, ts + upper_ms]`` (ends exclusive when asked), in ms.

        >>> IntervalBounds(-5, 10, upper_inclusive=False).relative_to(JoinSide.RIGHT)
        (-9, 5)
    """

    lower_ms: int
    upper_ms: int
    lower_inclusive: bool = True
    upper_inclusive: bool = True

    def __post_init__(self) -> None:
        for name in ("lower_ms", "upper_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"interval join: {name} is an int of milliseconds, "
                                f"got {value!r}")
            if abs(int(value)) > MAX_SPAN_MS:  # a row's time plus it stays within int64
                raise ValueError(f"interval join: {name} is at most 2^60 ms either way, "
                                 f"got {value!r}")
        if self.lower > self.upper:
            raise ValueError(f"interval join: the interval [{self.lower_ms}, {self.upper_ms}] "
                             f"(lower_inclusive={self.lower_inclusive}, upper_inclusive="
                             f"{self.upper_inclusive}) is empty")

    @property
    def lower(self) -> int:
        """The smallest offset that joins (inclusive)."""
        return int(self.lower_ms) + (0 if self.lower_inclusive else 1)

    @property
    def upper(self) -> int:
        """The largest offset that joins (inclusive)."""
        return int(self.upper_ms) - (0 if self.upper_inclusive else 1)

    def relative_to(self, side: JoinSide) -> tuple[int, int]:
        """Offsets from a row of ``side`` to the other side's rows it joins (inclusive)."""
        return (self.lower, self.upper) if side is JoinSide.LEFT else (-self.upper, -self.lower)

    def first_joinable(self, side: JoinSide, watermark: int) -> int:
        """The smallest timestamp of a row of ``side`` that an on-time row (``ts >=
        watermark``) of the other side can still join."""
        return watermark - self.relative_to(side)[1]


@dataclass(frozen=True)
class IntervalJoinSpec:
    """What an interval join operator needs: bounds, key selector and timestamp column
    per side, the suffix of clashing right column names in the default output, and how
    far its output watermark stays behind its input's (``watermark_delay_ms``: a pair
    is emitted up to an interval after its earlier row's time, so with the interval's
    width held back neither side's timestamp in the output is late: Flink SQL's
    ``KeyedCoProcessOperatorWithWatermarkDelay``)."""

    bounds: IntervalBounds
    keys: tuple[KeySelector, KeySelector]
    timestamps: tuple[str, str]
    right_suffix: str = "_right"
    watermark_delay_ms: int = 0


class ProcessJoinFunction:
    """Called once per joined pair: override ``process_element(left, right, ctx)``
    (dict rows; return or yield the rows to emit). ``ctx`` is a :class:`JoinContext`.

        >>> class Gap(ProcessJoinFunction):
        ...     def process_element(self, left, right, ctx):
        ...         yield {"user": ctx.current_key, "gap": ctx.right_timestamp - ctx.left_timestamp}
        >>> list(Gap().process_element({}, {}, JoinContext.of(1, 100, 130)))
        [{'user': 1, 'gap': 30}]
    """

    def open(self, ctx: "JoinContext") -> None:
        """Called once per subtask before the first pair."""

    def process_element(self, left: dict, right: dict,
                        ctx: "JoinContext") -> Iterable[dict] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement process_element")

    def close(self) -> None:
        pass


class JoinContext:
    """What a :class:`ProcessJoinFunction` sees for the current pair."""

    def __init__(self, subtask_index: int = 0) -> None:
        self.subtask_index = subtask_index
        self.current_key: Any = None
        self.left_timestamp = 0
        self.right_timestamp = 0
        self.side_rows: dict[str, list[dict]] = {}

    @classmethod
    def of(cls, key: Any, left_timestamp: int, right_timestamp: int) -> "JoinContext":
        """A context for calling a function by hand (tests, docs)."""
        ctx = cls()
        ctx.current_key, ctx.left_timestamp, ctx.right_timestamp = key, left_timestamp, right_timestamp
        return ctx

    @property
    def timestamp(self) -> int:
        """The pair's timestamp: the larger of the two (Flink's)."""
        return max(self.left_timestamp, self.right_timestamp)

    def output(self, tag: str, row: dict) -> None:
        """Emit ``row`` on side output ``tag`` (read it with ``stream.side_output(tag)``)."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"a side output tag is a non-empty string, got {tag!r}")
        self.side_rows.setdefault(tag, []).append(capture_row(row))


# A buffer is kept as segments of at most this many rows, each sorted by (key, ts) once:
# a batch probes every segment and a watermark drops whole expired segments, so the work
# per batch does not grow with what the buffer holds (an input that lags in event time
# makes the other side's buffer hold millions of rows).
SEGMENT_ROWS = 1 << 16


@dataclass(frozen=True, eq=False)
class _Segment:
    """Buffered rows appended together, with their time range; sorted when first probed."""

    rows: _Rows
    min_ts: int
    max_ts: int

    @classmethod
    def of(cls, rows: _Rows) -> "_Segment":
        return cls(rows, int(rows.ts.min()), int(rows.ts.max()))

    @functools.cached_property
    def index(self) -> "SortedRows":
        return SortedRows.of(self.rows)

    def __len__(self) -> int:
        return len(self.rows.ts)


class _Buffer(RowBuffer):
    """One side's buffered rows as segments in arrival order (so roughly in time order).

    Appending adds a segment and merges the newest ones while they are of similar size
    and fit in ``segment_rows`` (a binary counter: a row is copied and sorted
    O(log(segment_rows / batch)) times, and a probe visits O(log) small segments plus
    one per ``segment_rows`` held)."""

    def __init__(self, segment_rows: int = SEGMENT_ROWS) -> None:
        self.segments: list[_Segment] = []
        self.segment_rows = segment_rows

    @property
    def chunks(self) -> list[_Rows]:  # type: ignore[override]  # what snapshots and metrics read
        return [s.rows for s in self.segments]

    @property
    def min_ts(self) -> int | None:  # type: ignore[override]
        return min((s.min_ts for s in self.segments), default=None)

    def append(self, rows: _Rows) -> None:
        segments = self.segments
        segments.append(_Segment.of(rows))
        while (len(segments) >= 2 and len(segments[-2]) <= 2 * len(segments[-1])
               and len(segments[-2]) + len(segments[-1]) <= self.segment_rows):
            last = segments.pop()
            segments[-1] = _Segment.of(_Rows.concat([segments[-1].rows, last.rows]))

    def combined(self) -> _Rows | None:
        return _Rows.concat(self.chunks) if self.segments else None

    def drop_before(self, ts: int) -> None:
        """Drop the rows whose time is below ``ts``: whole segments, and only the rows
        of a segment that straddles it."""
        kept = []
        for segment in self.segments:
            if segment.min_ts >= ts:
                kept.append(segment)
            elif segment.max_ts >= ts:  # so ts fits in int64 here
                rows = segment.rows
                kept.append(_Segment.of(rows.take(np.flatnonzero(rows.ts >= ts))))
        self.segments = kept

    def keep_rows(self, mask: np.ndarray) -> None:
        raise NotImplementedError("an interval join buffer drops rows by time: drop_before")

    def matches(self, kid: np.ndarray, ts: np.ndarray,
                offsets: tuple[int, int]) -> tuple[np.ndarray, _Rows | None]:
        """Pairs of a probe row and a buffered row with equal key ids and ``ts +
        offsets[0] <= buffered ts <= ts + offsets[1]``: the probe rows' positions, and
        the buffered rows they pair with (None when there is no pair)."""
        low, high = int(ts.min()) + offsets[0], int(ts.max()) + offsets[1]
        probes, found = [], []
        for segment in self.segments:
            if segment.max_ts < low or segment.min_ts > high:
                continue
            probe, buffered = segment.index.matches(kid, ts, offsets)
            if len(probe):
                probes.append(probe)
                found.append(segment.rows.take(buffered))
        if not probes:
            return np.empty(0, np.int64), None
        return np.concatenate(probes), _Rows.concat(found)


class IntervalJoinOperator(BufferedJoinOperator):
    """The two-input keyed operator behind ``interval_join(...).between(...)``.

    ``fn`` None: emit joined rows as Arrow batches (left columns, then right
    columns; a clashing right name gets ``spec.right_suffix``). Otherwise call
    ``fn.process_element(left, right, ctx)`` per pair.
    """

    buffer_type = _Buffer
    buffers: tuple[_Buffer, _Buffer]
    supports_disk_state = True  # the buffers in RocksDB (DiskJoinRows)
    disk_only_kinds = (disk_join.KIND, disk_join.SCHEMA_KIND)  # rows and their formats
    label = "interval join"
    disk_rows: DiskJoinRows | None

    def __init__(self, name: str, spec: IntervalJoinSpec, fn: ProcessJoinFunction | None = None,
                 *, schema: pa.Schema | None = None) -> None:
        super().__init__(name, spec.keys[0])
        if fn is not None and not callable(getattr(fn, "process_element", None)):
            raise TypeError(f"operator '{name}': interval_join(...).process needs a "
                            f"rs.ProcessJoinFunction, got {type(fn).__name__}")
        self.spec = spec
        self.fn = fn
        self.schema = schema

    # -- lifecycle -----------------------------------------------------------------
    def disk_rows_over(self, backend: DiskKeyedStateBackend, timers: DiskTimerService
                       ) -> DiskJoinRows:
        bounds = self.spec.bounds
        return DiskJoinRows(backend, timers, self._stored_timestamps,
                            bucket_ms=max(MIN_BUCKET_MS, bounds.upper - bounds.lower + 1))

    def _stored_timestamps(self, side: JoinSide, table: pa.Table) -> np.ndarray:
        (batch,) = table.combine_chunks().to_batches()
        return timestamps_ms(batch, self.spec.timestamps[side],
                             where=f"interval join '{self.name}' (restored rows)")

    def open(self) -> None:
        self.join_ctx = JoinContext(self.ctx.subtask_index)
        if self.fn is not None:
            self.fn.open(self.join_ctx)

    def close(self) -> None:
        if self.fn is not None:
            close_function(self.fn)

    # -- records ---------------------------------------------------------------------
    def _index(self, batch: pa.RecordBatch, side: JoinSide) -> _Rows:
        """The batch with its timestamps and key ids (Python once per distinct key)."""
        ts = timestamps_ms(batch, self.spec.timestamps[side],
                           where=f"interval join '{self.name}' ({side.name.lower()} input)")
        distinct = self.spec.keys[side].distinct_keys(batch, self.ctx.max_parallelism)
        ids = self.timers.key_ids(distinct.keys, distinct.groups)
        return _Rows(pa.Table.from_batches([batch]), ts, ids[distinct.inverse])

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        self.release_key_ids()  # a safe point: between batches (a watermark makes no ids)
        side = JoinSide(input_index)
        rows = self._index(batch, side)
        late = rows.ts < self.watermarks_of_key_ids(rows.kid)
        if late.any():
            self.late_dropped[side] += int(late.sum())
            if late.all():
                return
            rows = rows.take(np.flatnonzero(~late))
        offsets = self.spec.bounds.relative_to(side)
        disk = self.disk_rows
        if disk is None:
            probe, matched = self.buffers[side.other].matches(rows.kid, rows.ts, offsets)
            self.buffers[side].append(rows)
        else:
            probe, matched = disk.matches(side.other, rows.kid, rows.ts, offsets)
            disk.append(side, rows)
        if matched is not None:
            pair = (rows.take(probe), matched)
            left, right = pair if side is JoinSide.LEFT else pair[::-1]
            self._emit_pairs(left, right)

    def _emit_pairs(self, left: _Rows, right: _Rows) -> None:
        if self.fn is None:
            for batch in self._joined(left.table, right.table).to_batches():
                self.output.emit(batch)
            return
        ctx, process, out = self.join_ctx, self.fn.process_element, []
        keys = self.timers.keys(left.kid)
        for l_row, r_row, l_ts, r_ts, key in zip(left.table.to_pylist(), right.table.to_pylist(),
                                                 left.ts.tolist(), right.ts.tolist(), keys):
            ctx.current_key, ctx.left_timestamp, ctx.right_timestamp = key, l_ts, r_ts
            try:
                produced = process(l_row, r_row, ctx)
            except Exception as exc:
                exc.add_note(f"pair: left {l_row!r}, right {r_row!r}")
                raise
            if produced is not None:
                out.extend(map(capture_row, produced))
        emit_rows(self, out, self.schema)
        side, ctx.side_rows = ctx.side_rows, {}
        for tag, tagged in side.items():
            self.emit_side(tag, rows_to_batch(
                tagged, schema=None, where=f"side output {tag!r} of operator '{self.name}'"))

    def _joined(self, left: pa.Table, right: pa.Table) -> pa.Table:
        names = joined_names(left.column_names, right.column_names, self.spec.right_suffix,
                             where=f"operator '{self.name}'")
        return pa.Table.from_arrays([*left.columns, *right.columns], names=names).combine_chunks()

    # -- time ------------------------------------------------------------------------
    def process_watermark(self, watermark: int) -> None:
        self.advance_watermark(watermark)
        # the operator's own watermark (not a restored floor, which may be further):
        # cleaning by the smaller one keeps rows longer, never drops a match
        current = self.current_watermark
        for side in JoinSide:
            first = self.spec.bounds.first_joinable(side, current)
            if self.disk_rows is None:
                self.buffers[side].drop_before(first)
            else:
                self.disk_rows.drop_before(side, first)
        delay = self.spec.watermark_delay_ms
        self.output.emit_watermark(watermark if watermark in (MAX_WATERMARK, MIN_WATERMARK)
                                   else max(watermark - delay, MIN_WATERMARK))

    # -- state -----------------------------------------------------------------------
    def restore_side(self, side: JoinSide, table: pa.Table) -> None:
        disk = self._disk_rows()  # a heap snapshot restored on disk: its rows move in
        for batch in table.to_batches():
            rows = self._index(batch, side)
            if disk is None:
                self.buffers[side].append(rows)
            else:
                disk.append(side, rows)
