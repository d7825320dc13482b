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

from raystream.engine.sources.split_enumerator import StaticSplitEnumerator


# The side output on which a source reader emits the rows describing splits it skipped
# as unreadable (``read_files(..., errors="dead_letter")``).
DEAD_LETTERS = "dead_letters"


class SplitReader:
    """Reads one split. ``position`` is the number of rows emitted so far.

    A reader that finds its split unreadable and may skip it ends it without a
    row and sets ``dead_letter`` to one row describing it, which the source
    reader emits on side output :data:`DEAD_LETTERS`.
    """

    position: int = 0
    dead_letter: pa.RecordBatch | None = None

    def next_batch(self) -> pa.RecordBatch | None:
        """The next batch, or None when the split is exhausted."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class Source:
    """A bounded or unbounded source of record batches, cut into splits (JSON values).

    Its enumerator (``create_enumerator``, in the job master) decides which
    subtask reads which split; by default the fixed :meth:`splits` are dealt
    out when the readers start. Each subtask reads its splits with
    :meth:`reader`, from a position a checkpoint recorded.
    """

    def splits(self) -> list[Any]:
        """The splits, for the default enumerator; their number never depends on the
        job's parallelism."""
        raise NotImplementedError

    def reader(self, split: Any, position: int = 0) -> SplitReader:
        raise NotImplementedError

    def split_id(self, split: Any) -> str:
        return str(split)

    def preflight(self) -> None:
        """Raise :class:`~raystream.engine.errors.JobSetupError` if it cannot start as
        configured (a path that does not exist, say); called on the driver before Ray
        starts, where the job runs on the same machine (:mod:`raystream.engine.preflight`).
        By default it checks nothing."""

    def produced_columns(self) -> tuple[str, ...] | None:
        """The columns of every batch it reads, if known before it runs (Flink's
        ``getProducedType``): the job checks the names it uses against them when it is
        built. None (the default): not known."""
        return None

    def create_enumerator(self, context: Any, state: Any | None) -> Any:
        """The :class:`~raystream.engine.sources.split_enumerator.SplitEnumerator` that
        hands out the splits, restored from ``state`` (None at the start)."""
        return StaticSplitEnumerator(context, self.splits(), state)

    def handle_source_event(self, reader: Any, event: Any) -> None:
        """A custom event from the enumerator (``send_event_to_reader``) to a reader."""
        raise NotImplementedError(f"{type(self).__name__} got a source event but does not "
                                  f"implement handle_source_event")


class RangeSplitReader(SplitReader):
    """Reads a split that is a range ``[start, end)`` of row indexes, ``batch_size`` at a time."""

    def __init__(self, split: tuple[int, int], position: int, batch_size: int) -> None:
        self.start, self.end = split
        self.position = position
        self.batch_size = batch_size

    def read_range(self, lo: int, hi: int) -> pa.RecordBatch:
        """Rows ``lo`` to ``hi - 1`` as one batch."""
        raise NotImplementedError

    def next_batch(self) -> pa.RecordBatch | None:
        lo = self.start + self.position
        if lo >= self.end:
            return None
        hi = min(lo + self.batch_size, self.end)
        batch = self.read_range(lo, hi)
        self.position += hi - lo
        return batch


def range_splits(n: int, num_splits: int) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ``num_splits`` contiguous ranges; empty ones are left out.

    >>> range_splits(10, 3)
    [(0, 3), (3, 6), (6, 10)]
    """
    bounds = [i * n // num_splits for i in range(num_splits + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(num_splits) if bounds[i + 1] > bounds[i]]


def range_split_id(split: tuple[int, int]) -> str:
    return f"{split[0]}-{split[1]}"
