"""A source over an in-memory list of rows (dicts)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pyarrow as pa

from raystream.engine.batches import rows_to_batch
from raystream.engine.sources.base import (RangeSplitReader, Source, range_split_id,
                                           range_splits)


class Collection(Source):
    """Rows from a Python list, cut into ``num_splits`` contiguous splits.

    >>> src = Collection([{"a": 1}, {"a": 2}, {"a": 3}], num_splits=2)
    >>> [src.reader(s).next_batch().num_rows for s in src.splits()]
    [1, 2]
    """

    def __init__(self, rows: Sequence[Mapping[str, Any]], *, schema: pa.Schema | None = None,
                 batch_size: int = 1024, num_splits: int = 1) -> None:
        self.rows = list(rows)
        self.schema = schema
        self.batch_size = batch_size
        self.num_splits = max(1, min(num_splits, len(self.rows))) if self.rows else 1

    def splits(self) -> list[tuple[int, int]]:
        return range_splits(len(self.rows), self.num_splits) or [(0, 0)]

    def reader(self, split: tuple[int, int], position: int = 0) -> "CollectionReader":
        return CollectionReader(self, split, position)

    def split_id(self, split) -> str:
        return range_split_id(split)

    def produced_columns(self) -> tuple[str, ...] | None:
        """The schema's names, or every key of any row (a row without one has it null);
        None for no rows (no batch ever fails then)."""
        if self.schema is not None:
            return tuple(self.schema.names)
        try:
            return tuple(dict.fromkeys(k for row in self.rows for k in row)) or None
        except TypeError:  # a row that is no mapping: its batch reports it, naming it
            return None


class CollectionReader(RangeSplitReader):
    def __init__(self, source: Collection, split: tuple[int, int], position: int) -> None:
        super().__init__(split, position, source.batch_size)
        self.source = source

    def read_range(self, lo: int, hi: int) -> pa.RecordBatch:
        return rows_to_batch(self.source.rows[lo:hi], schema=self.source.schema,
                             where="collection source")
