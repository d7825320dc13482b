"""Split-based sources (in the shape of Flink's FLIP-27).

A :class:`Source` describes *what* to read as a list of splits; the number of
splits never depends on the job's parallelism. A :class:`SplitReader` reads
one split from a position (an integer offset: rows already emitted), so a
split's progress is one number that a checkpoint can store and a restore can
seek to, at any parallelism.

Writing a source:

    >>> import pyarrow as pa
    >>> class Letters(Source):
    ...     def splits(self): return ["abc", "de"]
    ...     def reader(self, split, position=0): return ListReader(split, position)
    >>> class ListReader(SplitReader):
    ...     def __init__(self, letters, position): self.letters, self.position = letters, position
    ...     def next_batch(self):
    ...         if self.position >= len(self.letters): return None
    ...         self.position += 1
    ...         return pa.record_batch({"letter": [self.letters[self.position - 1]]})
    >>> r = Letters().reader("de"); [r.next_batch().column(0)[0].as_py(), r.next_batch().num_rows, r.next_batch()]
    ['d', 1, None]
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


class SplitReader:
    """Reads one split. ``position`` is the number of rows emitted so far."""

    position: int = 0

    def next_batch(self) -> pa.RecordBatch | None:
        """The next batch, or None when the split is exhausted."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class Source:
    """A bounded or unbounded source of record batches, cut into splits."""

    def splits(self) -> list[Any]:
        raise NotImplementedError

    def reader(self, split: Any, position: int = 0) -> SplitReader:
        raise NotImplementedError

    def split_id(self, split: Any) -> str:
        return str(split)


def assign_splits(num_splits: int, subtask_index: int, parallelism: int) -> list[int]:
    """Static assignment of split indexes to source subtasks (round-robin).

    >>> assign_splits(5, 1, 2)
    [1, 3]
    """
    return list(range(subtask_index, num_splits, parallelism))
