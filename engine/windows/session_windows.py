"""The session window stores of built-in aggregates: every open session's key id, start,
end and partials in flat arrays (:class:`~raystream.engine.windows.sessions.SessionStore`),
merged with a batch by sorting: no Python per session or row.

* :class:`HeapSessionWindows`: one store for the operator instance;
* :class:`DiskSessionWindows`: one RocksDB entry per key holding its open sessions
  (:mod:`raystream.engine.windows.disk_sessions`); a batch and a firing read their keys
  with one multi-get into a store of those keys, and write them back with one write
  batch.

A session row is late only when the session it would merge into is (judged by its key's
open sessions, :func:`~raystream.engine.windows.sessions.late_for_sessions`); a late
session (within the allowed lateness) that took in rows fires again at once. A session
keeps the timers of its old ends: a timer whose session is gone, or has another end now,
is a stale one and does nothing.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.disk_sessions import DiskSessions
from raystream.engine.windows.sessions import Merged, SessionStore, session_breaks
from raystream.engine.windows.store import (Assigned, DueTimers, SessionRows, WindowHost,
                                            WindowSection, by_key_group, no_sections, rows_of)

_Sessions = tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]


def _sessions_of(spec: AggregateSpec, batch: pa.RecordBatch, assigned: Assigned) -> _Sessions:
    """The batch's rows as sessions ``[ts, ts + gap)``, grouped where they intersect:
    (key ids, starts, ends, partials) of the groups."""
    kids, starts, ends = assigned.kids, assigned.starts, assigned.ends
    order = np.lexsort((starts, kids))
    kids, starts, ends = kids[order], starts[order], ends[order]
    breaks = session_breaks(kids, starts, ends)
    firsts = np.flatnonzero(breaks)
    group = np.cumsum(breaks) - 1
    columns = rows_of(pa.Table.from_batches([batch]), spec.input_columns,
                      assigned.rows[order]).append_column("__group", pa.array(group))
    partials = spec.partials_of_rows(columns, ["__group"])
    by_group = np.argsort(partials["__group"].to_numpy())
    return (kids[firsts], starts[firsts], np.maximum.reduceat(ends, firsts),
            {name: partials[name].to_numpy()[by_group] for name in spec.partial_columns})


def _merged(host: WindowHost, store: SessionStore, merged: Merged) -> None:
    """Timers for the sessions that changed; a late session that took in rows fires
    again at once."""
    changed, received = merged.changed, merged.received
    host.register_timers(store.kids[changed], store.starts[changed], store.ends[changed])
    due = store.ends[received] - 1 <= host.watermarks_of_key_ids(store.kids[received])
    _emit(host, store, received[due])


def _emit(host: WindowHost, store: SessionStore, indices: np.ndarray) -> None:
    host.emit_results(store.kids[indices], store.starts[indices], store.ends[indices],
                      store.results(indices))


def _fire(host: WindowHost, store: SessionStore, timestamps: np.ndarray, kids: np.ndarray,
          starts: np.ndarray) -> None:
    """Due timers of ``store``'s sessions: fire at ``end - 1``, drop at ``end - 1 +
    lateness``; a timer of a session that is gone or has another end is stale."""
    found = store.find(kids, starts)
    timestamps, found = timestamps[found >= 0], found[found >= 0]
    ends = store.ends[found]
    _emit(host, store, found[timestamps == ends - 1])
    store.remove(np.unique(found[timestamps == ends - 1 + host.lateness]))


def _restored(host: WindowHost, spec: AggregateSpec, group: int,
              section: WindowSection) -> _Sessions | None:
    """Key group ``group``'s sessions in a checkpoint section, by key id."""
    section.only("sessions", "generic", where=f"window '{host.name}'")
    rows = section.session_rows(spec.partial_columns)
    if rows is None:
        return None
    kids = host.timers.key_ids(rows.keys, np.full(len(rows.keys), group))
    return kids, rows.starts, rows.ends, rows.partials


def _sessions_per_key(distinct: np.ndarray, kids: np.ndarray) -> np.ndarray:
    """How many of the sessions of key ids ``kids`` each of the sorted ``distinct`` key
    ids holds."""
    return np.bincount(np.searchsorted(distinct, kids), minlength=len(distinct))


class HeapSessionWindows:
    """Session windows of built-in aggregates on the heap: one columnar store."""

    def __init__(self, host: WindowHost, spec: AggregateSpec) -> None:
        self.host, self.spec = host, spec
        self.store = SessionStore(spec)

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        store = self.store
        assigned = self.host.judge_late(batch, assigned, held=store.windows_of)
        if len(assigned):
            _merged(self.host, store, store.add(*_sessions_of(self.spec, batch, assigned)))

    def fire(self, due: DueTimers) -> None:
        _fire(self.host, self.store, due.timestamps, due.kids, due.starts)

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        store, timers = self.store, self.host.timers  # arrays are replaced, never changed
        kids, starts, ends, partials = store.kids, store.starts, store.ends, store.partials

        def sections() -> dict[int, WindowSection]:
            if not len(kids):
                return {}
            return {group: WindowSection(sessions=SessionRows(keys, starts_, ends_, partials_))
                    for group, keys, (starts_, ends_), partials_ in by_key_group(
                        timers, kids, starts, ends, columns=partials)}
        return sections

    def restore(self, group: int, section: WindowSection) -> None:
        restored = _restored(self.host, self.spec, group, section)
        if restored is not None:
            self.store.extend(*restored)

    def restored(self) -> None:
        pass


class DiskSessionWindows:
    """Session windows of built-in aggregates in the disk backend: a store of a batch's
    (or a firing's) keys' sessions, read once and written back."""

    def __init__(self, host: WindowHost, spec: AggregateSpec, disk: DiskSessions) -> None:
        self.host, self.spec, self.disk = host, spec, disk

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        disk = self.disk
        loaded = disk.load(assigned.kids)
        store = loaded.store
        assigned = self.host.judge_late(batch, assigned, held=store.windows_of)
        if len(assigned):
            _merged(self.host, store,
                    disk.merge(loaded, *_sessions_of(self.spec, batch, assigned)))

    def fire(self, due: DueTimers) -> None:
        """The due keys' sessions: read, fired, and written back where a session went past
        its lateness (firing changes no session; a pop holds many keys, most merely
        fired)."""
        timestamps, kids, starts = due.timestamps, due.kids, due.starts
        disk = self.disk
        distinct = np.unique(kids)
        keys = disk.entry_keys(distinct)
        store = disk.read(distinct, keys)
        held = _sessions_per_key(distinct, store.kids)
        _fire(self.host, store, timestamps, kids, starts)
        changed = np.flatnonzero(_sessions_per_key(distinct, store.kids) != held)
        if len(changed):
            disk.write(distinct[changed], [keys[i] for i in changed.tolist()], store)

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        return no_sections

    def export(self) -> Iterator[tuple[int, WindowSection]]:
        """Every key group's open sessions as the heap store's sections (a disk savepoint
        restored into a heap job, through a scratch database)."""
        for group, rows in self.disk.export():
            yield group, WindowSection(sessions=rows)

    def restore(self, group: int, section: WindowSection) -> None:
        """A heap checkpoint's open sessions into RocksDB (their timers are restored
        already)."""
        restored = _restored(self.host, self.spec, group, section)
        if restored is not None:
            self.disk.restore_heap(*restored)

    def restored(self) -> None:
        pass
