"""Key selectors: what ``key_by`` partitions and keyed state is scoped by.

A key is one or more columns (vectorized) or a Python function of a row
(per row). The selector is evaluated on both sides of the shuffle, as Flink
evaluates its ``KeySelector`` in the partitioner and in the keyed operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from raystream.checkpoint.keygroups import NAN_KEY, canonical_key, key_groups_of_array
from raystream.engine.errors import BadRecordError, describe_record

KeySpec = str | Sequence[str] | Callable[[dict], Any]


@dataclass
class DistinctKeys:
    """A batch's distinct keys: ``arrays`` (one Arrow array per key column),
    ``keys`` (Python keys), ``groups`` (key group per distinct key) and
    ``inverse`` (per row, the index of its key)."""

    arrays: list[pa.Array]
    keys: list[Any]
    groups: np.ndarray
    inverse: np.ndarray


class KeySelector:
    """Extracts key columns from a batch.

    >>> import pyarrow as pa
    >>> ks = KeySelector.of("user")
    >>> ks.python_keys(pa.record_batch({"user": ["a", "b"], "v": [1, 2]}))
    ['a', 'b']
    >>> KeySelector.of(lambda row: row["v"] % 2).python_keys(pa.record_batch({"v": [1, 2]}))
    [1, 0]
    """

    def __init__(self, columns: tuple[str, ...] | None = None,
                 function: Callable[[dict], Any] | None = None, where: str = "key_by") -> None:
        self.columns = columns
        self.function = function
        self.where = where

    @classmethod
    def of(cls, spec: KeySpec | "KeySelector", where: str = "key_by") -> "KeySelector":
        if isinstance(spec, KeySelector):
            return spec
        if isinstance(spec, str):
            return cls(columns=(spec,), where=where)
        if callable(spec):
            return cls(function=spec, where=where)
        columns = tuple(spec)
        if not columns or not all(isinstance(c, str) for c in columns):
            raise TypeError(f"key_by takes a column name, a list of column names or a function, "
                            f"not {spec!r}")
        return cls(columns=columns, where=where)

    # -- extraction (once per batch) -----------------------------------------
    def key_arrays(self, batch: pa.RecordBatch) -> list[pa.Array]:
        """The key columns of ``batch`` (for a key function: built from its results)."""
        if self.function is not None:
            return self._arrays_of(self._call_function(batch))
        return self._column_arrays(batch)

    def key_groups(self, batch: pa.RecordBatch, max_parallelism: int) -> np.ndarray:
        return self._groups(self.key_arrays(batch), max_parallelism)

    def python_keys(self, batch: pa.RecordBatch) -> list[Any]:
        """One hashable Python key per row (a tuple for several columns)."""
        if self.function is not None:
            return self._call_function(batch)
        return _python_keys(self._column_arrays(batch))

    def keys_and_groups(self, batch: pa.RecordBatch,
                        max_parallelism: int) -> tuple[list[Any], np.ndarray]:
        """Python keys and key groups of every row, extracting the keys only once
        (a key function runs once per row)."""
        if self.function is not None:
            keys = self._call_function(batch)
            return keys, self._groups(self._arrays_of(keys), max_parallelism)
        arrays = self._column_arrays(batch)
        return _python_keys(arrays), self._groups(arrays, max_parallelism)

    def distinct_keys(self, batch: pa.RecordBatch, max_parallelism: int) -> "DistinctKeys":
        """The batch's distinct keys (in order of first appearance), their key groups,
        and for every row the index of its key: Python objects are built once per
        distinct key, never per row (a key function still runs once per row)."""
        if self.function is not None:
            index: dict[Any, int] = {}
            keys = self._call_function(batch)
            inverse = np.fromiter((index.setdefault(k, len(index)) for k in keys),
                                  dtype=np.int64, count=len(keys))
            distinct = list(index)
            arrays = self._arrays_of(distinct) if distinct else []
        else:
            arrays = self._column_arrays(batch)
            codes, dictionaries = [], []
            for array in arrays:
                encoded = array.dictionary_encode()  # dictionary in order of first appearance
                codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
                dictionaries.append(encoded.dictionary)
            if len(arrays) == 1:
                inverse, arrays = codes[0], dictionaries
            else:
                combined = np.stack(codes, axis=1)
                _, first, inverse = np.unique(combined, axis=0, return_index=True,
                                              return_inverse=True)
                order = np.argsort(first, kind="stable")  # keep first-appearance order
                rank = np.empty_like(order)
                rank[order] = np.arange(len(order))
                inverse = rank[inverse.reshape(-1)]
                arrays = [array.take(pa.array(first[order])) for array in arrays]
            distinct = _python_keys(arrays)
        groups = self._groups(arrays, max_parallelism) if distinct else np.zeros(0, np.int64)
        return DistinctKeys(arrays, distinct, groups, inverse)

    def _column_arrays(self, batch: pa.RecordBatch) -> list[pa.Array]:
        if self.columns is None:
            raise TypeError(f"{self.where}: a key function has no key columns")
        arrays = []
        for name in self.columns:
            index = batch.schema.get_field_index(name)
            if index < 0:
                first = batch.slice(0, 1).to_pylist()
                raise BadRecordError(
                    f"{self.where}: key column '{name}' is missing (columns: "
                    f"{', '.join(batch.schema.names) or 'none'}); record: "
                    f"{describe_record(first[0] if first else {})}", column=name)
            column = batch.column(index)
            if column.null_count:
                row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
                record = batch.slice(row, 1).to_pylist()[0]
                raise BadRecordError(
                    f"{self.where}: key column '{name}' is null in record "
                    f"{describe_record(record)}", column=name, record=record)
            arrays.append(_canonical_floats(column))
        return arrays

    def _arrays_of(self, keys: list[Any]) -> list[pa.Array]:
        if keys and isinstance(keys[0], tuple):
            return [pa.array([k[i] for k in keys]) for i in range(len(keys[0]))]
        try:
            return [pa.array(keys)]
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise BadRecordError(f"{self.where}: key function returned keys of mixed types: {exc}") \
                from exc

    def _groups(self, arrays: list[pa.Array], max_parallelism: int) -> np.ndarray:
        try:
            return key_groups_of_array(*arrays, max_parallelism=max_parallelism)
        except TypeError as exc:
            raise BadRecordError(f"{self.where}: {exc} (key {self})") from exc

    def _call_function(self, batch: pa.RecordBatch) -> list[Any]:
        if self.function is None:
            raise TypeError(f"{self.where}: key columns have no key function")
        keys = []
        for row in batch.to_pylist():
            try:
                key = self.function(row)
            except Exception as exc:
                raise BadRecordError(
                    f"{self.where}: key function failed on record {describe_record(row)}: "
                    f"{type(exc).__name__}: {exc}", record=row) from exc
            if key is None:
                raise BadRecordError(f"{self.where}: key function returned None for record "
                                     f"{describe_record(row)}", record=row)
            if type(key) is str and not key.isascii():  # (isascii is a flag: no scan)
                _check_utf8(key, row, self.where)
            keys.append(canonical_key(key))
        return keys

    def __repr__(self) -> str:
        if self.function is not None:
            return getattr(self.function, "__name__", "function")
        return ", ".join(self.columns or ())


def _check_utf8(key: str, row: dict, where: str) -> None:
    """A string key is hashed and stored as UTF-8: a lone surrogate (from a bad decode)
    has none."""
    try:
        key.encode()
    except UnicodeEncodeError as exc:
        raise BadRecordError(f"{where}: key function returned {key!r}, a string that is not "
                             f"valid Unicode ({exc.reason}), for record {describe_record(row)}",
                             record=row) from exc


def _python_keys(arrays: list[pa.Array]) -> list[Any]:
    columns = [_python_values(a) for a in arrays]
    return columns[0] if len(columns) == 1 else list(zip(*columns))


def _canonical_floats(column: pa.Array) -> pa.Array:
    """A float key column with -0.0 as 0.0 and every NaN the same bits (vectorized): Arrow's
    distinct values and key groups tell them apart by their bits (see ``canonical_key``)."""
    if not _is_float(column.type):
        return column
    values = column.to_numpy(zero_copy_only=False) + 0.0  # (no nulls); -0.0 + 0.0 is 0.0
    values[np.isnan(values)] = NAN_KEY
    return pa.array(values, type=column.type)


def _python_values(array: pa.Array) -> list[Any]:
    values = array.to_pylist()
    if _is_float(array.type) and np.isnan(array.to_numpy(zero_copy_only=False)).any():
        return [NAN_KEY if v != v else v for v in values]  # one NaN object: a dict finds it
    return values


def _is_float(type_: pa.DataType) -> bool:
    return pa.types.is_float32(type_) or pa.types.is_float64(type_)
