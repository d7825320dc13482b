"""A lookup join's operator (``JOIN t FOR SYSTEM_TIME AS OF l.proctime``): each subtask
reads the bounded table ``t`` whole when its first row comes and joins every batch of
the left input with it, by key, vectorized: a pyarrow hash join of the two sides' key
columns and row numbers only, then a ``take`` of each side's rows (no payload column
goes through the join, whatever its type).

    >>> import pyarrow as pa
    >>> pairs = matching_rows(pa.table({"k": [1, 2, 1]}), pa.table({"k": [1, 1, 3]}),
    ...                       ["k"], ["k"])
    >>> sorted(zip(*(p.to_pylist() for p in pairs)))
    [(0, 0), (0, 1), (2, 0), (2, 1)]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa

from raystream.engine.sources.base import Source

_LEFT, _RIGHT = "__lookup_left_row", "__lookup_right_row"


def matching_rows(left: pa.Table, right: pa.Table, left_keys: list[str],
                  right_keys: list[str]) -> tuple[pa.Array, pa.Array]:
    """The row numbers of every pair of rows with equal keys (NULL equals nothing)."""
    names = [f"__k{i}" for i in range(len(left_keys))]
    a = pa.table([*(left.column(k) for k in left_keys),
                  pa.array(np.arange(left.num_rows, dtype=np.int64))], names=[*names, _LEFT])
    b = pa.table([*(right.column(k) for k in right_keys),
                  pa.array(np.arange(right.num_rows, dtype=np.int64))], names=[*names, _RIGHT])
    joined = a.join(b, keys=names, join_type="inner", use_threads=False)
    return joined.column(_LEFT).combine_chunks(), joined.column(_RIGHT).combine_chunks()


@dataclass
class LookupJoin:
    """``map_batches``' function: a batch of the left input joined with ``source``'s rows
    (read whole once, each of its batches through ``shape``, into ``schema``); the
    result is the left columns, then the right ones."""

    source: Source
    shape: Callable[[pa.RecordBatch], pa.RecordBatch]
    schema: pa.Schema
    left_keys: list[str]
    right_keys: list[str]
    _table: pa.Table | None = field(default=None, repr=False)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        table = self._table if self._table is not None else self._load()
        self._table, left = table, pa.Table.from_batches([batch])
        left_rows, right_rows = matching_rows(left, table, self.left_keys, self.right_keys)
        joined = pa.Table.from_arrays(
            [*left.take(left_rows).columns, *table.take(right_rows).columns],
            names=[*left.column_names, *table.column_names])
        return pa.RecordBatch.from_arrays([c.combine_chunks() for c in joined.columns],
                                          names=joined.column_names)

    def _load(self) -> pa.Table:
        batches = []
        for split in self.source.splits():
            reader = self.source.reader(split)
            try:
                while (read := reader.next_batch()) is not None:
                    batches.append(self.shape(read).cast(self.schema))
            finally:
                reader.close()
        return pa.Table.from_batches(batches, schema=self.schema)

    def __getstate__(self) -> dict:  # the table is read where the function runs
        return {**self.__dict__, "_table": None}
