"""Operators that run user functions: per row (map, filter, flat_map, keyed reduce)
and per batch (map_batches, filter_batches), on one input or two (connect).

User functions may be plain callables or objects with ``open(ctx)`` /
``close()`` methods (Flink's rich functions), which are called around the run.
A failing call is re-raised with the record it failed on attached as a note.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from raystream.engine.batches import capture_row, rows_to_batch
from raystream.engine.errors import BadRecordError, describe_record
from raystream.actors.operator import Operator


def open_function(fn: Any, ctx) -> None:
    if callable(getattr(fn, "open", None)):
        fn.open(ctx)


def close_function(fn: Any) -> None:
    if callable(getattr(fn, "close", None)):
        fn.close()


def call_user(fn: Callable, record: Any, *args: Any) -> Any:
    try:
        return fn(record, *args) if args else fn(record)
    except Exception as exc:
        exc.add_note(f"record: {describe_record(record)}")
        raise


def emit_rows(operator: Operator, rows: list[Any], schema: pa.Schema | None) -> None:
    """Emit dict rows as one batch (nothing for no rows), naming the operator on bad rows."""
    if rows:
        operator.output.emit(rows_to_batch(rows, schema=schema, where=f"operator '{operator.name}'"))


def as_record_batch(value: Any, where: str) -> list[pa.RecordBatch]:
    """Normalize what a batch function returned to a list of RecordBatches."""
    if isinstance(value, pa.RecordBatch):
        return [value]
    if isinstance(value, pa.Table):
        return value.to_batches()
    if isinstance(value, Mapping):
        return [pa.RecordBatch.from_pydict(dict(value))]
    raise TypeError(f"{where} must return a pyarrow.RecordBatch, a pyarrow.Table or a dict of "
                    f"columns, not {type(value).__name__}")


class _FunctionOperator(Operator):
    """An operator driven by one user function per input (index 0, or 0 and 1)."""

    def __init__(self, name: str, functions: Sequence[Callable], *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name)
        self.functions = list(functions)
        self.schema = schema
        self._emitted = False

    def open(self) -> None:
        for fn in self.functions:
            open_function(fn, self.ctx)

    def close(self) -> None:
        for fn in self.functions:
            close_function(fn)

    def _emit_rows(self, rows: list[Any]) -> None:
        if rows:
            self._emitted = True
            emit_rows(self, rows, self.schema)
        elif self.schema is not None:  # a declared schema is known without rows
            self._emit_batch(pa.RecordBatch.from_pylist([], schema=self.schema))

    def _emit_batch(self, batch: pa.RecordBatch) -> None:
        """Emit ``batch``; an empty one only while nothing was emitted yet, so that a sink
        whose input is filtered to nothing still learns the schema (one empty batch per
        subtask, not one per input batch)."""
        if batch.num_rows or not self._emitted:
            self._emitted = True
            self.output.emit(batch)


class MapOperator(_FunctionOperator):
    """``fn(row: dict) -> dict`` for every row."""

    def process_batch(self, batch, input_index=0):
        fn = self.functions[input_index]
        out = []
        for row in batch.to_pylist():
            produced = call_user(fn, row)
            if not isinstance(produced, Mapping):
                raise BadRecordError(
                    f"map '{self.name}' must return a dict per record, got "
                    f"{type(produced).__name__} {describe_record(produced)} for record "
                    f"{describe_record(row)}", record=row)
            out.append(capture_row(produced))
        self._emit_rows(out)


class FlatMapOperator(_FunctionOperator):
    """``fn(row: dict) -> iterable of dicts`` for every row."""

    def process_batch(self, batch, input_index=0):
        fn = self.functions[input_index]
        out: list[Any] = []
        for row in batch.to_pylist():
            produced = call_user(fn, row)
            if produced is not None:
                out.extend(map(capture_row, produced))
        self._emit_rows(out)


class FilterOperator(_FunctionOperator):
    """Keeps the rows for which ``fn(row: dict)`` is true."""

    def process_batch(self, batch, input_index=0):
        fn = self.functions[input_index]
        mask = pa.array([bool(call_user(fn, row)) for row in batch.to_pylist()], type=pa.bool_())
        self._emit_batch(batch.filter(mask))


class MapBatchesOperator(_FunctionOperator):
    """``fn(batch: pyarrow.RecordBatch) -> RecordBatch | Table | dict of columns``."""

    def process_batch(self, batch, input_index=0):
        result = self.functions[input_index](batch)
        for out in as_record_batch(result, where=f"map_batches '{self.name}'"):
            self._emit_batch(out)


class FilterBatchesOperator(_FunctionOperator):
    """``fn(batch) -> boolean mask`` (pyarrow or numpy) of the rows to keep."""

    def process_batch(self, batch, input_index=0):
        mask = self.functions[input_index](batch)
        if isinstance(mask, np.ndarray):
            mask = pa.array(mask, type=pa.bool_())
        if len(mask) != batch.num_rows:
            raise ValueError(f"filter_batches '{self.name}': mask has {len(mask)} values for "
                             f"{batch.num_rows} rows")
        self._emit_batch(batch.filter(mask))


class UnionOperator(Operator):
    """Forwards the batches of every input (``union``)."""

    def process_batch(self, batch, input_index=0):
        self.output.emit(batch)
