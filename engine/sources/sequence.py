"""A deterministic, vectorized, replayable generator source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa

from raystream.engine.sources.base import (RangeSplitReader, Source, range_split_id,
                                           range_splits)

ColumnsFn = Callable[[np.ndarray], Mapping[str, object]]


def _identity_columns(index: np.ndarray) -> dict[str, np.ndarray]:
    return {"id": index}


@dataclass(frozen=True)
class Sequence(Source):
    """Rows ``0 .. n-1``, generated batch by batch from the row index.

    ``columns(index)`` gets an int64 numpy array of row indexes and returns
    columns (numpy arrays, pyarrow arrays or lists); it must be a pure
    function of the index so that a replay produces the same rows. The rows are
    cut into ``num_splits`` contiguous splits, independent of parallelism.

    >>> import numpy as np
    >>> src = Sequence(10, columns=lambda i: {"id": i, "even": i % 2 == 0}, batch_size=4, num_splits=2)
    >>> src.splits()
    [(0, 5), (5, 10)]
    >>> r = src.reader((5, 10)); r.next_batch().to_pydict()["id"], r.position
    ([5, 6, 7, 8], 4)
    """

    n: int
    columns: ColumnsFn = _identity_columns
    batch_size: int = 8192
    num_splits: int = 4

    def __post_init__(self) -> None:
        if self.n < 0 or self.batch_size <= 0 or self.num_splits <= 0:
            raise ValueError("Sequence needs n >= 0, batch_size > 0 and num_splits > 0")

    def splits(self) -> list[tuple[int, int]]:
        """Contiguous ranges; empty ones (``n < num_splits``) are left out."""
        return range_splits(self.n, self.num_splits)

    def reader(self, split: tuple[int, int], position: int = 0) -> "SequenceReader":
        return SequenceReader(self, split, position)

    def split_id(self, split) -> str:
        return range_split_id(split)

    def produced_columns(self) -> tuple[str, ...] | None:
        """The names ``columns`` gives an empty index (a pure function of the index names
        the same ones for any); None if it fails on one."""
        if self.columns is _identity_columns:
            return ("id",)
        try:
            columns = self.columns(np.arange(0, dtype=np.int64))
        except Exception:  # it indexes its input, say: checked at its first batch instead
            return None
        if not isinstance(columns, Mapping) or not all(isinstance(k, str) for k in columns):
            return None  # (its first batch says what is wrong with it)
        return tuple(columns)


class SequenceReader(RangeSplitReader):
    def __init__(self, source: Sequence, split: tuple[int, int], position: int) -> None:
        super().__init__(split, position, source.batch_size)
        self.source = source

    def read_range(self, lo: int, hi: int) -> pa.RecordBatch:
        columns = self.source.columns(np.arange(lo, hi, dtype=np.int64))
        batch = pa.RecordBatch.from_pydict({name: _as_array(v) for name, v in columns.items()})
        if batch.num_rows != hi - lo:
            raise ValueError(f"Sequence columns returned {batch.num_rows} rows for {hi - lo} indexes")
        return batch


def _as_array(values: object) -> pa.Array:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    return pa.array(values)
