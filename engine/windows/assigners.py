"""Window assigners: which windows ``[start, end)`` a record belongs to (Flink's conventions).

Times are int64 milliseconds since the epoch, within ±2^62 (``EVENT_TIME_LIMIT_MS``);
sizes, slides and gaps are at most ``MAX_SPAN_MS`` (2^60), so starts and ends stay
within int64 (with ``MAX_LATENESS_MS`` of lateness, 2^61, too). A window fires once the
watermark reaches ``end - 1``; a record is late for a window iff
``end - 1 + allowed_lateness <= watermark`` (docs/architecture.md, "Time").
Assignment is vectorized over a batch's timestamps.

    >>> import numpy as np
    >>> rows, starts = TumblingEventTimeWindows(size_ms=10).assign(np.array([3, 12, 19]))
    >>> starts.tolist()
    [0, 10, 10]
    >>> rows, starts = SlidingEventTimeWindows(size_ms=10, slide_ms=5).assign(np.array([7]))
    >>> sorted(starts.tolist())
    [0, 5]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from raystream.engine.errors import BadRecordError
from raystream.engine.watermarks import EVENT_TIME_LIMIT_MS, MAX_SPAN_MS


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not 0 < int(value) <= MAX_SPAN_MS:
            raise ValueError(f"{name} must be a positive number of milliseconds up to 2^60, "
                             f"got {value!r}")


@dataclass(frozen=True)
class TumblingEventTimeWindows:
    """Fixed-size, non-overlapping event-time windows: ``[k*size + offset, (k+1)*size + offset)``."""

    size_ms: int
    offset_ms: int = 0
    event_time = True
    merging = False

    def __post_init__(self) -> None:
        _check_positive(size_ms=self.size_ms)

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row index, window start) per assignment; one window per row."""
        # the offset modulo the size: the same windows, and no overflow for a huge offset
        starts = timestamps - np.mod(timestamps - self.offset_ms % self.size_ms, self.size_ms)
        return np.arange(len(timestamps)), starts

    def end_of(self, starts: np.ndarray) -> np.ndarray:
        return starts + self.size_ms

    @property
    def max_size_ms(self) -> int:
        return self.size_ms


@dataclass(frozen=True)
class SlidingEventTimeWindows:
    """Windows of ``size_ms`` starting every ``slide_ms``: a record is in ``size/slide`` of them."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0
    event_time = True
    merging = False

    def __post_init__(self) -> None:
        _check_positive(size_ms=self.size_ms, slide_ms=self.slide_ms)

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        last = timestamps - np.mod(timestamps - self.offset_ms % self.slide_ms, self.slide_ms)
        per_row = -(-self.size_ms // self.slide_ms)
        starts = last[:, None] - self.slide_ms * np.arange(per_row)[None, :]
        rows = np.broadcast_to(np.arange(len(timestamps))[:, None], starts.shape)
        keep = starts + self.size_ms > timestamps[:, None]
        return rows[keep], starts[keep]

    def end_of(self, starts: np.ndarray) -> np.ndarray:
        return starts + self.size_ms

    @property
    def max_size_ms(self) -> int:
        return self.size_ms

    @property
    def panes(self) -> TumblingEventTimeWindows | None:
        """The slide-long tumbling windows ("panes", Flink SQL's slices) that tile these
        windows when the size is a multiple of the slide: every window is a union of
        panes, and :meth:`assign` of a pane's start gives the windows holding the pane.

            >>> SlidingEventTimeWindows(size_ms=10, slide_ms=5, offset_ms=2).panes
            TumblingEventTimeWindows(size_ms=5, offset_ms=2)
        """
        if self.size_ms % self.slide_ms:
            return None
        return TumblingEventTimeWindows(size_ms=self.slide_ms, offset_ms=self.offset_ms)


@dataclass(frozen=True)
class CumulativeEventTimeWindows:
    """Cumulating windows (Flink SQL's ``CUMULATE``): each cumulation starts every
    ``max_size_ms`` (``k*max_size + offset``) and has the windows ``[start, start +
    step)``, ``[start, start + 2*step)``, ..., ``[start, start + max_size)``; a record
    at ``t`` belongs to every window of its cumulation ending after ``t`` (at most
    ``max_size / step`` of them). ``max_size_ms`` must be a multiple of ``step_ms``.

    A window's identity cannot be its start: the windows of a cumulation share it. Its
    end is unique, so a cumulating window is kept, timed and checkpointed as the
    ``max_size``-long window ending where it ends, ``[end - max_size, end)`` (the
    sliding window of ``max_size`` and slide ``step`` it is the tail of): every window
    store, heap or disk, and the timer service take them as they take sliding windows,
    by that "start" (:meth:`assign` returns it, :meth:`end_of` maps it to the end), and
    only the emitted ``window_start`` (and a user function's ``Window``) is the real
    start, :meth:`start_of`. The alternative, one slice of ``step`` per key merged
    into its cumulation's windows as they fire (Flink's ``CumulativeSliceAssigner``),
    would keep one accumulator per key instead of one per open window, but needs a
    store of its own per layout and backend; here a record (or a pre-aggregated pane
    of ``step``, see :attr:`panes`) is merged into each window of its cumulation that
    ends after it, as a sliding window's row is into each of its windows.

    Lateness is judged per window, as for any window: a record is late for a window
    iff ``end - 1 + allowed_lateness <= watermark``, so it can be late for the small
    windows of its cumulation and on time for the large ones, and it then counts in
    the large ones only (it goes to the late output, or is dropped, only when it is
    late for all of them). This is what Flink does: its slicing window operator puts a
    record whose slice fired into the windows of its cumulation not fired yet, and
    drops it only when the cumulation's last window fired; its ``WindowOperator``
    with allowed lateness judges each window alone.

        >>> import numpy as np
        >>> cumulate = CumulativeEventTimeWindows(max_size_ms=30, step_ms=10)
        >>> rows, ids = cumulate.assign(np.array([5, 25]))
        >>> rows.tolist(), cumulate.start_of(ids).tolist(), cumulate.end_of(ids).tolist()
        ([0, 0, 0, 1], [0, 0, 0, 0], [10, 20, 30, 30])
        >>> CumulativeEventTimeWindows(max_size_ms=25, step_ms=10)
        Traceback (most recent call last):
        ValueError: cumulating windows: max_size_ms (25) must be a multiple of step_ms (10)

    Per user, the clicks of the day so far, every hour (SQL's ``CUMULATE(TABLE clicks,
    DESCRIPTOR(ts), INTERVAL '1' HOUR, INTERVAL '1' DAY)``):

        >>> import raystream as rs
        >>> env = rs.StreamEnvironment(parallelism=1)
        >>> clicks = env.from_collection([{"user": "a", "ts": 5}, {"user": "a", "ts": 3_600_000}])
        >>> so_far = clicks.key_by("user").window(
        ...     rs.CumulativeEventTimeWindows(max_size_ms=86_400_000, step_ms=3_600_000),
        ...     timestamp="ts").count()
        >>> sink = so_far.collect()
        >>> rows = env.execute("so far").table(sink).to_pylist()  # doctest: +SKIP
        >>> sorted((r["window_end"], r["count"]) for r in rows)[:3]  # doctest: +SKIP
        [(3600000, 1), (7200000, 2), (10800000, 2)]
    """

    max_size_ms: int
    step_ms: int
    offset_ms: int = 0
    event_time = True
    merging = False

    def __post_init__(self) -> None:
        _check_positive(max_size_ms=self.max_size_ms, step_ms=self.step_ms)
        if self.max_size_ms % self.step_ms:
            raise ValueError(f"cumulating windows: max_size_ms ({self.max_size_ms}) must be a "
                             f"multiple of step_ms ({self.step_ms})")

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row index, window identity ``end - max_size``) per assignment: the windows of
        the row's cumulation that end after it."""
        size, step = self.max_size_ms, self.step_ms
        last = self._cumulation_of(timestamps) + size  # the cumulation's last end
        first = timestamps - np.mod(timestamps - self.offset_ms % step, step) + step
        counts = (last - first) // step + 1  # each row's windows: only those, no padding
        rows = np.repeat(np.arange(len(timestamps)), counts)
        nth = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        return rows, first[rows] + step * nth - size

    def end_of(self, starts: np.ndarray) -> np.ndarray:
        return starts + self.max_size_ms

    def start_of(self, starts: np.ndarray) -> np.ndarray:
        """The real starts of the windows identified by ``starts`` (:meth:`assign`'s):
        their cumulation's."""
        return self._cumulation_of(self.end_of(starts) - 1)

    def _cumulation_of(self, times: np.ndarray) -> np.ndarray:
        size = self.max_size_ms
        return times - np.mod(times - self.offset_ms % size, size)

    @property
    def panes(self) -> TumblingEventTimeWindows:
        """The step-long tumbling windows that tile these windows (pre-aggregated per
        pane): :meth:`assign` of a pane's start gives the windows holding the pane.

            >>> CumulativeEventTimeWindows(max_size_ms=30, step_ms=10, offset_ms=2).panes
            TumblingEventTimeWindows(size_ms=10, offset_ms=2)
        """
        return TumblingEventTimeWindows(size_ms=self.step_ms, offset_ms=self.offset_ms)


@dataclass(frozen=True)
class EventTimeSessionWindows:
    """Per key, records closer than ``gap_ms`` in event time share a window
    ``[first, last + gap)``; windows that come to overlap are merged."""

    gap_ms: int
    event_time = True
    merging = True

    def __post_init__(self) -> None:
        _check_positive(gap_ms=self.gap_ms)

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(len(timestamps)), timestamps.copy()

    @property
    def max_size_ms(self) -> int:
        return self.gap_ms

    def gaps(self, batch: pa.RecordBatch, *, where: str) -> np.ndarray:
        return np.full(batch.num_rows, self.gap_ms, dtype=np.int64)

    @staticmethod
    def with_dynamic_gap(gap: str | GapOf) -> DynamicEventTimeSessionWindows:
        """Session windows whose gap each record sets (see
        :class:`DynamicEventTimeSessionWindows`)."""
        return DynamicEventTimeSessionWindows(gap)


GapOf = Callable[[pa.RecordBatch], Any]
"""A dynamic session gap: a function of a record batch giving each row's gap in ms (an
Arrow or numpy array of integers, or a list)."""


@dataclass(frozen=True)
class DynamicEventTimeSessionWindows:
    """Session windows whose gap each record sets (Flink's
    ``DynamicEventTimeSessionWindows``): a record at ``ts`` with gap ``g`` opens or
    extends its key's session to at least ``ts + g``; sessions that come to overlap are
    merged. ``gap`` names an integer column of milliseconds, or is a function of the
    record batch returning one gap per row (vectorized, as
    :func:`pyarrow.compute` functions are).

        >>> import pyarrow as pa
        >>> import pyarrow.compute as pc
        >>> by_tier = EventTimeSessionWindows.with_dynamic_gap(
        ...     lambda batch: pc.multiply(batch["tier"], 1000))
        >>> batch = pa.record_batch({"tier": [1, 5]})
        >>> by_tier.gaps(batch, where="example").tolist()
        [1000, 5000]
        >>> DynamicEventTimeSessionWindows(gap="tier").gaps(
        ...     pa.record_batch({"tier": [0]}), where="window 'w'")
        Traceback (most recent call last):
        raystream.engine.errors.BadRecordError: window 'w': session gap 0 ms of record {'tier': 0} is not a positive number of milliseconds up to 2^60
    """

    gap: str | GapOf
    event_time = True
    merging = True

    def __post_init__(self) -> None:
        if not (isinstance(self.gap, str) and self.gap) and not callable(self.gap):
            raise TypeError(f"a dynamic session gap is a column name or a function of a "
                            f"record batch, got {self.gap!r}")

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(len(timestamps)), timestamps.copy()

    def gaps(self, batch: pa.RecordBatch, *, where: str) -> np.ndarray:
        """Each row's gap in ms, or an error naming the record whose gap is missing, not
        an integer, or not within ``(0, 2^60]``."""
        gap = self.gap
        if isinstance(gap, str):
            index = batch.schema.get_field_index(gap)
            if index < 0:
                raise BadRecordError(f"{where}: session gap column '{gap}' is missing "
                                     f"(columns: {', '.join(batch.schema.names)})", column=gap)
            values: Any = batch.column(index)
        else:
            try:
                values = gap(batch)
            except Exception as error:  # the user function's own failure, named
                raise BadRecordError(f"{where}: the session gap function failed on a batch "
                                     f"of {batch.num_rows} rows: {type(error).__name__}: "
                                     f"{error}") from error
        array = pa.array(values) if not isinstance(values, (pa.Array, pa.ChunkedArray)) else values
        if len(array) != batch.num_rows:
            raise BadRecordError(f"{where}: the session gap function returned {len(array)} "
                                 f"gaps for a batch of {batch.num_rows} rows")
        if not pa.types.is_integer(array.type):
            raise BadRecordError(f"{where}: session gaps have type {array.type}; expected "
                                 f"integer milliseconds")
        if array.null_count:
            row = int(np.flatnonzero(np.asarray(array.is_null()))[0])
            record = batch.slice(row, 1).to_pylist()[0]
            raise BadRecordError(f"{where}: the session gap of record {record} is null",
                                 record=record)
        ms = np.asarray(array.to_numpy(zero_copy_only=False))
        bad = (ms <= 0) | (ms > MAX_SPAN_MS)
        if bad.any():
            row = int(np.argmax(bad))
            record = batch.slice(row, 1).to_pylist()[0]
            raise BadRecordError(f"{where}: session gap {int(ms[row])} ms of record {record} "
                                 f"is not a positive number of milliseconds up to 2^60",
                                 record=record)
        return ms.astype(np.int64, copy=False)


@dataclass(frozen=True)
class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    """Fixed-size windows of the wall clock at the time the operator processes a record."""

    event_time = False


GLOBAL_START = -EVENT_TIME_LIMIT_MS
GLOBAL_END = EVENT_TIME_LIMIT_MS + 1  # every event time is before it: end - 1 is the last


@dataclass(frozen=True)
class GlobalWindows:
    """One window per key holding all of its records (Flink's ``GlobalWindows``): it never
    ends, so it fires only by a trigger given with it (its default trigger never fires),
    e.g. ``trigger=rs.PurgingTrigger(rs.CountTrigger(count=100))``. Its results'
    ``window_start`` and ``window_end`` are the ends of event time, ``-2^62`` and
    ``2^62 + 1``.

        >>> import numpy as np
        >>> GlobalWindows().assign(np.array([5, -7]))[1].tolist() == [GLOBAL_START] * 2
        True
    """

    event_time = False  # no end in event time: never late, no cleanup
    merging = False

    def assign(self, timestamps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(len(timestamps)), np.full(len(timestamps), GLOBAL_START, np.int64)

    def end_of(self, starts: np.ndarray) -> np.ndarray:
        return np.full(len(starts), GLOBAL_END, dtype=np.int64)


WindowAssigner = (TumblingEventTimeWindows | SlidingEventTimeWindows | CumulativeEventTimeWindows
                  | EventTimeSessionWindows | DynamicEventTimeSessionWindows
                  | TumblingProcessingTimeWindows | GlobalWindows)
SessionWindows = EventTimeSessionWindows | DynamicEventTimeSessionWindows  # the merging ones
