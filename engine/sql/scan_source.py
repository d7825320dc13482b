"""A table's source as its scan reads it: the connector's source with each batch shaped
into the table's columns (physical ones typed, computed ones computed) inside the reader,
so that the watermark is generated over the table's rowtime column, as Flink generates
it in the scan; and SQL's watermark (``WATERMARK FOR ts AS ts - INTERVAL 'd' ...``).

    >>> import pyarrow as pa
    >>> SqlWatermark("ts", delay_ms=4000).watermark_for(10_000)
    6000
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc

from raystream.actors.messages import MIN_WATERMARK
from raystream.engine.errors import SqlError
from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.sql.ast import ComputedColumn
from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.compiled import Compiled, as_array
from raystream.engine.sql.expressions import Scope, compile_expression
from raystream.engine.sql.schema import RelSchema
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


@dataclass(frozen=True)
class TableShape:
    """A connector's batch as a table's rows: its physical columns (found by name, cast to
    their declared types; ``constants``: those every row of the batch has, as text, such
    as a file's partition values), then the computed columns over them."""

    physical: RelSchema
    computed: tuple[tuple[str, Compiled], ...]
    names: tuple[str, ...]
    constants: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def of(cls, table: TableEntry) -> "TableShape":
        computed = tuple((c.name, compile_expression(c.expression, Scope(table.physical)))
                         for c in table.definition.columns if isinstance(c, ComputedColumn))
        return cls(table.physical, computed, table.schema.names)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n, columns = batch.num_rows, {}
        for f in self.physical.fields:
            if f.name in self.constants:
                value = self.constants[f.name]
                columns[f.name] = pa.nulls(n, f.type) if value is None else pa.repeat(
                    pa.scalar(value).cast(f.type), n)
                continue
            if f.name not in batch.schema.names:
                raise SqlError(f"a {f.name!r} column is missing from what the connector read "
                               f"(its columns: {', '.join(batch.schema.names)})")
            column = batch.column(f.name)
            columns[f.name] = column if column.type == f.type else pc.cast(column, f.type)  # pyright: ignore[reportAttributeAccessIssue]
        physical = pa.RecordBatch.from_pydict(columns)
        for name, compiled in self.computed:
            columns[name] = as_array(compiled.evaluate(physical), n)
        return pa.RecordBatch.from_pydict({name: columns[name] for name in self.names})
