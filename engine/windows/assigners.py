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

import numpy as np

from raystream.engine.watermarks import MAX_SPAN_MS


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


@dataclass(frozen=True)
class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    """Fixed-size windows of the wall clock at the time the operator processes a record."""

    event_time = False


WindowAssigner = (TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows
                  | TumblingProcessingTimeWindows)
