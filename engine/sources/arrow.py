"""A source over an in-memory Arrow table, shared through Ray's object store."""

from __future__ import annotations

import pyarrow as pa
import ray

from raystream.engine.sources.base import (RangeSplitReader, Source, range_split_id,
                                           range_splits)


class ArrowTable(Source):
    """The rows of a ``pyarrow.Table`` (or list of batches), cut into ``num_splits``
    contiguous splits, ``batch_size`` rows per emitted batch.

    The table is put into Ray's object store once, by the process that builds
    the job (which owns it for as long as the source object lives); readers map
    it zero-copy instead of receiving a copy with their actor's arguments.

    >>> import pyarrow as pa
    >>> src = ArrowTable(pa.table({"x": list(range(10))}), batch_size=4, num_splits=2)
    >>> src.splits()
    [(0, 5), (5, 10)]
    >>> src.reader((5, 10), position=3).next_batch().to_pydict()  # doctest: +SKIP
    {'x': [8, 9]}
    """

    def __init__(self, table: pa.Table | list[pa.RecordBatch], *, batch_size: int = 65536,
                 num_splits: int = 4) -> None:
        whole: pa.Table = (table if isinstance(table, pa.Table)
                           else pa.Table.from_batches(list(table)))
        self.num_rows = whole.num_rows
        self.schema = whole.schema
        self.batch_size = batch_size
        self.num_splits = max(1, min(num_splits, self.num_rows)) if self.num_rows else 1
        # until the job is built: pickling puts it into the object store
        self._table: pa.Table | None = whole
        self._ref: ray.ObjectRef[pa.Table] | None = None

    def produced_columns(self) -> tuple[str, ...]:
        return tuple(self.schema.names)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self._ref is None:
            self._ref = ray.put(self._table)
        state["_ref"], state["_table"] = self._ref, None
        return state

    def table(self) -> pa.Table:
        if self._table is None:
            if self._ref is None:  # __getstate__ puts it in the object store before dropping it
                raise RuntimeError("the source's table is neither here nor in the object store")
            self._table = ray.get(self._ref)
        return self._table

    def splits(self) -> list[tuple[int, int]]:
        return range_splits(self.num_rows, self.num_splits) or [(0, 0)]

    def reader(self, split: tuple[int, int], position: int = 0) -> "ArrowTableReader":
        return ArrowTableReader(self, split, position)

    def split_id(self, split) -> str:
        return range_split_id(split)


class ArrowTableReader(RangeSplitReader):
    def __init__(self, source: ArrowTable, split: tuple[int, int], position: int) -> None:
        super().__init__(split, position, source.batch_size)
        self.table = source.table()

    def read_range(self, lo: int, hi: int) -> pa.RecordBatch:
        return self.table.slice(lo, hi - lo).combine_chunks().to_batches()[0]
