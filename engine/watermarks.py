"""Watermark strategies for sources (Flink's ``WatermarkStrategy``).

Time is int64 milliseconds since the epoch, within ``±EVENT_TIME_LIMIT_MS`` (2^62 ms,
146 million years) so that window ends, lateness and join bounds added to it cannot
overflow int64. A bounded-out-of-orderness
watermark is ``max_timestamp_seen - bound - 1``: after it, records with a
timestamp up to ``bound`` ms older than the newest seen are still on time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from raystream.actors.messages import MIN_WATERMARK
from raystream.engine.errors import BadRecordError


@dataclass(frozen=True)
class BoundedOutOfOrderness:
    """Watermarks that trail the largest timestamp seen by ``bound_ms`` (+1 ms).

    ``timestamp_column`` holds int64 milliseconds or an Arrow timestamp.

    >>> import pyarrow as pa
    >>> wm = BoundedOutOfOrderness("ts", bound_ms=100)
    >>> wm.max_timestamp(pa.record_batch({"ts": [1000, 1500, 1200]}))
    1500
    >>> wm.watermark_for(1500)
    1399
    """

    timestamp_column: str
    bound_ms: int = 0

    def __post_init__(self) -> None:
        if self.bound_ms < 0:
            raise ValueError("bound_ms must be >= 0")

    def max_timestamp(self, batch: pa.RecordBatch) -> int:
        """Largest timestamp of the batch in ms (MIN_WATERMARK for an empty batch)."""
        column = timestamps_ms(batch, self.timestamp_column, where="watermarks")
        if len(column) == 0:
            return MIN_WATERMARK
        return int(column.max())

    def watermark_for(self, max_timestamp: int) -> int:
        if max_timestamp == MIN_WATERMARK:
            return MIN_WATERMARK
        return max(max_timestamp - self.bound_ms - 1, MIN_WATERMARK)  # a huge bound: no lateness


def timestamps_ms(batch: pa.RecordBatch, column: str, *, where: str) -> np.ndarray:
    """The ``column`` of ``batch`` as int64 milliseconds, or a clear error; timestamps
    finer than a millisecond are floored to it.

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"ts": pa.array([1_500_999, -1], pa.timestamp("us"))})
    >>> timestamps_ms(batch, "ts", where="example").tolist()
    [1500, -1]
    """
    index = batch.schema.get_field_index(column)
    if index < 0:
        raise BadRecordError(f"{where}: timestamp column '{column}' is missing (columns: "
                             f"{', '.join(batch.schema.names)})", column=column)
    values = batch.column(index)
    if values.null_count:
        row = batch.filter(values.is_null()).slice(0, 1).to_pylist()[0]
        raise BadRecordError(f"{where}: timestamp column '{column}' is null in record {row}",
                             column=column, record=row)
    if pa.types.is_timestamp(values.type):
        finer = _PER_MS.get(values.type.unit)
        if finer is not None:  # floored to the millisecond (toward the past), as Flink does
            ms = values.view(pa.int64()).to_numpy(zero_copy_only=False) // finer
            return _within_limits(ms, batch, column, where)
        values = values.cast(pa.timestamp("ms")).view(pa.int64())
    elif not pa.types.is_integer(values.type):
        raise BadRecordError(f"{where}: timestamp column '{column}' has type {values.type}; "
                             f"expected int64 milliseconds or a timestamp", column=column)
    return _within_limits(values.to_numpy(zero_copy_only=False), batch, column, where)


def _within_limits(ms: np.ndarray, batch: pa.RecordBatch, column: str, where: str) -> np.ndarray:
    """``ms`` as int64, or a BadRecordError naming the first record beyond the limits
    (a uint64 beyond int64 would wrap negative; a time near int64's ends overflows the
    windows' ends)."""
    if not len(ms) or (ms.max() <= EVENT_TIME_LIMIT_MS and ms.min() >= -EVENT_TIME_LIMIT_MS):
        return ms.astype(np.int64, copy=False)
    beyond = ms > EVENT_TIME_LIMIT_MS
    if ms.dtype.kind == "i":
        beyond |= ms < -EVENT_TIME_LIMIT_MS
    row = int(np.argmax(beyond))
    record = batch.slice(row, 1).to_pylist()[0]
    raise BadRecordError(f"{where}: timestamp column '{column}' holds {int(ms[row])} ms, beyond "
                         f"the event-time limit of ±2^62 ms (146 million years), in record "
                         f"{record}", column=column, record=record)


# Together within int64: a time, plus a window's span, plus its lateness (7 * 2^60 < 2^63)
EVENT_TIME_LIMIT_MS = 1 << 62
MAX_SPAN_MS = 1 << 60  # the longest window size, slide, gap or join bound: 36 million years
MAX_LATENESS_MS = 1 << 61  # 73 million years: a larger allowed lateness counts as this
_PER_MS = {"us": 1_000, "ns": 1_000_000}  # timestamp units finer than a millisecond
