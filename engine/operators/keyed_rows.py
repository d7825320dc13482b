"""Buffered rows of the keyed operators that join two inputs (interval join, window join).

Each input's rows are kept as Arrow tables with two numpy arrays beside them: an
int64 time per row (the operator says which: an event time, a window start) and
the timer service's key id per row. Buffers are keyed state: a snapshot writes
each side's rows of a key group as one Arrow IPC stream, so they follow their
key groups to any parallelism.

    >>> import numpy as np, pyarrow as pa
    >>> buffer = RowBuffer()
    >>> buffer.append(KeyedRows(pa.table({"x": [1, 2, 3]}), np.array([5, 1, 9]), np.zeros(3, int)))
    >>> buffer.retain(lambda ts: ts > 2)
    >>> buffer.combined().table["x"].to_pylist(), buffer.min_ts
    ([1, 3], 5)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from raystream.actors.messages import MAX_WATERMARK
from raystream.actors.operator import RestoredState
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.sections import decode_parts, encode_parts
from raystream.engine.operators.keyed import KeyedOperator
from raystream.timers.disk_service import DiskTimerService


class JoinSide(enum.IntEnum):
    """Which input of a join (the operator's ``input_index``)."""

    LEFT = 0
    RIGHT = 1

    @property
    def other(self) -> "JoinSide":
        return JoinSide(1 - self)


@dataclass(frozen=True)
class KeyedRows:
    """Rows of one input: an Arrow table and, per row, a time and a key id."""

    table: pa.Table
    ts: np.ndarray
    kid: np.ndarray

    @classmethod
    def concat(cls, parts: list["KeyedRows"]) -> "KeyedRows":
        if len(parts) == 1:
            return parts[0]
        return cls(concat_tables([p.table for p in parts]),
                   np.concatenate([p.ts for p in parts]), np.concatenate([p.kid for p in parts]))

    def take(self, index: np.ndarray) -> "KeyedRows":
        return KeyedRows(self.table.take(pa.array(index, pa.int64())), self.ts[index],
                         self.kid[index])


class RowBuffer:
    """One input's buffered rows: appended chunks, combined lazily.

    Chunks are never changed in place (a cleanup replaces them), so a snapshot can
    keep the list of them as they are. Subclasses that cache something derived from
    the rows drop it in :meth:`_changed`."""

    def __init__(self) -> None:
        self.chunks: list[KeyedRows] = []
        self.min_ts: int | None = None

    def __len__(self) -> int:
        return sum(len(c.ts) for c in self.chunks)

    def _changed(self) -> None:
        """The rows changed (appended or dropped)."""

    def append(self, rows: KeyedRows) -> None:
        self.chunks.append(rows)
        self._changed()
        low = int(rows.ts.min())
        self.min_ts = low if self.min_ts is None else min(self.min_ts, low)

    def combined(self) -> KeyedRows | None:
        if not self.chunks:
            return None
        if len(self.chunks) > 1:
            self.chunks = [KeyedRows.concat(self.chunks)]
        return self.chunks[0]

    def retain(self, keep: Callable[[np.ndarray], np.ndarray]) -> None:
        """Keep the rows where ``keep(ts)`` is true."""
        rows = self.combined()
        if rows is not None:
            self.keep_rows(keep(rows.ts))

    def keep_rows(self, mask: np.ndarray) -> None:
        """Keep the rows of :meth:`combined` where ``mask`` is true."""
        rows = self.combined()
        if rows is None or mask.all():
            return
        self._changed()
        if not mask.any():
            self.chunks, self.min_ts = [], None
            return
        kept = rows.take(np.flatnonzero(mask))
        self.chunks, self.min_ts = [kept], int(kept.ts.min())


class BufferedJoinOperator(KeyedOperator):
    """A keyed operator over two inputs that buffers each input's rows (``self.buffers``,
    one :class:`RowBuffer` per :class:`JoinSide`) as keyed state: snapshotted per key
    group in part ``"join"`` (``STATE_VERSION`` first), restored through
    :meth:`restore_side`. Counts the rows it drops as late per side.

    On the disk state backend a subclass may keep the rows in RocksDB instead
    (``self.disk_rows``, from :meth:`disk_rows_over`), carried by that backend's
    snapshots; a heap job restoring them reads them back through a scratch database
    (the store's ``export``)."""

    STATE_VERSION = b"\x01"  # first byte of a key group's "join" part
    buffer_type: type[RowBuffer] = RowBuffer
    label = "join"  # what error messages call the operator

    def __init__(self, name: str, keys) -> None:
        super().__init__(name, keys)
        self.buffers = (self.buffer_type(), self.buffer_type())
        self.late_dropped = [0, 0]
        self.disk_rows: Any = None

    def initialize_state(self, restored: RestoredState | None) -> None:
        self.buffers = (self.buffer_type(), self.buffer_type())
        self.disk_rows = None
        super().initialize_state(restored)  # a heap snapshot's buffers may move to disk rows
        self._disk_rows()

    def disk_rows_over(self, backend: DiskKeyedStateBackend, timers: DiskTimerService) -> Any:
        """The rows this operator keeps in ``backend`` (its disk layout's store)."""
        raise NotImplementedError

    def _disk_rows(self) -> Any:
        """The rows in the disk backend (None: on the heap), once its state is restored."""
        if self.disk_rows is None and isinstance(self.backend, DiskKeyedStateBackend):
            self.disk_rows = self.disk_rows_over(self.backend, self.disk_timers)
        return self.disk_rows

    def release_key_ids(self) -> bool:
        """On disk the rows are in RocksDB under their encoded keys and no key id outlives
        a batch or a firing, so the timer service empties a full key table here."""
        return self.disk_rows is not None and self.disk_timers.release_keys()

    def metrics(self) -> dict[str, float]:
        left, right = self.late_dropped
        return {**super().metrics(), "late_records_dropped": left + right, "late_left_dropped": left,
                "late_right_dropped": right,
                "buffered_left": sum(len(c.ts) for c in list(self.buffers[0].chunks)),
                "buffered_right": sum(len(c.ts) for c in list(self.buffers[1].chunks))}

    def snapshot_table(self, table: pa.Table, ts: np.ndarray) -> pa.Table:
        """What a snapshot keeps of buffered rows ``table`` with their ``ts`` (default: the
        rows as they came)."""
        return table

    def restore_side(self, side: JoinSide, table: pa.Table) -> None:
        """Buffer again the rows :meth:`snapshot_table` kept of ``side``."""
        raise NotImplementedError

    def keyed_snapshot_parts(self):
        parts = super().keyed_snapshot_parts()
        if self.disk_rows is not None:  # the disk backend's snapshot carries them
            return parts
        # synchronous part: the chunk lists as they are (tables and arrays are immutable)
        chunks = {side.name.lower(): list(buffer.chunks)
                  for side, buffer in zip(JoinSide, self.buffers)}
        key_groups_of = self.timers.key_groups_of
        parts["join"] = lambda: side_sections(
            chunks, key_groups_of, self.STATE_VERSION,
            lambda rows: self.snapshot_table(rows.table, rows.ts))
        return parts

    def restore_keyed_parts(self, parts: dict[str, list[tuple[int, bytes]]]) -> None:
        restored = parts.pop("join", [])
        super().restore_keyed_parts(parts)
        tables = read_side_sections(restored, self.STATE_VERSION,
                                    where=f"operator '{self.name}'")
        for side_name, table in tables.items():
            self.restore_side(JoinSide[side_name.upper()], table)
        moved = self.moved_disk_state
        if moved is not None:  # a disk savepoint's rows, for this heap job
            # the heap path fires by its buffers' times, with no timers: a disk layout's
            # timers (the session join's, at each session's end) are dropped
            self.timers.advance_watermark(MAX_WATERMARK)
            for side, table, ts in self.disk_rows_over(moved.backend, moved.timers).export():
                self.restore_side(side, self.snapshot_table(table, ts))


def side_sections(sides: dict[str, list[KeyedRows]], key_groups_of: Callable[[np.ndarray], np.ndarray],
                  version: bytes,
                  table_of: Callable[[KeyedRows], pa.Table] = lambda rows: rows.table,
                  ) -> dict[int, bytes]:
    """Snapshot sections by key group: per group, ``version`` then one Arrow IPC stream
    per side name (``table_of(rows)``: what of a side's rows to keep)."""
    by_group: dict[int, dict[str, bytes]] = {}
    for name, chunks in sides.items():
        if not chunks:
            continue
        rows = KeyedRows.concat(chunks)
        table = table_of(rows)
        groups = key_groups_of(rows.kid)
        order = np.argsort(groups, kind="stable")  # partition by key group
        distinct, starts = np.unique(groups[order], return_index=True)
        ends = np.append(starts[1:], len(order))
        for group, start, end in zip(distinct.tolist(), starts.tolist(), ends.tolist()):
            by_group.setdefault(group, {})[name] = ipc_bytes(
                table.take(pa.array(order[start:end])))
    return {g: version + encode_parts(named) for g, named in by_group.items()}


def read_side_sections(sections: list[tuple[int, bytes]], version: bytes,
                       where: str) -> dict[str, pa.Table]:
    """The tables :func:`side_sections` wrote, per side name, over all ``sections``."""
    tables: dict[str, list[pa.Table]] = {}
    for group, data in sections:
        if data[:1] != version:
            raise ValueError(f"{where}: key group {group} holds buffered rows of unknown state "
                             f"version {data[:1]!r} (this raystream writes {version!r})")
        for name, blob in decode_parts(data[1:]).items():
            tables.setdefault(name, []).append(pa.ipc.open_stream(blob).read_all())
    return {name: concat_tables(parts).combine_chunks() for name, parts in tables.items()}


def joined_names(left: list[str], right: list[str], right_suffix: str, *, where: str,
                 reserved: tuple[str, ...] = ()) -> list[str]:
    """Column names of joined rows: ``left``, then ``right`` with ``right_suffix`` on a
    name that a left column (or a ``reserved`` column the caller adds) has.

        >>> joined_names(["k", "x"], ["k", "y"], "_right", where="example")
        ['k', 'x', 'k_right', 'y']
    """
    names = list(left)
    taken = {*names, *reserved}
    for name in right:
        renamed = name + right_suffix if name in taken else name
        if renamed in taken:
            raise ValueError(f"{where}: right column {name!r} clashes with column {renamed!r} "
                             f"even with suffix {right_suffix!r}; choose another right_suffix")
        names.append(renamed)
        taken.add(renamed)
    return names


def ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    """Concatenate, unifying schemas that differ only by types Arrow can promote
    (a column all null in one batch, for example)."""
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")
