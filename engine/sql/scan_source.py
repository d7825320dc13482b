"""A table's source as its scan reads it: the connector's source with each batch shaped
into the table's columns (physical ones typed, computed ones computed) inside the reader,
so that the watermark is generated over the table's rowtime column, as Flink generates
it in the scan; and SQL's watermark (``WATERMARK FOR ts AS ts - INTERVAL 'd' ...``).

    >>> import pyarrow as pa
    >>> SqlWatermark("ts", delay_ms=4000).watermark_for(10_000)
    6000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from raystream.actors.messages import MIN_WATERMARK
from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.watermarks import BoundedOutOfOrderness


@dataclass(frozen=True)
class SqlWatermark(BoundedOutOfOrderness):
    """Flink SQL's watermark: the largest rowtime seen minus ``delay_ms``, so a row at the
    watermark or before it is late (the DataStream API's bounded out-of-orderness trails by
    1 ms more)."""

    delay_ms: int = 0

    def watermark_for(self, max_timestamp: int) -> int:
        if max_timestamp == MIN_WATERMARK:
            return MIN_WATERMARK
        return max(max_timestamp - self.delay_ms, MIN_WATERMARK)


@dataclass(frozen=True)
class ShapedSource(Source):
    """``inner``'s splits and positions, its batches passed through ``shape`` (which keeps
    their rows: a position counts the inner reader's rows)."""

    inner: Source
    shape: Callable[[pa.RecordBatch], pa.RecordBatch]
    columns: tuple[str, ...]

    def splits(self) -> list[Any]:
        return self.inner.splits()

    def reader(self, split: Any, position: int = 0) -> SplitReader:
        return _ShapedReader(self.inner.reader(split, position), self.shape_of(split))

    def shape_of(self, split: Any) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        """How ``split``'s batches are shaped (a file's partition values are its own)."""
        return self.shape

    def split_id(self, split: Any) -> str:
        return self.inner.split_id(split)

    def preflight(self) -> None:
        self.inner.preflight()

    def produced_columns(self) -> tuple[str, ...] | None:
        return self.columns

    def create_enumerator(self, context: Any, state: Any | None) -> Any:
        return self.inner.create_enumerator(context, state)

    def handle_source_event(self, reader: Any, event: Any) -> None:
        self.inner.handle_source_event(reader._inner if isinstance(reader, _ShapedReader)
                                       else reader, event)


class _ShapedReader(SplitReader):
    def __init__(self, inner: SplitReader, shape: Callable[[pa.RecordBatch], pa.RecordBatch]) -> None:
        self._inner, self._shape = inner, shape

    @property  # the inner reader's, always (a checkpoint stores it)
    def position(self) -> int:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self._inner.position

    @position.setter
    def position(self, value: int) -> None:
        self._inner.position = value

    @property
    def dead_letter(self) -> pa.RecordBatch | None:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self._inner.dead_letter

    def next_batch(self) -> pa.RecordBatch | None:
        batch = self._inner.next_batch()
        return None if batch is None else self._shape(batch)

    def close(self) -> None:
        self._inner.close()
