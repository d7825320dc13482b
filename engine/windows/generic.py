"""The generic window stores: a user ``AggregateFunction`` or a full-window
``ProcessWindowFunction``, one accumulator per (key, window). Python runs per (key,
window) of a batch, and per row only inside a user function.

* :class:`HeapGenericWindows`: accumulators in a dict by (key id, window start), and a
  key's open sessions for session windows;
* :class:`DiskGenericWindows`: tumbling and sliding windows in the disk backend
  (:mod:`raystream.engine.windows.disk_entries`: one entry per (key, window) holding its
  accumulator, a batch merges with one multi-get and one write batch; a
  ``ProcessWindowFunction``'s rows appended as one chunk per batch, never rewritten);
* :class:`DiskGenericSessionWindows`: session windows in the disk backend
  (:mod:`raystream.engine.windows.disk_generic_sessions`: a header per key holding its
  open sessions and their accumulators, a ``ProcessWindowFunction``'s rows in chunks
  beside it); loaded for a batch or a firing with one multi-get, merged or fired by the
  heap store's own code, written back with one write batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from raystream.engine.windows.disk_entries import DiskChunks, DiskEntries
from raystream.engine.windows.disk_generic_sessions import DiskGenericSessions
from raystream.engine.windows.sessions import Windows, session_breaks
from raystream.engine.windows.store import (Assigned, DueTimers, WindowHost, WindowSection,
                                            no_sections, rows_of)

@dataclass(frozen=True)
class Accumulated:
    """A batch's assignments grouped by (key, window), one accumulator per group: group
    ``i`` is window ``[starts[i], ends[i])`` of key id ``kids[i]``, of ``sizes[i]`` rows,
    the first of them (in the batch's order) at ``first_times[i]`` when the assignments
    carry times."""

    kids: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    accumulators: list[Any]
    sizes: np.ndarray
    first_times: np.ndarray | None


def accumulate(host: WindowHost, batch: pa.RecordBatch, assigned: Assigned) -> Accumulated:
    """The batch's assignments grouped by (key, window) (for session windows: by key, the
    rows within a gap of each other), one accumulator per group."""
    kids, starts, ends = assigned.kids, assigned.starts, assigned.ends
    if host.assigner.merging:  # sorted by (key, time), split where sessions do not meet
        order = np.lexsort((starts, kids))
        kids, starts, ends = kids[order], starts[order], ends[order]
        breaks = np.flatnonzero(session_breaks(kids, starts, ends)[1:])
    else:  # lexsort is stable: a group's rows keep the batch's order
        order = np.lexsort((kids, starts))
        kids, starts, ends = kids[order], starts[order], ends[order]
        breaks = np.flatnonzero((np.diff(kids) != 0) | (np.diff(starts) != 0))
    offsets = np.concatenate([[0], breaks + 1, [len(order)]])
    firsts = offsets[:-1]
    group_starts = np.minimum.reduceat(starts, firsts) if len(order) else starts
    group_ends = np.maximum.reduceat(ends, firsts) if len(order) else ends
    table = pa.Table.from_batches([batch])
    sorted_rows = rows_of(table, table.column_names, assigned.rows[order])
    times = assigned.times
    return Accumulated(kids[firsts], group_starts, group_ends,
                       host.function.accumulate(sorted_rows, offsets), np.diff(offsets),
                       None if times is None else times[order][firsts])


class _SessionTimers:
    """The timer changes of one batch's session merges, netted: a session registered and
    merged away within the batch never reaches the timer heap (one bulk registration per
    batch instead of a heap call per session)."""

    __slots__ = ("registered", "deleted")

    def __init__(self) -> None:
        self.registered: dict[tuple[int, int], int] = {}  # (key id, start) -> end
        self.deleted: list[tuple[int, int, int]] = []  # (key id, start, end) on the heap

    def register(self, kid: int, start: int, end: int) -> None:
        self.registered[(kid, start)] = end

    def delete(self, kid: int, start: int, end: int) -> None:
        if self.registered.pop((kid, start), None) is None:
            self.deleted.append((kid, start, end))

    def apply(self, host: WindowHost) -> None:
        """Deletions first (a session that kept its start may keep its end too), then
        every registration in one vectorized call."""
        for kid, start, end in self.deleted:
            host.delete_timers(kid, start, end)
        if self.registered:
            (kids, starts), ends = zip(*self.registered), self.registered.values()
            host.register_timers(np.fromiter(kids, np.int64, len(kids)),
                                 np.fromiter(starts, np.int64, len(starts)),
                                 np.fromiter(ends, np.int64, len(kids)))


class HeapGenericWindows:
    """User-function windows on the heap."""

    def __init__(self, host: WindowHost) -> None:
        self.host = host
        self.entries: dict[tuple[int, int], list] = {}  # (key id, start) -> [end, accumulator]
        self.sessions: dict[int, list[int]] = {}  # key id -> starts of its open sessions

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        host = self.host
        assigned = host.judge_late(batch, assigned, held=self._windows_of)
        if not len(assigned):
            return
        groups = accumulate(host, batch, assigned)
        kids, starts, ends = groups.kids, groups.starts, groups.ends
        merging = host.assigner.merging
        touched: dict[tuple[int, int], int] = {}  # (key id, start) -> its watermark
        # the watermark judging each (key, window): computed once for the batch
        watermarks = np.broadcast_to(host.watermarks_of_key_ids(kids), kids.shape)
        session_timers = _SessionTimers()
        merge = host.function.merge
        for kid, start, end, acc, watermark in zip(kids.tolist(), starts.tolist(),
                                                   ends.tolist(), groups.accumulators,
                                                   watermarks.tolist()):
            if merging:
                start, end = self._merge_session(kid, start, end, acc, session_timers)
            else:
                entry = self.entries.get((kid, start))
                if entry is None:
                    self.entries[(kid, start)] = [end, acc]
                    host.register_timers(np.array([kid]), np.array([start]), np.array([end]))
                else:
                    entry[1] = merge(entry[1], acc)
            touched[(kid, start)] = watermark
        if merging:
            session_timers.apply(host)
        # late but within the allowed lateness: fire again, once per batch, judged by the
        # window's end once the batch is merged (a later session merge may extend it)
        entries = self.entries
        fire_now = [window for window, watermark in touched.items() if host.event_time
                    and window in entries and entries[window][0] - 1 <= watermark]
        if fire_now:
            self._emit([(kid, start, *entries[(kid, start)]) for kid, start in fire_now])

    def fire(self, due: DueTimers) -> None:
        """Firing timers emit their windows, cleanup ones (the firing ones, without
        lateness) drop them."""
        timestamps, kids, starts = due.timestamps, due.kids, due.starts
        entries = self.entries
        ends = np.array([entries.get((k, s), [0])[0]
                         for k, s in zip(kids.tolist(), starts.tolist())], dtype=np.int64)
        fire = timestamps == ends - 1
        cleanup = timestamps == ends - 1 + self.host.lateness
        fired = [(k, s, *entries[(k, s)])
                 for k, s in zip(kids[fire].tolist(), starts[fire].tolist())
                 if (k, s) in entries]
        if fired:
            self._emit(fired)
        for k, s in zip(kids[cleanup].tolist(), starts[cleanup].tolist()):
            self._clear(k, s)

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        freeze, timers = self.host.function.frozen, self.host.timers
        # synchronous: frozen accumulators
        frozen = [(kid, start, end, freeze(acc))
                  for (kid, start), (end, acc) in self.entries.items()]

        def sections() -> dict[int, WindowSection]:
            by_group: dict[int, WindowSection] = {}
            for kid, start, end, acc in frozen:
                group = timers.key_group(kid)
                by_group.setdefault(group, WindowSection()).generic.append(
                    (timers.key(kid), start, end, acc))
            return by_group
        return sections

    def restore(self, group: int, section: WindowSection) -> None:
        section.only("generic", where=f"window '{self.host.name}'")
        host = self.host
        thawed, merging = host.function.thawed, host.assigner.merging
        for key, start, end, acc in section.generic:
            kid = host.timers.key_id(key, group)
            self.entries[(kid, start)] = [end, thawed(acc)]
            if merging:
                self.sessions.setdefault(kid, []).append(start)

    def restored(self) -> None:
        pass

    def _windows_of(self, keys: np.ndarray) -> Windows:
        """The open sessions of the key ids ``keys``."""
        found = np.array([(kid, start, self.entries[(kid, start)][0]) for kid in keys.tolist()
                          for start in self.sessions.get(kid, ())], dtype=np.int64).reshape(-1, 3)
        return Windows(found[:, 0], found[:, 1], found[:, 2])

    def _merge_session(self, kid: int, start: int, end: int, acc: Any,
                       timers: _SessionTimers) -> tuple[int, int]:
        """Merge session ``[start, end)`` of key ``kid`` with the sessions it touches
        (Flink: windows intersect when ``start <= other.end and end >= other.start``); the
        timer changes go to ``timers``, applied once for the batch."""
        starts = self.sessions.setdefault(kid, [])
        merge = self.host.function.merge
        for other in [s for s in starts if s <= end and self.entries[(kid, s)][0] >= start]:
            other_end, other_acc = self.entries.pop((kid, other))
            starts.remove(other)
            timers.delete(kid, other, other_end)
            acc = merge(other_acc, acc)
            start, end = min(start, other), max(end, other_end)
        starts.append(start)
        self.entries[(kid, start)] = [end, acc]
        timers.register(kid, start, end)
        return start, end

    def _emit(self, fired: list[tuple[int, int, int, Any]]) -> None:
        self.host.emit_windows(fired)

    def _clear(self, kid: int, start: int) -> None:
        if self.entries.pop((kid, start), None) is not None and self.host.assigner.merging:
            self.sessions[kid].remove(start)
            if not self.sessions[kid]:
                del self.sessions[kid]


class DiskGenericSessionWindows(HeapGenericWindows):
    """User-function session windows in the disk backend: the keys of a batch or a
    firing loaded into the heap store's dicts for the call, and written back after it."""

    def __init__(self, host: WindowHost, disk: DiskGenericSessions) -> None:
        super().__init__(host)
        self.disk = disk

    def _loaded(self, kids: np.ndarray) -> contextlib.AbstractContextManager[None]:
        return self.disk.loaded(np.unique(kids), self.entries, self.sessions)

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        with self._loaded(assigned.kids):  # their open sessions judge late rows
            super().add(batch, assigned)

    def fire(self, due: DueTimers) -> None:
        with self._loaded(due.kids):
            super().fire(due)

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        return no_sections

    def restored(self) -> None:
        """A heap checkpoint's sessions (restored into the dicts) into RocksDB."""
        self.disk.move_in(self.entries, self.sessions)

    def export(self) -> Iterator[tuple[int, WindowSection]]:
        """Every key group's open sessions as the heap store's sections (a disk savepoint
        restored into a heap job, through a scratch database)."""
        yield from _generic_sections(self.host, self.disk.export())

    def _emit(self, fired: list[tuple[int, int, int, Any]]) -> None:
        self.disk.read_ahead([acc for *_, acc in fired])  # their stored rows: one multi-get
        super()._emit(fired)


class DiskGenericWindows:
    """User-function tumbling and sliding windows in the disk backend (``disk``: a
    ``ProcessWindowFunction``'s rows as :class:`DiskChunks`, appended)."""

    def __init__(self, host: WindowHost, disk: DiskEntries) -> None:
        self.host, self.disk = host, disk

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        """Merge a batch's (key, window) accumulators into RocksDB (one multi-get, one
        write batch); a ``ProcessWindowFunction``'s rows are appended, the stored ones not
        read."""
        host, disk = self.host, self.disk
        assigned = host.judge_late(batch, assigned)
        if not len(assigned):
            return
        groups = accumulate(host, batch, assigned)
        kids, starts, ends, accumulators = (groups.kids, groups.starts, groups.ends,
                                            groups.accumulators)
        keys = disk.entry_keys(kids, ends)
        merged: list[Any] | None = None
        if isinstance(disk, DiskChunks):
            new = disk.append(keys, starts, accumulators)
        else:
            stored = disk.get(keys)
            merge = host.function.merge
            merged = [acc if old is None else merge(old[1], acc)
                      for old, acc in zip(stored, accumulators)]
            disk.put(keys, starts, merged)
            new = np.fromiter((old is None for old in stored), dtype=bool, count=len(stored))
        if new.any():
            host.register_timers(kids[new], starts[new], ends[new])
        if not host.event_time:
            return
        # late but within the allowed lateness: fire again, once per batch
        watermarks = np.broadcast_to(host.watermarks_of_key_ids(kids), kids.shape)
        due = np.flatnonzero(ends - 1 <= watermarks).tolist()
        if not due:
            return
        # appended rows: the due windows' chunks read back whole (late windows are few)
        entries = ([(0, merged[i]) for i in due] if merged is not None
                   else disk.get([keys[i] for i in due]))
        host.emit_windows([(int(kids[i]), int(starts[i]), int(ends[i]), entry[1])
                           for i, entry in zip(due, entries) if entry is not None])

    def fire(self, due: DueTimers) -> None:
        """The firing windows read with one multi-get (a ``ProcessWindowFunction``'s: its
        markers, then its chunks) and emitted, the cleanup ones deleted with one write
        batch (without allowed lateness every firing is its window's cleanup: read and
        deleted at once)."""
        timestamps, kids, starts = due.timestamps, due.kids, due.starts
        host, disk = self.host, self.disk
        ends = host.window_ends(starts)
        fire = timestamps == ends - 1
        keys = disk.entry_keys(kids[fire], ends[fire])
        entries = disk.take(keys) if host.lateness == 0 else disk.get(keys)
        fired = [(kid, start, end, entry[1]) for kid, start, end, entry in zip(
            kids[fire].tolist(), starts[fire].tolist(), ends[fire].tolist(), entries)
            if entry is not None]
        if fired:
            host.emit_windows(fired)
        if host.lateness:
            cleanup = timestamps == ends - 1 + host.lateness
            disk.delete(disk.entry_keys(kids[cleanup], ends[cleanup]))

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        return no_sections

    def export(self) -> Iterator[tuple[int, WindowSection]]:
        """Every key group's windows as the heap store's sections (a disk savepoint
        restored into a heap job, through a scratch database)."""
        yield from _generic_sections(self.host, self.disk.export())

    def restore(self, group: int, section: WindowSection) -> None:
        """A heap checkpoint's (key, window) accumulators into RocksDB (a
        ``ProcessWindowFunction``'s rows as one chunk per window; their timers are
        restored already)."""
        section.only("generic", where=f"window '{self.host.name}'")
        entries = section.generic
        if not entries:
            return
        disk, thawed = self.disk, self.host.function.thawed
        kids = self.host.timers.key_ids([e[0] for e in entries], np.full(len(entries), group))
        disk.put(disk.entry_keys(kids, np.array([e[2] for e in entries], dtype=np.int64)),
                 np.array([e[1] for e in entries], dtype=np.int64),
                 [thawed(e[3]) for e in entries])

    def restored(self) -> None:
        pass


def _generic_sections(host: WindowHost, windows: Iterator[tuple[int, list[tuple[Any, int, int,
                                                                               Any]]]]
                      ) -> Iterator[tuple[int, WindowSection]]:
    """The heap store's sections of a disk store's exported ``(key, start, end,
    accumulator)`` windows, key group by key group (accumulators frozen, as a heap
    snapshot keeps them)."""
    freeze = host.function.frozen
    for group, found in windows:
        yield group, WindowSection(generic=[(key, start, end, freeze(acc))
                                            for key, start, end, acc in found])
