"""The dense window stores: tumbling, sliding and processing-time windows of built-in
aggregates (the fast path).

A batch becomes partials with one pyarrow ``group_by`` per (window start, key id) and
merges with a handful of numpy operations: no Python per row. All keys of a window fire
at the same instant, so a window registers one timer per *key group* it holds keys of
(scoped to one of them, its representative), not one per key: a firing timer emits every
key of its window in its key group. Timers still follow their key groups on rescaling,
and a window of a million keys costs at most ``max_parallelism`` timers.

* :class:`HeapDenseWindows`: per window start, numpy arrays of partials indexed by key
  id;
* :class:`DiskDenseWindows`: the partials in the disk backend's RocksDB
  (:mod:`raystream.engine.windows.disk_panes`: a batch merges with one multi-get and one
  write batch, a key group's window fires with one range scan, emitted in chunks of
  about :data:`FIRING_CHUNK_ROWS` rows).
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.disk_panes import DiskPanes
from raystream.engine.windows.store import (WINDOW_START, Assigned, DenseRows, DueTimers,
                                            WindowHost, WindowSection, by_key_group,
                                            no_sections, rows_of)

# rows a disk window emits at once when it fires: its keys are read key group by key group
# and emitted in chunks of about this many, so a window over millions of keys never sits
# in memory whole
FIRING_CHUNK_ROWS = 65_536
_KEY_ID = "__key_id"


def _partials(host: WindowHost, spec: AggregateSpec, batch: pa.RecordBatch,
              assigned: Assigned) -> pa.Table:
    """One row of partials per (window start, key id) of the batch's assignments."""
    table = pa.Table.from_batches([batch])
    by = [WINDOW_START, _KEY_ID]
    if host.partial_input:  # rows: the partials (of a window or a pane) that are not late
        table = rows_of(table, spec.partial_columns, assigned.rows).append_column(
            WINDOW_START, pa.array(assigned.starts)).append_column(_KEY_ID,
                                                                   pa.array(assigned.kids))
        return spec.merge_partials(table, by)
    columns = rows_of(table, spec.input_columns, assigned.rows).append_column(
        WINDOW_START, pa.array(assigned.starts)).append_column(_KEY_ID, pa.array(assigned.kids))
    return spec.partials_of_rows(columns, by)


def _dtypes_of(spec: AggregateSpec, partials: pa.Table) -> dict[str, np.dtype]:
    return {name: partials[name].type.to_pandas_dtype() for name in spec.partial_columns}


class _DenseWindow:
    """Partials of one window for every key id: ``present[k]`` and ``columns[name][k]``;
    ``timed[g]``: the window's timers for key group ``g`` are registered."""

    __slots__ = ("present", "columns", "count", "timed")

    def __init__(self, capacity: int, spec: AggregateSpec, dtypes: dict[str, np.dtype],
                 max_parallelism: int) -> None:
        self.present = np.zeros(capacity, dtype=bool)
        self.columns = {name: np.full(capacity, spec.identity(name, dtypes[name]), dtype=dtypes[name])
                        for name in spec.partial_columns}
        self.count = 0
        self.timed = np.zeros(max_parallelism, dtype=bool)

    def grow(self, capacity: int, spec: AggregateSpec) -> None:
        old = len(self.present)
        if capacity <= old:
            return
        capacity = max(capacity, 2 * old)
        present = np.zeros(capacity, dtype=bool)
        present[:old] = self.present
        self.present = present
        for name, column in self.columns.items():
            grown = np.full(capacity, spec.identity(name, column.dtype), dtype=column.dtype)
            grown[:old] = column
            self.columns[name] = grown


class HeapDenseWindows:
    """Dense windows on the heap: per window start, partials indexed by key id."""

    def __init__(self, host: WindowHost, spec: AggregateSpec) -> None:
        self.host, self.spec = host, spec
        self.windows: dict[int, _DenseWindow] = {}
        self.dtypes: dict[str, np.dtype] | None = None

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        host, spec = self.host, self.spec
        assigned = host.judge_late(batch, assigned)
        if not len(assigned):
            return
        partials = _partials(host, spec, batch, assigned)
        if self.dtypes is None:
            self.dtypes = _dtypes_of(spec, partials)
        dtypes = self.dtypes
        window_of = partials[WINDOW_START].to_numpy()
        kids_of = partials[_KEY_ID].to_numpy()
        values = {name: partials[name].to_numpy() for name in spec.partial_columns}
        capacity = host.timers.num_keys
        fire_now, timed = [], []
        for start in np.unique(window_of).tolist():
            mask = window_of == start
            kids = kids_of[mask]
            window = self._window(start, capacity)
            new = kids[~window.present[kids]]
            spec.merge_all(window.columns, kids,
                           {name: values[name][mask].astype(dtypes[name], copy=False)
                            for name in spec.partial_columns})
            if len(new):
                window.present[new] = True
                window.count += len(new)
                timed.append(self._untimed_groups(window, start, new))
            if host.event_time:  # fired already: within the allowed lateness, fire again
                end = int(host.window_ends(np.array([start]))[0])
                fired = np.broadcast_to(end - 1 <= host.watermarks_of_key_ids(kids), kids.shape)
                if fired.any():
                    fire_now.append((start, kids[fired]))
        if timed:  # one call for the batch: add_many is vectorized for large batches
            kids, starts = (np.concatenate(c) for c in zip(*timed))
            host.register_timers(kids, starts, host.window_ends(starts))
        self._emit(fire_now)

    def fire(self, due: DueTimers) -> None:
        """A timer stands for its key group in its window: firing ones emit the window's
        keys of their groups, cleanup ones (the firing ones, without lateness) drop them."""
        timestamps, kids, starts = due.timestamps, due.kids, due.starts
        host = self.host
        ends = host.window_ends(starts)
        fire = timestamps == ends - 1
        cleanup = timestamps == ends - 1 + host.lateness
        groups = host.timers.key_groups_of(kids)
        fired = self._due(starts[fire], groups[fire])
        self._emit(fired)
        cleared = self._due(starts[cleanup], groups[cleanup]) if host.lateness else fired
        for start, keys in cleared:
            self._clear(start, keys)

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        kids, starts, columns = self._entries()  # synchronous: flat copies
        timers = self.host.timers

        def sections() -> dict[int, WindowSection]:
            if not len(kids):
                return {}
            return {group: WindowSection(dense=DenseRows(starts_, keys, columns_))
                    for group, keys, (starts_,), columns_ in by_key_group(
                        timers, kids, starts, columns=columns)}
        return sections

    def restore(self, group: int, section: WindowSection) -> None:
        section.only("dense", where=f"window '{self.host.name}'")
        rows = section.dense
        if rows is None:
            return
        timers = self.host.timers
        kids = timers.key_ids(rows.keys, np.full(len(rows.keys), group))
        if self.dtypes is None:
            self.dtypes = {n: c.dtype for n, c in rows.columns.items()}
        starts = rows.starts
        for start in np.unique(starts).tolist():
            mine = starts == start
            window = self._window(start, timers.num_keys)
            for name, values in rows.columns.items():
                window.columns[name][kids[mine]] = values[mine]
            window.present[kids[mine]] = True
            window.count += int(np.count_nonzero(mine))
            window.timed[group] = True  # its timers are in the restored timer sections

    def restored(self) -> None:
        pass

    def _window(self, start: int, capacity: int) -> _DenseWindow:
        window = self.windows.get(start)
        if window is None:
            if self.dtypes is None:
                raise RuntimeError(f"window '{self.host.name}': a dense window before the "
                                   f"dtypes of its aggregates are known")
            window = self.windows[start] = _DenseWindow(
                max(capacity, 64), self.spec, self.dtypes, self.host.max_parallelism)
        window.grow(capacity, self.spec)
        return window

    def _untimed_groups(self, window: _DenseWindow, start: int,
                        new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Marks the key groups of ``new`` keys that ``window`` has no timers for yet as
        timed; returns the (key id, window start) to scope their timers to: the first
        new key of each group."""
        groups = self.host.timers.key_groups_of(new)
        untimed = ~window.timed[groups]
        fresh, first = np.unique(groups[untimed], return_index=True)
        window.timed[fresh] = True
        return new[untimed][first], np.full(len(fresh), start, dtype=np.int64)

    def _keys_of_groups(self, start: int, groups: np.ndarray) -> np.ndarray:
        """Key ids present in the window of ``start`` whose key group is in ``groups``."""
        window = self.windows.get(start)
        if window is None:
            return np.empty(0, dtype=np.int64)
        kids = np.flatnonzero(window.present)
        asked = np.zeros(len(window.timed), dtype=bool)
        asked[groups] = True
        if not (window.timed & ~asked).any():
            return kids  # every key group of the window (the usual case)
        return kids[np.isin(self.host.timers.key_groups_of(kids), groups)]

    def _due(self, starts: np.ndarray, groups: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(window start, key ids) for due timers given by their windows' starts and their
        key groups."""
        return [(start, self._keys_of_groups(start, groups[starts == start]))
                for start in np.unique(starts).tolist()]

    def _emit(self, fired: list[tuple[int, np.ndarray]]) -> None:
        """Emit the results of (window start, key ids) pairs as one batch."""
        fired = [(start, kids) for start, kids in fired if len(kids)]
        if not fired:
            return
        windows, spec = self.windows, self.spec
        kids = np.concatenate([k for _, k in fired])
        starts = np.concatenate([np.full(len(k), s, dtype=np.int64) for s, k in fired])
        results = spec.results(
            {name: np.concatenate([windows[s].columns[name][k] for s, k in fired])
             for name in spec.partial_columns})
        self.host.emit_results(kids, starts, self.host.window_ends(starts), results)

    def _clear(self, start: int, kids: np.ndarray) -> None:
        window = self.windows.get(start)
        if window is None:
            return
        spec = self.spec
        kids = kids[window.present[kids]]
        window.present[kids] = False
        window.timed[self.host.timers.key_groups_of(kids)] = False
        for name, column in window.columns.items():
            column[kids] = spec.identity(name, column.dtype)
        window.count -= len(kids)
        if window.count <= 0:
            del self.windows[start]

    def _entries(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(key ids, window starts, partial columns) of every (key, window) held, as new
        flat arrays."""
        kids, starts, columns = [], [], {}
        for start, window in self.windows.items():
            present = np.flatnonzero(window.present)
            kids.append(present)
            starts.append(np.full(len(present), start, dtype=np.int64))
            for name, column in window.columns.items():
                columns.setdefault(name, []).append(column[present])
        if not kids:
            return np.empty(0, np.int64), np.empty(0, np.int64), {}
        return (np.concatenate(kids), np.concatenate(starts),
                {n: np.concatenate(c) for n, c in columns.items()})


def _size_of(host: WindowHost) -> int:
    """The size of ``host``'s fixed windows: a window ends that long after its start."""
    return int(host.window_ends(np.zeros(1, np.int64))[0])


class DiskDenseWindows:
    """Dense windows in the disk backend (:class:`~raystream.engine.windows.disk_panes.
    DiskPanes`); the operator's checkpoint part holds none of them."""

    def __init__(self, host: WindowHost, spec: AggregateSpec, panes: DiskPanes) -> None:
        self.host, self.spec, self.panes = host, spec, panes

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        """The batch's partials (one row per (window, key)) into the panes; timers for the
        key groups new to a window; windows fired already (within the allowed lateness)
        fire again at once with their merged partials."""
        host, spec, panes = self.host, self.spec, self.panes
        assigned = host.judge_late(batch, assigned)
        if not len(assigned):
            return
        partials = _partials(host, spec, batch, assigned)
        if panes.record is None:
            panes.set_dtypes(_dtypes_of(spec, partials))
        starts = partials[WINDOW_START].to_numpy()
        kids = partials[_KEY_ID].to_numpy()
        ends = host.window_ends(starts)
        merged = panes.merge(ends, kids, {name: partials[name].to_numpy()
                                          for name in spec.partial_columns})
        first = merged.first
        if len(first):
            host.register_timers(kids[first], starts[first], ends[first])
        if host.event_time:
            due = np.broadcast_to(ends - 1 <= host.watermarks_of_key_ids(kids), kids.shape)
            if due.any():
                host.emit_results(kids[due], starts[due], ends[due], spec.results(
                    {name: values[due] for name, values in merged.values.items()}))

    def fire(self, due: DueTimers) -> None:
        """A timer stands for its key group in its window: firing ones emit the window's
        keys of their groups (one range scan per group), then cleanup ones (the firing
        ones, without lateness) delete them by range.

        A window of millions of keys must not sit in memory at once (every key's window
        ends at the same time): the keys read are emitted whenever they reach
        :data:`FIRING_CHUNK_ROWS`, with a safe point for the key table after each emit."""
        timestamps, kids, starts = due.timestamps, due.kids, due.starts
        host, panes = self.host, self.panes
        ends = host.window_ends(starts)
        fire = timestamps == ends - 1
        cleanup = timestamps == ends - 1 + host.lateness
        acted = fire | cleanup  # without lateness a firing timer cleans up too
        starts, ends, fire, cleanup = starts[acted], ends[acted], fire[acted], cleanup[acted]
        groups = host.timers.key_groups_of(kids[acted])
        fired: list[tuple[int, int, np.ndarray, dict[str, np.ndarray]]] = []
        cleared, held = [], 0
        distinct, first = np.unique(starts, return_index=True)
        for start, end in zip(distinct.tolist(), ends[first].tolist()):
            at = starts == start
            for group in np.unique(groups[at & fire]).tolist():
                found, values = panes.read(end, [group])
                if len(found):
                    fired.append((start, end, found, values))
                    held += len(found)
                if held >= FIRING_CHUNK_ROWS:
                    self._emit(fired)
                    fired, held = [], 0
                    host.release_key_ids()  # nothing holds a key id of the emitted rows
            cleared.append((end, np.unique(groups[at & cleanup]).tolist()))
        self._emit(fired)
        for end, groups_ in cleared:
            panes.clear(end, groups_)

    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        return no_sections

    def export(self) -> Iterator[tuple[int, WindowSection]]:
        """Every key group's windows as the heap store's sections: how a heap job restores
        a disk savepoint (through a scratch database, see
        :mod:`~raystream.engine.operators.moved_disk_state`). One range scan per key
        group and window, as a firing reads them."""
        panes, size = self.panes, _size_of(self.host)
        timers = panes.timers
        if not panes.timed:
            return
        for group in np.flatnonzero(np.logical_or.reduce(list(panes.timed.values()))).tolist():
            ends = [end for end, timed in panes.timed.items() if timed[group]]
            found = [(end, *panes.read(end, [group])) for end in sorted(ends)]
            found = [(end, kids, values) for end, kids, values in found if len(kids)]
            if not found:
                continue
            kids = np.concatenate([k for _, k, _ in found])
            yield group, WindowSection(dense=DenseRows(
                np.concatenate([np.full(len(k), end - size, np.int64) for end, k, _ in found]),
                timers.keys(kids),
                {name: np.concatenate([v[name] for _, _, v in found])
                 for name in self.spec.partial_columns}))

    def restore(self, group: int, section: WindowSection) -> None:
        """A heap savepoint's windows into RocksDB (their timers are restored already)."""
        section.only("dense", where=f"window '{self.host.name}'")
        rows = section.dense
        if rows is None:
            return
        panes = self.panes
        if panes.record is None:
            panes.set_dtypes({n: c.dtype for n, c in rows.columns.items()})
        kids = self.host.timers.key_ids(rows.keys, np.full(len(rows.keys), group))
        panes.merge(self.host.window_ends(rows.starts), kids, rows.columns)

    def restored(self) -> None:
        pass

    def _emit(self, fired: list[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]) -> None:
        """Emit (window start, end, key ids, partials) read from the panes."""
        if not fired:
            return
        spec = self.spec
        self.host.emit_results(
            np.concatenate([k for _, _, k, _ in fired]),
            np.concatenate([np.full(len(k), s, np.int64) for s, _, k, _ in fired]),
            np.concatenate([np.full(len(k), e, np.int64) for _, e, k, _ in fired]),
            spec.results({name: np.concatenate([v[name] for _, _, _, v in fired])
                          for name in spec.partial_columns}))
