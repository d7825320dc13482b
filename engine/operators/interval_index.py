"""The sorted index an interval join probes a buffer of rows with: pairs of equal keys
whose times are within an interval, found with ``searchsorted`` over one sortable int64
per row, so only real pairs are materialized. The heap buffer
(:mod:`raystream.engine.operators.interval_join`) indexes each of its segments, the
disk one (:mod:`raystream.engine.operators.disk_join`) the rows it read for a probe.

    >>> import numpy as np
    >>> import pyarrow as pa
    >>> rows = KeyedRows(pa.table({"x": [1, 2, 3]}), ts=np.array([10, 20, 10]),
    ...                  kid=np.array([1, 1, 2]))
    >>> probe, found = SortedRows.of(rows).matches(np.array([1]), np.array([12]), (-5, 10))
    >>> probe.tolist(), found.tolist()
    ([0, 0], [0, 1])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raystream.engine.operators.keyed_rows import KeyedRows


def _match_by_key_runs(index: "SortedRows", kid: np.ndarray, ts: np.ndarray,
                       offsets: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Every (probe, buffered) pair of equal keys, then those within the interval."""
    sorted_kids = index.rows.kid[index.order]
    start = np.searchsorted(sorted_kids, kid, side="left")
    counts = np.searchsorted(sorted_kids, kid, side="right") - start
    total = int(counts.sum())
    probe = np.repeat(np.arange(len(kid), dtype=np.int64), counts)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    buffered = index.order[np.repeat(start, counts) + within]
    other_ts, probe_ts = index.rows.ts[buffered], ts[probe]
    hit = (other_ts >= probe_ts + offsets[0]) & (other_ts <= probe_ts + offsets[1])
    return probe[hit], buffered[hit]


@dataclass(frozen=True)
class SortedRows:
    """A buffer's rows sorted by (key id, ts), as one sortable int64 per row."""

    rows: KeyedRows
    order: np.ndarray          # sorted position -> row
    distinct_kids: np.ndarray  # ascending; a key's rank is its index here
    composite: np.ndarray      # rank * span + (ts - ts_min), ascending
    ts_min: int
    span: int                  # 0: too wide for one int64 (see _match_by_key_runs)

    @classmethod
    def of(cls, rows: KeyedRows) -> "SortedRows":
        order = np.lexsort((rows.ts, rows.kid))
        kids, ts = rows.kid[order], rows.ts[order]
        distinct_kids, rank = np.unique(kids, return_inverse=True)
        ts_min = int(ts.min())
        span = int(ts.max()) - ts_min + 2  # local times 0 .. span - 2, span - 1 past all
        if len(distinct_kids) * span >= 2 ** 62:
            # too wide for one int64 (rows centuries apart over millions of keys): fall
            # back to key runs, filtered by time after expanding
            span = 0
        return cls(rows, order, distinct_kids, rank.reshape(-1) * span + (ts - ts_min),
                   ts_min, span)

    def matches(self, kid: np.ndarray, ts: np.ndarray,
                offsets: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (row of the probe, row of these rows) with equal key ids and
        ``ts + offsets[0] <= row's ts <= ts + offsets[1]``: two index arrays.

        Only real pairs are materialized, however many rows a hot key has: each probe
        row's matches are one ``searchsorted`` range of ``composite``."""
        if self.span == 0:
            return _match_by_key_runs(self, kid, ts, offsets)
        rank = np.searchsorted(self.distinct_kids, kid)
        rank = np.minimum(rank, len(self.distinct_kids) - 1)
        present = self.distinct_kids[rank] == kid
        base = rank * self.span
        # probe bounds in local time, clipped to [0, span - 1] / [-1, span - 2]
        low = np.clip(ts + offsets[0] - self.ts_min, 0, self.span - 1) + base
        high = np.clip(ts + offsets[1] - self.ts_min, -1, self.span - 2) + base
        start = np.searchsorted(self.composite, low, side="left")
        counts = np.searchsorted(self.composite, high, side="right") - start
        counts = np.where(present, np.maximum(counts, 0), 0)
        total = int(counts.sum())
        if total == 0:
            empty = np.empty(0, np.int64)
            return empty, empty
        probe = np.repeat(np.arange(len(kid), dtype=np.int64), counts)
        # position within each probe row's range, plus the range's start in sorted order
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        return probe, self.order[np.repeat(start, counts) + within]
