"""Event time per key group at a checkpoint, so a restored job never goes back in time.

Each subtask acknowledges a checkpoint with the watermark its operators had
reached, over its key-group range; the checkpoint stores them per head
operator as runs ``[first_group, last_group, watermark]``. On restore, at any
parallelism, a keyed operator judges lateness per key group against the
watermark that group's former owner had reached (its *floor*) until its own
watermark passes it. With the minimum over all subtasks instead, a rescaled
restore would re-open windows that a faster subtask had already fired and
purged; with the maximum, it would drop records a slower one still accepted.

    >>> floors = WatermarkFloors.from_json([[0, 63, 100], [64, 127, 250]], max_parallelism=128)
    >>> floors.minimum()
    100
    >>> floors.of_groups(range(60, 68)).tolist()
    [100, 100, 100, 100, 250, 250, 250, 250]
    >>> WatermarkFloors.from_json(7, max_parallelism=4).to_json()   # metadata of older versions
    [[0, 3, 7]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

MIN_WATERMARK = -(1 << 63)

Runs = list[list[int]]  # [[first key group, last key group (inclusive), watermark], ...]


@dataclass(frozen=True)
class WatermarkFloors:
    """The watermark of every key group ``0 .. max_parallelism - 1``."""

    values: np.ndarray  # int64, one per key group

    @classmethod
    def from_json(cls, value: int | Runs, *, max_parallelism: int) -> "WatermarkFloors":
        """From checkpoint metadata: runs, or one int (one watermark for every group)."""
        runs = [[0, max_parallelism - 1, value]] if isinstance(value, int) else value
        return cls.combine([runs], max_parallelism=max_parallelism)

    @classmethod
    def combine(cls, runs: Iterable[Runs], *, max_parallelism: int) -> "WatermarkFloors":
        """The subtasks' acknowledged runs (disjoint ranges) as one table; a key group no
        subtask covered stays at the minimum watermark."""
        values = np.full(max_parallelism, MIN_WATERMARK, dtype=np.int64)
        for subtask_runs in runs:
            for first, last, watermark in subtask_runs:
                values[first:last + 1] = watermark
        return cls(values)

    def to_json(self) -> Runs:
        return runs_of(range(len(self.values)), self.values)

    def minimum(self) -> int:
        return int(self.values.min())

    def of_groups(self, groups: range) -> np.ndarray:
        return self.values[groups.start:groups.stop].copy()


def runs_of(groups: range, watermarks: np.ndarray) -> Runs:
    """``watermarks`` (one per group of ``groups``) as runs of equal values."""
    if not len(groups):
        return []
    edges = [0, *(np.flatnonzero(np.diff(watermarks)) + 1).tolist(), len(watermarks)]
    return [[groups.start + a, groups.start + b - 1, int(watermarks[a])]
            for a, b in zip(edges[:-1], edges[1:])]
