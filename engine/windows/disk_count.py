"""Count windows' per-key state in the disk state backend's RocksDB (large count-window state).

With ``CheckpointConfig(state_backend="disk")`` the count window operator
(:mod:`raystream.engine.windows.count`) keeps each key's record count and
pending rows in the operator instance's RocksDB instead of a dict of Arrow
tables. Each key is one entry, in the backend's own layout for keyed state::

    key group (uint16) | state id (uint16) | len(key) (uint32) | key

with the key encoded as the disk backend encodes keys. The value is the key's
record count (int64, little-endian) followed by its pending rows, oldest
first, as fixed-width little-endian numpy records: one field per aggregate
input column (the built-in aggregates read numeric columns only) and one
validity byte per column (nulls survive); windows of ``count`` alone store a
one-byte record, so a value's length always tells its number of rows. A key
with nothing pending is its 8 count bytes. The record's fields are in the
state's kind (``"count-windows [[column, dtype], ...]"``), which the backend's
section directory and incremental-checkpoint manifest carry, so a restored job
decodes its keys' rows before any record arrives. Not MessagePack, never
pickle: a batch's values decode with one ``np.frombuffer`` over their joined
bytes, and encode with one ``tobytes``.

A batch reads its distinct keys' values with one multi-get and writes them
back with one write batch; Python runs per distinct key (its entry key and
value bytes), never per record. The entries share the backend's key-group
prefix, so its full and incremental snapshots, restores and rescaling carry
them like any keyed state.

    >>> import numpy as np, pyarrow as pa
    >>> from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> state = DiskCountState(backend, where="count window 'c'")
    >>> rows = state.conform(pa.table({"x": [1.5, None]}))  # declares the state's record
    >>> keys = state.entry_keys(["a", "b"], np.array([1, 2]))
    >>> state.write(keys, np.array([3, 4]), rows, np.array([0, 2, 2]))
    >>> stored = state.read(keys)
    >>> stored.counts.tolist(), stored.lengths.tolist(), stored.rows.to_pydict()
    ([3, 4], [2, 0], {'x': [1.5, None]})
    >>> backend.close()
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raystream.checkpoint.disk_layout import KEYED_PREFIX
from raystream.checkpoint.disk_layout import record_fields, record_kind
from raystream.checkpoint.disk_state import DiskKeyedStateBackend

STATE_NAME = "__count_windows"
KIND = "count-windows"
_COUNT = struct.Struct("<q")
_VALID = "__valid"  # the record's last field: one validity byte per column
_ROW = "__row"  # the record of windows without input columns: one byte, a row


@dataclass(frozen=True)
class Stored:
    """What :meth:`DiskCountState.read` found for a batch's keys."""

    counts: np.ndarray  # each key's records so far (0 for a new key)
    lengths: np.ndarray  # each key's number of pending rows
    rows: pa.Table  # all their pending rows, key by key, oldest first


class DiskCountState:
    """The count windows' per-key state of one operator instance, in its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, *, where: str) -> None:
        self._backend = backend
        self._where = where
        self.schema: pa.Schema | None = None  # the stored columns, once known
        self._record = np.dtype([(_ROW, "u1")])
        self._sid = b""
        kind = backend.state_kind(STATE_NAME)
        if kind is not None:  # restored: the record comes with the state
            self._use(record_fields(KIND, kind))

    def _use(self, columns: list[tuple[str, np.dtype]]) -> None:
        fields: list[Any] = ([*columns, (_VALID, "u1", (len(columns),))] if columns
                             else [(_ROW, "u1")])
        self._record = np.dtype(fields)
        self.schema = pa.schema([(name, pa.from_numpy_dtype(dtype)) for name, dtype in columns])
        self._sid = self._backend.raw_state_id(STATE_NAME, record_kind(KIND, columns))

    def conform(self, rows: pa.Table) -> pa.Table:
        """``rows`` (the aggregate input columns) in the stored column types; the first
        rows of a state that has none yet fix them."""
        if self.schema is None:
            columns = []
            for field in rows.schema:
                if not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
                    raise TypeError(
                        f"{self._where}: column '{field.name}' is {field.type}; the disk state "
                        f"backend keeps the pending rows of count windows of numeric columns "
                        f"only; run this job with CheckpointConfig(state_backend='heap')")
                columns.append((field.name, np.dtype(field.type.to_pandas_dtype())
                                .newbyteorder("<")))
            self._use(columns)
        schema = self.schema
        assert schema is not None
        if rows.schema.names != schema.names:
            raise ValueError(f"{self._where}: the stored pending rows have columns "
                             f"{schema.names}, these rows {rows.schema.names}")
        if rows.schema.equals(schema):
            return rows
        try:
            return pa.table([pc.cast(rows[f.name], f.type)  # pyright: ignore[reportAttributeAccessIssue]
                             for f in schema], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise TypeError(f"{self._where}: rows of types {rows.schema.types} do not fit the "
                            f"stored pending rows' types {schema.types}: {e}") from e

    def entry_keys(self, keys: list[Any], groups: np.ndarray) -> list[bytes]:
        """The stored keys of ``keys`` in key groups ``groups`` (encoded once per batch),
        once the state is declared (:meth:`conform`)."""
        if self.schema is None:
            raise RuntimeError(f"{self._where}: count-window state keys before its columns")
        return self._backend.entry_keys(self._sid, keys, groups)

    def read(self, keys: list[bytes]) -> Stored:
        """The stored counts and pending rows of ``keys``: one multi-get."""
        raws = list(self._backend.raw_db[keys]) if keys else []  # a list of keys: a multi-get
        head = _COUNT.size
        heads = b"".join([_COUNT.pack(0) if r is None else r[:head] for r in raws])
        sizes = np.array([0 if r is None else len(r) - head for r in raws], dtype=np.int64)
        width = self._record.itemsize
        if np.any(sizes % width):
            raise ValueError(f"{self._where}: a stored key's pending rows are not whole "
                             f"records of {width} bytes (state written by another version?)")
        data = b"".join([memoryview(r)[head:] for r in raws if r is not None])
        return Stored(np.frombuffer(heads, dtype="<i8").astype(np.int64), sizes // width,
                      self._table(np.frombuffer(data, dtype=self._record)))

    def _table(self, records: np.ndarray) -> pa.Table:
        schema = self.schema
        if schema is None:  # no state yet: nothing is pending
            return pa.table({})
        arrays = []
        for i, field in enumerate(schema):
            valid = records[_VALID][:, i].astype(bool)
            values = np.ascontiguousarray(records[field.name])
            arrays.append(pa.array(values, type=field.type,
                                   mask=None if valid.all() else ~valid))
        return pa.table(arrays, schema=schema)

    def write(self, keys: list[bytes], counts: np.ndarray, rows: pa.Table,
              edges: np.ndarray) -> None:
        """Store each key's count and its pending rows ``rows[edges[i]:edges[i + 1]]``
        (``rows`` in the stored columns): one write batch."""
        import rocksdict

        record = self._record
        records = np.ones(rows.num_rows, dtype=record)  # a count alone: a byte of 1 a row
        for i, name in enumerate(rows.column_names):
            column = rows[name]
            records[name] = column.fill_null(0).to_numpy()
            records[_VALID][:, i] = (1 if column.null_count == 0
                                     else column.is_valid().to_numpy(zero_copy_only=False))
        data, width = records.tobytes(), record.itemsize
        heads = counts.astype("<i8").tobytes()
        batch = rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        for i, (key, a, b) in enumerate(zip(keys, edges[:-1].tolist(), edges[1:].tolist())):
            put(key, heads[8 * i:8 * i + 8] + data[a * width:b * width])
        self._backend.raw_db.write(batch)

    def export(self) -> Iterator[tuple[int, list[Any], Stored]]:
        """Each key group's keys with their counts and pending rows (a disk savepoint
        restored into a heap job): one range scan per key group, one ``frombuffer`` over
        its values."""
        kind = self._backend.state_kind(STATE_NAME)
        if kind is None:  # no count-window state was ever written
            return
        head, width = _COUNT.size, self._record.itemsize
        decode = DiskKeyedStateBackend.decode_key
        for group, entries in self._backend.raw_state_entries(STATE_NAME, kind):
            sizes = np.array([len(v) - head for _, v in entries], dtype=np.int64)
            if np.any(sizes % width):
                raise ValueError(f"{self._where}: a stored key's pending rows are not whole "
                                 f"records of {width} bytes (state written by another version?)")
            counts = np.frombuffer(b"".join([v[:head] for _, v in entries]), dtype="<i8")
            records = np.frombuffer(b"".join([v[head:] for _, v in entries]), dtype=self._record)
            yield group, [decode(k[KEYED_PREFIX.size:]) for k, _ in entries], Stored(
                counts.astype(np.int64), sizes // width, self._table(records))

    def restore_heap(self, group: int, entries: list[tuple[Any, int, pa.Table]]) -> None:
        """Move a heap checkpoint's key group of count-window state (key, count, pending
        rows in the aggregate input columns) into RocksDB."""
        if not entries:
            return
        tables = [self.conform(table) for _, _, table in entries]
        lengths = np.array([t.num_rows for t in tables], dtype=np.int64)
        keys = self.entry_keys([key for key, _, _ in entries], np.full(len(entries), group))
        self.write(keys, np.array([count for _, count, _ in entries], dtype=np.int64),
                   pa.concat_tables(tables), np.concatenate([[0], np.cumsum(lengths)]))
