"""Conversion between Python rows (dicts) and Arrow record batches.

Used where user code works per row (``map``, ``flat_map``, ``filter``, a
collection source). A row that cannot become part of a batch is reported with
the column, the cause and the row itself — never silently dropped or coerced.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from raystream.engine.errors import BadRecordError, describe_record


# Values a row may share with state or with the user's own objects and that can change
# in place; a row holding any of them is copied deeply when it is captured.
_MUTABLE_VALUES = frozenset((list, dict, set, bytearray, np.ndarray))


def capture_row(row: Any) -> Any:
    """``row`` as it is now, for an output that becomes a batch only later.

    Operators collect a batch's output rows and convert them once, at the end of the
    batch. A user function may emit an object it goes on changing within that batch:
    the value it keeps in heap state, or a dict it fills again for every output. Flink
    serializes (or copies) each record as it is emitted, so every output keeps the
    value it had then; capturing does the same, whatever the state backend. A dict of
    immutable values is copied shallowly, one holding lists, dicts, sets or arrays
    deeply; what is not a mapping is returned as it is, for ``rows_to_batch`` to
    report.

    >>> row = {"k": "a", "v": 1}
    >>> captured = capture_row(row)
    >>> row["v"] += 1
    >>> captured, row
    ({'k': 'a', 'v': 1}, {'k': 'a', 'v': 2})
    """
    if type(row) is dict:
        if _MUTABLE_VALUES.isdisjoint(map(type, row.values())):
            return row.copy()
        return copy.deepcopy(row)
    if isinstance(row, Mapping):
        return copy.deepcopy(dict(row))
    return row


def rows_to_batch(rows: list[Any], *, schema: pa.Schema | None = None,
                  where: str = "rows") -> pa.RecordBatch:
    """Build one RecordBatch from dict rows; columns are the union of the rows' keys.

    >>> rows_to_batch([{"a": 1}, {"a": 2, "b": "x"}]).to_pylist()
    [{'a': 1, 'b': None}, {'a': 2, 'b': 'x'}]
    >>> rows_to_batch([{"a": 1}, {"a": "two"}], where="map 'parse'")
    Traceback (most recent call last):
    ...
    raystream.engine.errors.BadRecordError: map 'parse': column 'a' cannot hold value 'two' (str) of record {'a': 'two'}: ...
    """
    if set(map(type, rows)) - {dict}:  # (in C: isinstance(row, Mapping) per row is slow)
        for row in rows:
            if not isinstance(row, Mapping):
                raise BadRecordError(
                    f"{where}: expected a dict per record, got {type(row).__name__}: "
                    f"{describe_record(row)}", record=row)
    if schema is not None:
        names = schema.names
    else:
        names = list(dict.fromkeys(k for row in rows for k in row))
    arrays = []
    for name in names:
        values = [row.get(name) for row in rows]
        target = schema.field(name).type if schema is not None else None
        try:
            arrays.append(pa.array(values, type=target))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            raise _bad_value(rows, name, target, where, exc) from exc
    if not names:
        if rows:  # a batch without columns cannot carry a row count
            raise BadRecordError(f"{where}: records without any field: {describe_record(rows[0])}",
                                 record=rows[0])
        return pa.RecordBatch.from_pydict({})
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _bad_value(rows: list[Mapping], name: str, target: pa.DataType | None, where: str,
               exc: Exception) -> BadRecordError:
    """Find the first row whose value for ``name`` breaks the column and describe it."""
    if target is None:  # the type arrow infers from the first non-null value
        first = next((row.get(name) for row in rows if row.get(name) is not None), None)
        try:
            target = pa.array([first]).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            target = None
    for row in rows:
        value = row.get(name)
        try:
            pa.array([value], type=target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as cell_exc:
            return BadRecordError(
                f"{where}: column '{name}' cannot hold value {value!r} ({type(value).__name__}) "
                f"of record {describe_record(row)}: {cell_exc}", column=name, record=row)
    return BadRecordError(f"{where}: column '{name}' cannot be built: {exc}", column=name)


def concat_batches(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """One table from batches whose schemas may differ slightly (e.g. a null column)."""
    tables = [pa.Table.from_batches([b]) for b in batches]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")
