"""The window operator: keyed windows on the timer service (Flink's ``WindowOperator``).

Per record batch: assign windows (vectorized), drop or side-output the rows
that are late for every window they belong to (a session row: when the session it
would merge into is late, judged by its key's open sessions), fold the rest into one
accumulator per (key, window), and register the window's timers at ``end - 1``
(plus a cleanup timer at ``end - 1 + allowed_lateness`` when there is
lateness). A timer firing emits the window's result; the cleanup timer drops
its state. A record that is late but within the allowed lateness updates its
window and re-emits the result at once.

Two state layouts:

* **dense** (tumbling/sliding/processing-time windows with built-in
  aggregates; the fast path): per window start, numpy arrays of partials
  indexed by key id. A batch becomes partials with one pyarrow ``group_by``
  and merges with a handful of numpy operations: no Python per row. All keys
  of a window fire at the same instant, so the window registers one timer per
  *key group* it holds keys of (scoped to one of them, its representative),
  not one per key: a firing timer emits every key of its window in its key
  group. Timers still follow their key groups on rescaling, and a window of a
  million keys costs at most ``max_parallelism`` timers instead of a million.
* **sessions** (session windows with built-in aggregates): every open
  session's key id, start, end and partials in flat arrays, merged with a
  batch by sorting (:mod:`raystream.engine.windows.sessions`): no Python per
  session or row.
* **generic** (user ``AggregateFunction``, full-window ``process``): one
  accumulator object per (key, window); Python runs per (key, window) of a
  batch, and per row only inside a user function.

With the disk state backend (``CheckpointConfig(state_backend="disk")``) the dense
layout keeps its partials in the operator instance's RocksDB instead
(:mod:`raystream.engine.windows.disk_panes`: a batch merges with one multi-get and
one write batch, a key group's window fires with one range scan), and so do the
sessions (:mod:`raystream.engine.windows.disk_sessions`: one entry per key holding
its open sessions; a batch and a firing read their keys with one multi-get and write
them back with one write batch), and the generic layout's tumbling and sliding windows
(:mod:`raystream.engine.windows.disk_entries`: one entry per (key, window) holding its
accumulator, a batch merges with one multi-get and one write batch; a
``ProcessWindowFunction``'s rows appended as one chunk per batch, never rewritten), and its session
windows (:mod:`raystream.engine.windows.disk_generic_sessions`: a header per key
holding its open sessions and their accumulators, a ``ProcessWindowFunction``'s rows
in chunks beside it that a batch appends to without reading; loaded for a batch or a
firing with one multi-get, merged or fired by the heap path's own code, written back
with one write batch).

The operator also reads *partials* from an upstream pre-aggregator
(:mod:`raystream.engine.windows.pre_aggregate`) instead of raw rows.

State and timers are snapshotted per key group (part ``"windows"`` beside
``"state"`` and ``"timers"``; the disk backend's entries in its own sections), so
windows survive failover and rescaling.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from raystream.actors.operator import RestoredState
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.batches import rows_to_batch
from raystream.engine.keys import DistinctKeys, KeySelector
from raystream.engine.operators.functions import _close_function, _open_function
from raystream.engine.operators.keyed import _KeyedOperator
from raystream.engine.watermarks import MAX_LATENESS_MS, timestamps_ms
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.assigners import EventTimeSessionWindows, WindowAssigner
from raystream.engine.windows import (disk_entries, disk_generic_sessions, disk_panes,
                                      disk_sessions)
from raystream.engine.windows.disk_entries import DiskChunks, DiskEntries
from raystream.engine.windows.disk_generic_sessions import DiskGenericSessions
from raystream.engine.windows.disk_panes import DiskPanes
from raystream.engine.windows.disk_sessions import DiskSessions
from raystream.engine.windows.functions import (BuiltinAggregates, ProcessWindow,
                                                UserAggregate, Window, WindowFunction)
from raystream.engine.windows.sessions import (SessionStore, Windows, late_for_sessions,
                                              session_breaks)

WINDOW_START = "__window_start"  # pre-aggregated partial rows: their window's (or pane's) start
WINDOW_TIME = "window_end - 1"
"""``timestamp=WINDOW_TIME``: a window result's event time, ``window_end - 1`` (Flink's
``TimeWindow.maxTimestamp()``), read from its ``window_end`` column. It is the default
timestamp of a window's result stream, so a second windowed stage chains without naming
a column: a result is emitted before the watermark that fired it, so the next stage never
finds it late (unless it is a late re-firing within the allowed lateness)."""
LATE_LOG_INTERVAL_S = 60.0  # at most one "dropped late records" log per operator per interval
# rows a disk window emits at once when it fires: its keys are read key group by key group
# and emitted in chunks of about this many, so a window over millions of keys never sits
# in memory whole
FIRING_CHUNK_ROWS = 65_536

log = logging.getLogger(__name__)


def event_times(batch: pa.RecordBatch, timestamp: str, *, where: str) -> np.ndarray:
    """The event times of ``batch``: its ``timestamp`` column as int64 ms, or for
    :data:`WINDOW_TIME` its ``window_end`` column minus one.

        >>> import pyarrow as pa
        >>> event_times(pa.record_batch({"window_end": [1000, 2000]}), WINDOW_TIME,
        ...             where="example").tolist()
        [999, 1999]
    """
    if timestamp == WINDOW_TIME:
        return timestamps_ms(batch, "window_end", where=where) - 1
    return timestamps_ms(batch, timestamp, where=where)


_WINDOW_STATE_VERSION = 3  # 2: a key group's dense windows as flat arrays; 3: sessions too
_READABLE_VERSIONS = (2, 3)


class KeyColumns:
    """Arrow columns of the keys, indexed by the timer service's key id (for output)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.chunks: list[list[pa.Array]] = [[] for _ in names]
        self.covered = 0
        self._combined: list[pa.Array] | None = None

    def extend(self, arrays: list[pa.Array]) -> None:
        for chunks, array in zip(self.chunks, arrays):
            chunks.append(array)
        self.covered += len(arrays[0]) if arrays else 0
        self._combined = None

    def extend_python(self, keys: list[Any]) -> None:
        if not keys:
            return
        columns = [keys] if len(self.names) == 1 else [list(c) for c in zip(*keys)]
        self.extend([pa.array(c) for c in columns])

    def take(self, key_ids: np.ndarray) -> list[pa.Array]:
        if self._combined is None:
            self._combined = [_concat(chunks) for chunks in self.chunks]
        index = pa.array(key_ids)
        return [array.take(index) for array in self._combined]


def _rows_of(table: pa.Table, columns: list[str], rows: np.ndarray) -> pa.Table:
    """``columns`` of ``table`` at ``rows`` (a row may repeat); with no columns, a
    placeholder column keeps the row count."""
    if not columns:
        return pa.table({"__row": pa.array(rows)})
    selected = table.select(columns)
    return selected if _is_identity(rows, table.num_rows) else selected.take(pa.array(rows))


def _is_identity(rows: np.ndarray, n: int) -> bool:
    """Is ``rows`` exactly ``0, 1, ..., n-1`` (every row once, in order)?"""
    return len(rows) == n and (n == 0 or (rows[0] == 0 and rows[-1] == n - 1
                                          and bool(np.all(np.diff(rows) == 1))))


def _sessions_per_key(distinct: np.ndarray, kids: np.ndarray) -> np.ndarray:
    """How many of the sessions of key ids ``kids`` each of the sorted ``distinct`` key
    ids holds."""
    return np.bincount(np.searchsorted(distinct, kids), minlength=len(distinct))


def _concat(chunks: list[pa.Array]) -> pa.Array:
    kind = chunks[0].type
    return pa.concat_arrays([c if c.type == kind else c.cast(kind) for c in chunks])


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


class WindowOperator(_KeyedOperator):
    """Keyed windows over ``assigner``, computing ``function`` per (key, window)."""

    # on the disk backend every layout keeps its state in RocksDB (part "windows" is empty)
    supports_disk_state = True
    disk_only_kinds = (disk_panes.KIND, disk_sessions.KIND, disk_entries.KIND,
                       disk_entries.CHUNKS_KIND,
                       disk_generic_sessions.KIND)
    label = "window"

    def __init__(self, name: str, keys: KeySelector, assigner: WindowAssigner, *,
                 function: WindowFunction, timestamp: str | None, allowed_lateness_ms: int = 0,
                 late_output: str | None = None, partial_input: bool = False,
                 schema: pa.Schema | None = None, emit_keys: bool = True) -> None:
        super().__init__(name, keys)
        if assigner.event_time and not timestamp and not partial_input:
            raise ValueError(f"window '{name}': event-time windows need the timestamp column "
                             f"(window(..., timestamp='ts'); a window's results have the "
                             f"default rs.WINDOW_TIME)")
        if allowed_lateness_ms < 0:
            raise ValueError(f"window '{name}': allowed_lateness_ms must be >= 0")
        if not assigner.event_time and allowed_lateness_ms:
            raise ValueError(f"window '{name}': allowed lateness applies to event-time windows only")
        self.assigner = assigner
        self.function = function
        self.timestamp = timestamp
        # "Keep every window" is a huge lateness: clamped, end + lateness cannot overflow
        self.lateness = min(int(allowed_lateness_ms), MAX_LATENESS_MS)
        self.late_output = late_output
        self.partial_input = partial_input
        self.schema = schema
        self.dense = isinstance(function, BuiltinAggregates) and not assigner.merging
        # session windows of built-in aggregates: the columnar session store
        self.columnar_sessions = (isinstance(function, BuiltinAggregates)
                                  and isinstance(assigner, EventTimeSessionWindows))
        self.key_names = list(keys.columns) if keys.columns else ["key"]
        self.emit_keys = emit_keys  # False for window_all: its key column is internal
        self.late_dropped = 0
        self._late_logged_at: float | None = None  # monotonic time of the last late-drop log
        self._late_logged_count = 0  # late_dropped at that log
        self.late_side_output = 0
        self.fired = 0

    # -- life cycle ---------------------------------------------------------------------
    def initialize_state(self, restored: RestoredState | None) -> None:
        self.dense_windows: dict[int, _DenseWindow] = {}
        self.disk_panes: DiskPanes | None = None
        self.dtypes: dict[str, np.dtype] | None = None
        self.entries: dict[tuple[int, int], list] = {}  # (key id, start) -> [end, accumulator]
        self.sessions: dict[int, list[int]] = {}  # key id -> starts of its open sessions
        self.session_store = SessionStore(self._spec) if self.columnar_sessions else None
        self.disk_sessions: DiskSessions | None = None  # in place of the store on disk
        self.disk_entries: DiskEntries | None = None  # in place of ``entries`` on disk
        # generic sessions on disk: loaded into ``entries`` / ``sessions`` for one call
        self.disk_generic_sessions: DiskGenericSessions | None = None
        super().initialize_state(restored)  # timers first, then our part "windows"
        self._open_disk_panes()
        self.key_columns = KeyColumns(self.key_names)
        self._sync_key_columns(None, None)

    def _open_disk_panes(self) -> None:
        """The dense layout or the sessions on the disk backend: once its state is
        restored, if any."""
        if not isinstance(self.backend, DiskKeyedStateBackend):
            return
        if self.disk_sessions is None and self.columnar_sessions:
            self.disk_sessions = DiskSessions(self.backend, self._spec, self.disk_timers,
                                              where=f"window '{self.name}'")
            self.session_store = None
        if self.disk_entries is None and not self.dense and not self.assigner.merging:
            # a ProcessWindowFunction's rows: appended chunks, not one growing entry
            layout = DiskChunks if isinstance(self.function, ProcessWindow) else DiskEntries
            self.disk_entries = layout(self.backend, self.disk_timers)
        if (self.disk_generic_sessions is None and self.assigner.merging
                and not self.columnar_sessions):
            self.disk_generic_sessions = DiskGenericSessions(
                self.backend, self.disk_timers, rows=isinstance(self.function, ProcessWindow))
        if self.disk_panes is None and self.dense:
            panes = self.disk_panes = DiskPanes(self.backend, self._spec, self.disk_timers,
                                                where=f"window '{self.name}'")
            if panes.dtypes is not None:
                self.dtypes = panes.dtypes

    def open(self) -> None:
        fn = getattr(self.function, "fn", None)
        if fn is not None:
            _open_function(fn, self.ctx)

    def close(self) -> None:
        fn = getattr(self.function, "fn", None)
        if fn is not None:
            _close_function(fn)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "late_records_dropped": self.late_dropped,
                "late_records_side_output": self.late_side_output,
                "windows_fired": self.fired}

    # -- records ------------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if not batch.num_rows:
            return
        self.release_key_ids()  # a safe point: between batches and firings
        distinct = self.keys.distinct_keys(batch, self.ctx.max_parallelism)
        ids = self.timers.key_ids(distinct.keys, distinct.groups)
        self._sync_key_columns(ids, distinct)
        key_ids = ids[distinct.inverse]
        if self.partial_input:
            starts = batch.column(batch.schema.get_field_index(WINDOW_START)).to_numpy()
            rows = np.arange(batch.num_rows)
            if getattr(self.assigner, "panes", None) is not None:  # a pane's windows
                rows, starts = self.assigner.assign(starts)
        else:
            if isinstance(self.function, BuiltinAggregates):
                self.function.spec.check_input(batch.schema, where=f"window '{self.name}'")
            if self.assigner.event_time:
                if self.timestamp is None:  # __init__ requires it for event time
                    raise ValueError(f"window '{self.name}': event-time windows need the "
                                     f"timestamp column")
                times = event_times(batch, self.timestamp, where=f"window '{self.name}'")
            else:
                times = np.full(batch.num_rows, int(time.time() * 1000), dtype=np.int64)
            rows, starts = self.assigner.assign(times)
        ends = self._ends(starts)
        if self.columnar_sessions:
            self._merge_sessions(batch, rows, starts, ends, key_ids)
            return
        if self.dense:
            rows, starts, ends = self._drop_late(batch, rows, starts, ends, key_ids[rows])
            if len(rows):
                self._merge_dense(pa.Table.from_batches([batch]), rows, starts, key_ids)
            return
        # on disk, sessions' keys are loaded first: their open sessions judge late rows
        with self._generic_loaded(key_ids[rows]):
            rows, starts, ends = self._drop_late(batch, rows, starts, ends, key_ids[rows],
                                                 held=self._generic_windows)
            if len(rows):
                self._merge_generic(pa.Table.from_batches([batch]), rows, starts, ends,
                                    key_ids)

    def _generic_loaded(self, kids: np.ndarray) -> contextlib.AbstractContextManager[None]:
        """On disk, generic sessions of key ids ``kids`` in ``entries`` / ``sessions`` for
        a batch or a firing (written back after it); nothing on the heap."""
        disk = self.disk_generic_sessions
        if disk is None:
            return contextlib.nullcontext()
        return disk.loaded(np.unique(kids), self.entries, self.sessions)

    def _ends(self, starts: np.ndarray) -> np.ndarray:
        if isinstance(self.assigner, EventTimeSessionWindows):  # the merging one
            return starts + self.assigner.gap_ms
        return self.assigner.end_of(starts)

    def _drop_late(self, batch, rows, starts, ends, kids,
                   held: Callable[[np.ndarray], Windows] | None = None):
        """Keep assignments to windows that are not late; rows late for all of their
        windows go to the late side output (or are dropped and counted). A partial
        (pre-aggregated input) is one assignment: late or not as a whole, by the same rule,
        since all its rows belong to its window. For session windows a row is late only
        when the session it would merge into is (:func:`late_for_sessions`; ``held(keys)``:
        the keys' open sessions)."""
        if not self.assigner.event_time:
            return rows, starts, ends
        late = ends - 1 + self.lateness <= self.watermarks_of_key_ids(kids)
        if late.any() and isinstance(self.assigner, EventTimeSessionWindows):
            if held is None:
                raise TypeError(f"window '{self.name}': session windows judge late rows by "
                                f"their keys' open sessions")
            late = late_for_sessions(kids, starts, ends, late, held,
                                     self.watermarks_of_key_ids, self.lateness)
        if not late.any():
            return rows, starts, ends
        on_time_rows = np.zeros(batch.num_rows, dtype=bool)
        on_time_rows[rows[~late]] = True
        late_rows = np.flatnonzero(~on_time_rows)
        if len(late_rows):
            if self.late_output is not None and not self.partial_input:
                late_batch = batch.take(pa.array(late_rows))
                if not self.emit_keys:  # window_all: the rows as they came, without its key
                    late_batch = late_batch.select(
                        [n for n in late_batch.schema.names if n not in self.key_names])
                self.emit_side(self.late_output, late_batch)
                self.late_side_output += len(late_rows)
            else:
                self.late_dropped += len(late_rows)
                self._log_late_dropped()
        keep = ~late
        return rows[keep], starts[keep], ends[keep]

    def _log_late_dropped(self, now: float | None = None) -> None:
        """Log dropped late records: at the first drop, then at most once every
        :data:`LATE_LOG_INTERVAL_S` seconds (with the count since the last log)."""
        now = time.monotonic() if now is None else now
        if self._late_logged_at is not None and now - self._late_logged_at < LATE_LOG_INTERVAL_S:
            return
        since = self.late_dropped - self._late_logged_count
        log.warning("window '%s' dropped %d late record(s) (%d in total; pass "
                    "late_output=tag to keep them, or allowed_lateness_ms)",
                    self.name, since, self.late_dropped)
        self._late_logged_at, self._late_logged_count = now, self.late_dropped

    # -- dense path -----------------------------------------------------------------------
    @property
    def _spec(self) -> AggregateSpec:
        """The built-in aggregates' spec: the dense path is taken for those only."""
        if not isinstance(self.function, BuiltinAggregates):
            raise TypeError(f"window '{self.name}': the dense path needs built-in aggregates")
        return self.function.spec

    def _merge_dense(self, table: pa.Table, rows, starts, key_ids) -> None:
        spec = self._spec
        by = [WINDOW_START, "__key_id"]
        if self.partial_input:  # rows: the partials (of a window or a pane) that are not late
            table = _rows_of(table, spec.partial_columns, rows).append_column(
                WINDOW_START, pa.array(starts)).append_column("__key_id", pa.array(key_ids[rows]))
            partials = spec.merge_partials(table, by)
        else:
            columns = _rows_of(table, spec.input_columns, rows).append_column(
                WINDOW_START, pa.array(starts)).append_column("__key_id", pa.array(key_ids[rows]))
            partials = spec.partials_of_rows(columns, by)
        if self.dtypes is None:
            self.dtypes = {name: partials[name].type.to_pandas_dtype()
                           for name in spec.partial_columns}
        if self.disk_panes is not None:
            self._merge_disk(self.disk_panes, spec, partials)
            return
        window_of = partials[WINDOW_START].to_numpy()
        kids_of = partials["__key_id"].to_numpy()
        values = {name: partials[name].to_numpy() for name in spec.partial_columns}
        capacity = self.key_columns.covered
        fire_now, timed = [], []
        for start in np.unique(window_of).tolist():
            mask = window_of == start
            kids = kids_of[mask]
            window = self._dense_window(start, capacity)
            new = kids[~window.present[kids]]
            spec.merge_all(window.columns, kids,
                           {name: values[name][mask].astype(self.dtypes[name], copy=False)
                            for name in spec.partial_columns})
            if len(new):
                window.present[new] = True
                window.count += len(new)
                timed.append(self._untimed_groups(window, start, new))
            if self.assigner.event_time:
                fired = self._fired_already(start, kids)
                if fired.any():
                    fire_now.append((start, kids[fired]))
        if timed:  # one call for the batch: add_many is vectorized for large batches
            kids, starts = (np.concatenate(c) for c in zip(*timed))
            self._register_timers(kids, starts, self._ends(starts))
        self._emit_dense(fire_now)  # late but within the allowed lateness: fire again

    def _merge_disk(self, panes: DiskPanes, spec: AggregateSpec, partials: pa.Table) -> None:
        """The batch's partials (one row per (window, key)) into the disk panes; timers for
        the key groups new to a window; windows fired already (within the allowed
        lateness) fire again at once with their merged partials."""
        if panes.record is None and self.dtypes is not None:
            panes.set_dtypes(self.dtypes)
        starts = partials[WINDOW_START].to_numpy()
        kids = partials["__key_id"].to_numpy()
        ends = self._ends(starts)
        merged = panes.merge(ends, kids, {name: partials[name].to_numpy()
                                          for name in spec.partial_columns})
        first = merged.first
        if len(first):
            self._register_timers(kids[first], starts[first], ends[first])
        if self.assigner.event_time:
            due = np.broadcast_to(ends - 1 <= self.watermarks_of_key_ids(kids), kids.shape)
            if due.any():
                self._emit_columns(kids[due], starts[due], ends[due], spec.results(
                    {name: values[due] for name, values in merged.values.items()}))

    def _on_disk_timers(self, panes: DiskPanes, starts: np.ndarray, groups: np.ndarray,
                        fire: np.ndarray, cleanup: np.ndarray) -> None:
        """Due timers of the disk panes, a timer standing for its key group in its window:
        firing ones emit the window's keys of their groups (one range scan per group),
        then cleanup ones (the firing ones, without lateness) delete them by range.

        A window of millions of keys must not sit in memory at once (every key's window
        ends at the same time): the keys read are emitted whenever they reach
        ``FIRING_CHUNK_ROWS``, with a safe point for the key table after each emit."""
        fired: list[tuple[int, int, np.ndarray, dict[str, np.ndarray]]] = []
        cleared, held = [], 0
        for start in np.unique(starts).tolist():
            end = int(self._ends(np.array([start]))[0])
            at = starts == start
            for group in np.unique(groups[at & fire]).tolist():
                kids, values = panes.read(end, [group])
                if len(kids):
                    fired.append((start, end, kids, values))
                    held += len(kids)
                if held >= FIRING_CHUNK_ROWS:
                    self._emit_panes(fired)
                    fired, held = [], 0
                    self.release_key_ids()  # nothing holds a key id of the emitted rows
            cleared.append((end, np.unique(groups[at & cleanup]).tolist()))
        self._emit_panes(fired)
        for end, groups_ in cleared:
            panes.clear(end, groups_)

    def _emit_panes(self, fired: list[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]
                    ) -> None:
        """Emit (window start, end, key ids, partials) read from the disk panes."""
        if not fired:
            return
        self._sync_key_columns(None, None)  # restored keys read for the first time
        spec = self._spec
        self._emit_columns(
            np.concatenate([k for _, _, k, _ in fired]),
            np.concatenate([np.full(len(k), s, np.int64) for s, _, k, _ in fired]),
            np.concatenate([np.full(len(k), e, np.int64) for _, e, k, _ in fired]),
            spec.results({name: np.concatenate([v[name] for _, _, _, v in fired])
                          for name in spec.partial_columns}))

    def _dense_window(self, start: int, capacity: int) -> _DenseWindow:
        window = self.dense_windows.get(start)
        if window is None:
            if self.dtypes is None:
                raise RuntimeError(f"window '{self.name}': a dense window before the dtypes "
                                   f"of its aggregates are known")
            window = self.dense_windows[start] = _DenseWindow(
                max(capacity, 64), self._spec, self.dtypes, self.ctx.max_parallelism)
        window.grow(capacity, self._spec)
        return window

    def _untimed_groups(self, window: _DenseWindow, start: int,
                        new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Marks the key groups of ``new`` keys that ``window`` has no timers for yet as
        timed; returns the (key id, window start) to scope their timers to: the first
        new key of each group."""
        groups = self.timers.key_groups_of(new)
        untimed = ~window.timed[groups]
        fresh, first = np.unique(groups[untimed], return_index=True)
        window.timed[fresh] = True
        return new[untimed][first], np.full(len(fresh), start, dtype=np.int64)

    def _dense_keys_of_groups(self, start: int, groups: np.ndarray) -> np.ndarray:
        """Key ids present in the window of ``start`` whose key group is in ``groups``."""
        window = self.dense_windows.get(start)
        if window is None:
            return np.empty(0, dtype=np.int64)
        kids = np.flatnonzero(window.present)
        asked = np.zeros(len(window.timed), dtype=bool)
        asked[groups] = True
        if not (window.timed & ~asked).any():
            return kids  # every key group of the window (the usual case)
        return kids[np.isin(self.timers.key_groups_of(kids), groups)]

    def _dense_due(self, starts: np.ndarray,
                   groups: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(window start, key ids) for due timers given by their windows' starts and their
        key groups."""
        return [(start, self._dense_keys_of_groups(start, groups[starts == start]))
                for start in np.unique(starts).tolist()]

    def _emit_dense(self, fired: list[tuple[int, np.ndarray]]) -> None:
        """Emit the results of (window start, key ids) pairs as one batch."""
        fired = [(start, kids) for start, kids in fired if len(kids)]
        if not fired:
            return
        windows = self.dense_windows
        kids = np.concatenate([k for _, k in fired])
        starts = np.concatenate([np.full(len(k), s, dtype=np.int64) for s, k in fired])
        spec = self._spec
        results = spec.results(
            {name: np.concatenate([windows[s].columns[name][k] for s, k in fired])
             for name in spec.partial_columns})
        self._emit_columns(kids, starts, self._ends(starts), results)

    def _clear_dense(self, start: int, kids: np.ndarray) -> None:
        window = self.dense_windows.get(start)
        if window is None:
            return
        spec = self._spec
        kids = kids[window.present[kids]]
        window.present[kids] = False
        window.timed[self.timers.key_groups_of(kids)] = False
        for name, column in window.columns.items():
            column[kids] = spec.identity(name, column.dtype)
        window.count -= len(kids)
        if window.count <= 0:
            del self.dense_windows[start]

    # -- columnar sessions ----------------------------------------------------------------
    def _merge_sessions(self, batch: pa.RecordBatch, rows, starts, ends, key_ids) -> None:
        """The batch's rows that are not late (judged by the store's open sessions) as
        sessions ``[ts, ts + gap)``, grouped where they intersect, then merged into the
        store (on disk: a store of the batch's keys' sessions, read once and written
        back); timers for the sessions that changed, and a late session (within the
        allowed lateness) that took in rows fires again at once."""
        disk = self.disk_sessions
        if disk is not None:
            loaded = disk.load(key_ids[rows])
            store = loaded.store
        elif self.session_store is not None:
            store = self.session_store
        else:
            raise RuntimeError(f"window '{self.name}': sessions without a session store")
        rows, starts, ends = self._drop_late(batch, rows, starts, ends, key_ids[rows],
                                             held=store.windows_of)
        if not len(rows):
            return
        table = pa.Table.from_batches([batch])
        spec = self._spec
        kids = key_ids[rows]
        order = np.lexsort((starts, kids))
        kids, starts, ends = kids[order], starts[order], ends[order]
        breaks = session_breaks(kids, starts, ends)
        firsts = np.flatnonzero(breaks)
        group = np.cumsum(breaks) - 1
        columns = _rows_of(table, spec.input_columns, rows[order]).append_column(
            "__group", pa.array(group))
        partials = spec.partials_of_rows(columns, ["__group"])
        by_group = np.argsort(partials["__group"].to_numpy())
        sessions = (kids[firsts], starts[firsts], np.maximum.reduceat(ends, firsts),
                    {name: partials[name].to_numpy()[by_group] for name in spec.partial_columns})
        merged = store.add(*sessions) if disk is None else disk.merge(loaded, *sessions)
        changed = merged.changed
        self._register_timers(store.kids[changed], store.starts[changed], store.ends[changed])
        received = merged.received
        due = store.ends[received] - 1 <= self.watermarks_of_key_ids(store.kids[received])
        self._emit_sessions(store, received[due])

    def _emit_sessions(self, store: SessionStore, indices: np.ndarray) -> None:
        self._emit_columns(store.kids[indices], store.starts[indices], store.ends[indices],
                           store.results(indices))

    def _on_session_timers(self, store: SessionStore, timestamps: np.ndarray, kids: np.ndarray,
                           starts: np.ndarray) -> None:
        """Due timers of the session store: a timer whose session is gone, or has
        another end now, is a stale one (sessions keep the timers of their old ends)."""
        found = store.find(kids, starts)
        timestamps, found = timestamps[found >= 0], found[found >= 0]
        ends = store.ends[found]
        self._emit_sessions(store, found[timestamps == ends - 1])
        store.remove(np.unique(found[timestamps == ends - 1 + self.lateness]))

    # -- generic path ---------------------------------------------------------------------
    def _merge_generic(self, table: pa.Table, rows, starts, ends, key_ids) -> None:
        kids = key_ids[rows]
        # the merging assigner: sessions within the batch first, sorted by (key, time)
        sessions = self.assigner if isinstance(self.assigner, EventTimeSessionWindows) else None
        if sessions is not None:
            order = np.lexsort((starts, kids))
            kids, starts, ends = kids[order], starts[order], ends[order]
            breaks = np.flatnonzero((np.diff(kids) != 0) | (np.diff(starts) > sessions.gap_ms))
        else:
            order = np.lexsort((kids, starts))
            kids, starts, ends = kids[order], starts[order], ends[order]
            breaks = np.flatnonzero((np.diff(kids) != 0) | (np.diff(starts) != 0))
        offsets = np.concatenate([[0], breaks + 1, [len(order)]])
        firsts = offsets[:-1]
        group_starts = np.minimum.reduceat(starts, firsts) if len(order) else starts
        group_ends = np.maximum.reduceat(ends, firsts) if len(order) else ends
        sorted_rows = _rows_of(table, self._input_columns(table), rows[order])
        accumulators = self.function.accumulate(sorted_rows, offsets)
        if self.disk_entries is not None:
            self._merge_disk_entries(self.disk_entries, kids[firsts], group_starts, group_ends,
                                     accumulators)
            return
        touched: dict[tuple[int, int], int] = {}  # (key id, start) -> its watermark
        # the watermark judging each (key, window): computed once for the batch
        watermarks = np.broadcast_to(self.watermarks_of_key_ids(kids[firsts]), firsts.shape)
        session_timers = _SessionTimers()
        for kid, start, end, acc, watermark in zip(kids[firsts].tolist(), group_starts.tolist(),
                                                   group_ends.tolist(), accumulators,
                                                   watermarks.tolist()):
            if sessions is not None:
                start, end = self._merge_session(kid, start, end, acc, session_timers)
            else:
                entry = self.entries.get((kid, start))
                if entry is None:
                    self.entries[(kid, start)] = [end, acc]
                    self._register_timers(np.array([kid]), np.array([start]), np.array([end]))
                else:
                    entry[1] = self.function.merge(entry[1], acc)
            touched[(kid, start)] = watermark
        if sessions is not None:
            self._apply_session_timers(session_timers)
        # late but within the allowed lateness: fire again, once per batch, judged by the
        # window's end once the batch is merged (a later session merge may extend it)
        fire_now = [window for window, watermark in touched.items() if self.assigner.event_time
                    and window in self.entries and self.entries[window][0] - 1 <= watermark]
        if fire_now:
            self._emit_generic(fire_now)

    def _generic_windows(self, keys: np.ndarray) -> Windows:
        """The open sessions of the key ids ``keys`` in ``entries`` (on disk: loaded)."""
        found = np.array([(kid, start, self.entries[(kid, start)][0]) for kid in keys.tolist()
                          for start in self.sessions.get(kid, ())], dtype=np.int64).reshape(-1, 3)
        return Windows(found[:, 0], found[:, 1], found[:, 2])

    def _merge_disk_entries(self, disk: DiskEntries, kids: np.ndarray, starts: np.ndarray,
                            ends: np.ndarray, accumulators: list[Any]) -> None:
        """Merge a batch's (key, window) accumulators into RocksDB (one multi-get, one
        write batch), as the heap path merges them into ``entries``; a
        ``ProcessWindowFunction``'s rows are appended, the stored ones not read."""
        keys = disk.entry_keys(kids, ends)
        merged: list[Any] | None = None
        if isinstance(disk, DiskChunks):
            new = disk.append(keys, starts, accumulators)
        else:
            stored = disk.get(keys)
            merge = self.function.merge
            merged = [acc if old is None else merge(old[1], acc)
                      for old, acc in zip(stored, accumulators)]
            disk.put(keys, starts, merged)
            new = np.fromiter((old is None for old in stored), dtype=bool, count=len(stored))
        if new.any():
            self._register_timers(kids[new], starts[new], ends[new])
        if not self.assigner.event_time:
            return
        # late but within the allowed lateness: fire again, once per batch
        watermarks = np.broadcast_to(self.watermarks_of_key_ids(kids), kids.shape)
        due = np.flatnonzero(ends - 1 <= watermarks).tolist()
        if not due:
            return
        # appended rows: the due windows' chunks read back whole (late windows are few)
        stored = ([(0, merged[i]) for i in due] if merged is not None
                  else disk.get([keys[i] for i in due]))
        self._emit_generic_windows([(int(kids[i]), int(starts[i]), int(ends[i]), entry[1])
                                    for i, entry in zip(due, stored) if entry is not None])

    def _on_disk_entry_timers(self, disk: DiskEntries, timestamps: np.ndarray,
                              kids: np.ndarray, starts: np.ndarray) -> None:
        """Due timers of windows in RocksDB: the firing ones' windows read with one
        multi-get (a ``ProcessWindowFunction``'s: its markers, then its chunks) and
        emitted, the cleanup ones' deleted with one write batch (without allowed
        lateness every firing is its window's cleanup: read and deleted at once)."""
        ends = self._ends(starts)
        fire = timestamps == ends - 1
        keys = disk.entry_keys(kids[fire], ends[fire])
        entries = disk.take(keys) if self.lateness == 0 else disk.get(keys)
        fired = [(kid, start, end, entry[1]) for kid, start, end, entry in zip(
            kids[fire].tolist(), starts[fire].tolist(), ends[fire].tolist(), entries)
            if entry is not None]
        if fired:
            self._emit_generic_windows(fired)
        if self.lateness:
            cleanup = timestamps == ends - 1 + self.lateness
            disk.delete(disk.entry_keys(kids[cleanup], ends[cleanup]))

    def _input_columns(self, table: pa.Table) -> list[str]:
        if isinstance(self.function, BuiltinAggregates):
            return self.function.spec.input_columns
        return table.column_names

    def _merge_session(self, kid: int, start: int, end: int, acc: Any,
                       timers: "_SessionTimers") -> tuple[int, int]:
        """Merge session ``[start, end)`` of key ``kid`` with the sessions it touches
        (Flink: windows intersect when ``start <= other.end and end >= other.start``); the
        timer changes go to ``timers``, applied once for the batch."""
        starts = self.sessions.setdefault(kid, [])
        for other in [s for s in starts if s <= end and self.entries[(kid, s)][0] >= start]:
            other_end, other_acc = self.entries.pop((kid, other))
            starts.remove(other)
            timers.delete(kid, other, other_end)
            acc = self.function.merge(other_acc, acc)
            start, end = min(start, other), max(end, other_end)
        starts.append(start)
        self.entries[(kid, start)] = [end, acc]
        timers.register(kid, start, end)
        return start, end

    def _apply_session_timers(self, timers: "_SessionTimers") -> None:
        """The batch's session timer changes: deletions first (a session that kept its start
        may keep its end too), then every registration in one vectorized call."""
        for kid, start, end in timers.deleted:
            self._delete_timers(kid, start, end)
        if timers.registered:
            (kids, starts), ends = zip(*timers.registered), timers.registered.values()
            self._register_timers(np.fromiter(kids, np.int64, len(kids)),
                                  np.fromiter(starts, np.int64, len(starts)),
                                  np.fromiter(ends, np.int64, len(kids)))

    def _emit_generic(self, fired: list[tuple[int, int]]) -> None:
        fn = self.function
        if isinstance(fn, BuiltinAggregates):
            kids = np.array([k for k, _ in fired])
            starts = np.array([s for _, s in fired])
            ends = np.array([self.entries[f][0] for f in fired])
            results = fn.results([self.entries[f][1] for f in fired])
            self._emit_columns(kids, starts, ends, results)
            return
        self._emit_generic_windows([(kid, start, *self.entries[(kid, start)])
                                    for kid, start in fired])

    def _emit_generic_windows(self, fired: list[tuple[int, int, int, Any]]) -> None:
        """The result rows of user-function windows (key id, start, end, accumulator)."""
        fn, timers = self.function, self.timers
        if self.disk_generic_sessions is not None:  # their stored rows: one multi-get
            self.disk_generic_sessions.read_ahead([acc for *_, acc in fired])
        out: list[dict] = []
        self.fired += len(fired)
        for kid, start, end, acc in fired:
            window, key = Window(start, end), timers.key(kid)
            if isinstance(fn, UserAggregate):
                out.extend(fn.rows(self._key_fields(key), window, acc))
            else:
                out.extend(fn.rows(key if self.emit_keys else None, window, acc))
        if out:
            self.output.emit(rows_to_batch(out, schema=self.schema,
                                           where=f"window '{self.name}'"))

    def _clear_generic(self, kid: int, start: int) -> None:
        if self.entries.pop((kid, start), None) is not None and self.assigner.merging:
            self.sessions[kid].remove(start)
            if not self.sessions[kid]:
                del self.sessions[kid]

    def _key_fields(self, key: Any) -> dict:
        if not self.emit_keys:
            return {}
        if len(self.key_names) == 1:
            return {self.key_names[0]: key}
        return dict(zip(self.key_names, key))

    # -- timers -------------------------------------------------------------------------
    def _fired_already(self, start: int, kids: np.ndarray) -> np.ndarray:
        """Event time: has the window of ``start`` fired for each of ``kids`` (a record
        within the allowed lateness updates it and fires it again)?"""
        end = int(self._ends(np.array([start]))[0])
        return np.broadcast_to(end - 1 <= self.watermarks_of_key_ids(kids), kids.shape)

    def _register_timers(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """The timers of windows ``[starts, ends)`` scoped to ``kids`` (window start as the
        namespace): firing at ``end - 1``, cleanup at ``end - 1 + allowed_lateness``."""
        timers = self.timers
        if not self.assigner.event_time:
            timers.register_processing_time_timers(kids, starts, ends - 1)
            return
        # else it fired: a record within the lateness re-fires it at once
        pending = ends - 1 > self.watermarks_of_key_ids(kids)
        timers.register_event_time_timers(kids[pending], starts[pending], ends[pending] - 1)
        if self.lateness:
            timers.register_event_time_timers(kids, starts, ends - 1 + self.lateness)

    def _delete_timers(self, kid: int, start: int, end: int) -> None:
        self.timers.delete_event_time_timer(kid, start, end - 1)
        if self.lateness:
            self.timers.delete_event_time_timer(kid, start, end - 1 + self.lateness)

    def process_watermark(self, watermark: int) -> None:
        self.advance_watermark(watermark)
        self._on_timers(lambda: self.timers.advance_watermark(watermark))
        self.output.emit_watermark(watermark)

    def next_processing_time(self) -> int | None:
        return self.timers.next_processing_time()

    def on_processing_time(self, now_ms: int) -> None:
        self._on_timers(lambda: self.timers.fire_processing_time(now_ms))

    def finish(self) -> None:
        # Processing-time windows still open at the end of the input fire now
        # rather than vanish (their time would never come).
        if not self.assigner.event_time:
            self._on_timers(lambda: self.timers.fire_processing_time(np.iinfo(np.int64).max))

    def _on_timers(self, pop) -> None:
        """Fire the due timers ``pop`` returns, pop after pop until none is due; each
        pop's windows are emitted within its iteration, so before the next pop (on disk
        a bounded chunk) is a safe point."""
        while True:
            self.release_key_ids()  # a safe point: between batches and firings (chunks)
            timestamps, kids, starts = pop()
            if not len(timestamps):
                return
            self._sync_key_columns(None, None)  # on disk: keys of timers read back
            if self.session_store is not None:
                self._on_session_timers(self.session_store, timestamps, kids, starts)
                continue
            if self.disk_sessions is not None:  # the due keys' sessions: read, written back
                disk = self.disk_sessions
                distinct = np.unique(kids)
                keys = disk.entry_keys(distinct)
                store = disk.read(distinct, keys)
                held = _sessions_per_key(distinct, store.kids)
                self._on_session_timers(store, timestamps, kids, starts)
                # firing changes no session; only keys whose sessions went past their
                # lateness are written back (a pop holds many keys, most merely fired)
                changed = np.flatnonzero(_sessions_per_key(distinct, store.kids) != held)
                if len(changed):
                    disk.write(distinct[changed], [keys[i] for i in changed.tolist()], store)
                continue
            if self.disk_entries is not None:
                self._on_disk_entry_timers(self.disk_entries, timestamps, kids, starts)
                continue
            if not self.dense:
                with self._generic_loaded(kids):  # on disk: the due keys' sessions
                    self._on_generic_timers(timestamps, kids, starts)
                continue
            ends = self._ends(starts)
            fire = timestamps == ends - 1
            cleanup = timestamps == ends - 1 + self.lateness
            # a timer stands for its key group in its window
            groups = self.timers.key_groups_of(kids)
            if self.disk_panes is not None:
                due = fire | cleanup  # without lateness a firing timer cleans up too
                self._on_disk_timers(self.disk_panes, starts[due], groups[due], fire[due],
                                     cleanup[due])
                continue
            fired = self._dense_due(starts[fire], groups[fire])
            self._emit_dense(fired)
            cleared = (self._dense_due(starts[cleanup], groups[cleanup]) if self.lateness
                       else fired)  # without lateness the firing timer is the cleanup one
            for start, keys in cleared:
                self._clear_dense(start, keys)

    def _on_generic_timers(self, timestamps: np.ndarray, kids: np.ndarray,
                           starts: np.ndarray) -> None:
        """Due timers of the generic layout: firing ones emit their windows, cleanup ones
        (the firing ones, without lateness) drop them."""
        ends = np.array([self.entries.get((k, s), [0])[0]
                         for k, s in zip(kids.tolist(), starts.tolist())], dtype=np.int64)
        fire = timestamps == ends - 1
        cleanup = timestamps == ends - 1 + self.lateness
        fired = [(k, s) for k, s in zip(kids[fire].tolist(), starts[fire].tolist())
                 if (k, s) in self.entries]
        if fired:
            self._emit_generic(fired)
        for k, s in zip(kids[cleanup].tolist(), starts[cleanup].tolist()):
            self._clear_generic(k, s)

    # -- output ---------------------------------------------------------------------------
    def release_key_ids(self) -> bool:
        """On disk, the RocksDB layouts (panes, sessions of built-in aggregates, windows of
        user functions, whose sessions are in ``entries`` / ``sessions`` for one call only)
        keep no key id across batches and firings, so the timer service empties a full key
        table here, and the output key columns start anew with it."""
        if not isinstance(self.backend, DiskKeyedStateBackend):
            return False
        if not self.disk_timers.release_keys():
            return False
        self.key_columns = KeyColumns(self.key_names)
        return True

    def _sync_key_columns(self, ids: np.ndarray | None, distinct: DistinctKeys | None) -> None:
        """Keep :class:`KeyColumns` covering every key id the timer service knows."""
        known = self.timers.num_keys
        columns = self.key_columns
        if columns.covered == known:
            return
        if ids is not None:
            if distinct is None:
                raise TypeError("key ids given without the distinct keys they were made of")
            new = np.flatnonzero(ids >= columns.covered)
            if len(new) == known - columns.covered and np.array_equal(
                    ids[new], np.arange(columns.covered, known)):
                index = pa.array(new)
                columns.extend([array.take(index) for array in distinct.arrays])
                return
        columns.extend_python(self.timers.keys(np.arange(columns.covered, known)))

    def _emit_columns(self, kids: np.ndarray, starts, ends, results: dict[str, pa.Array]) -> None:
        n = len(kids)
        if not n:
            return
        self.fired += n
        columns = dict(zip(self.key_names, self.key_columns.take(kids))) if self.emit_keys else {}
        columns["window_start"] = pa.array(np.broadcast_to(starts, n).astype(np.int64))
        columns["window_end"] = pa.array(np.broadcast_to(ends, n).astype(np.int64))
        columns.update(results)
        self.output.emit(pa.RecordBatch.from_pydict(columns))

    # -- checkpoints ------------------------------------------------------------------------
    def keyed_snapshot_parts(self):
        parts = super().keyed_snapshot_parts()
        # Synchronous: flat copies of the dense windows' present entries, frozen accumulators.
        dense = self._dense_entries()
        freeze = self.function.frozen
        generic = [(kid, start, end, freeze(acc))
                   for (kid, start), (end, acc) in self.entries.items()]
        store = self.session_store  # its arrays are replaced, never changed: no copy
        sessions = ((store.kids, store.starts, store.ends, store.partials) if store is not None
                    else None)
        timers = self.timers

        def by_key_group(kids: np.ndarray, *arrays: np.ndarray, columns: dict[str, np.ndarray]):
            """(key group, keys, arrays, columns) slices: sorted by key group once."""
            groups = timers.key_groups_of(kids)
            order = np.argsort(groups, kind="stable")
            groups, kids = groups[order], kids[order]
            arrays = tuple(a[order] for a in arrays)
            columns = {n: c[order] for n, c in columns.items()}
            keys = timers.keys(kids)
            edges = [0, *(np.flatnonzero(np.diff(groups)) + 1).tolist(), len(kids)]
            for a, b in zip(edges[:-1], edges[1:]):
                yield (int(groups[a]), keys[a:b], tuple(x[a:b] for x in arrays),
                       {n: c[a:b] for n, c in columns.items()})

        def sections() -> dict[int, bytes]:
            by_group: dict[int, dict[str, Any]] = {}

            def section(group: int) -> dict[str, Any]:
                return by_group.setdefault(group, {"dense": None, "generic": [],
                                                   "sessions": None})

            kids, starts, columns = dense
            if len(kids):
                for group, keys, (starts_,), columns_ in by_key_group(kids, starts,
                                                                      columns=columns):
                    section(group)["dense"] = (starts_, keys, columns_)
            if sessions is not None and len(sessions[0]):
                kids, starts, ends, partials = sessions
                for group, keys, (starts_, ends_), partials_ in by_key_group(
                        kids, starts, ends, columns=partials):
                    section(group)["sessions"] = (keys, starts_, ends_, partials_)
            for kid, start, end, acc in generic:
                section(timers.key_group(kid))["generic"].append(
                    (timers.key(kid), start, end, acc))
            return {group: pickle.dumps((_WINDOW_STATE_VERSION, content), protocol=5)
                    for group, content in by_group.items()}
        parts["windows"] = sections
        return parts

    def _dense_entries(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """(key ids, window starts, partial columns) of every (key, window) the dense
        windows hold, as new flat arrays."""
        kids, starts, columns = [], [], {}
        for start, window in self.dense_windows.items():
            present = np.flatnonzero(window.present)
            kids.append(present)
            starts.append(np.full(len(present), start, dtype=np.int64))
            for name, column in window.columns.items():
                columns.setdefault(name, []).append(column[present])
        if not kids:
            return np.empty(0, np.int64), np.empty(0, np.int64), {}
        return (np.concatenate(kids), np.concatenate(starts),
                {n: np.concatenate(c) for n, c in columns.items()})

    def restore_keyed_parts(self, parts) -> None:
        sections = parts.pop("windows", [])
        super().restore_keyed_parts(parts)
        self._open_disk_panes()  # the backend is restored: its panes, if any
        for group, blob in sections:
            version, content = pickle.loads(blob)  # this job's own checkpoint file
            if version not in _READABLE_VERSIONS:
                raise ValueError(f"window '{self.name}': window state version {version} in key "
                                 f"group {group}; this raystream reads versions "
                                 f"{', '.join(map(str, _READABLE_VERSIONS))}")
            if content["dense"] is not None:
                self._restore_dense(group, *content["dense"])
            if self.disk_sessions is not None:  # a heap checkpoint into a disk job
                self._restore_heap_sessions(self.disk_sessions, group, content)
                continue
            if self.disk_entries is not None:  # a heap checkpoint into a disk job
                self._restore_heap_entries(self.disk_entries, group, content["generic"])
                continue
            store = self.session_store
            if content.get("sessions") is not None:
                if store is None:
                    raise ValueError(f"window '{self.name}': the checkpoint holds session "
                                     f"windows of built-in aggregates, this window is not one")
                keys, starts, ends, partials = content["sessions"]
                store.extend(self.timers.key_ids(keys, np.full(len(keys), group)), starts, ends,
                             partials)
            if store is not None and content["generic"]:  # version 2: sessions one by one
                entries = content["generic"]
                store.extend(self.timers.key_ids([e[0] for e in entries],
                                                 np.full(len(entries), group)),
                             np.array([e[1] for e in entries], dtype=np.int64),
                             np.array([e[2] for e in entries], dtype=np.int64),
                             {name: np.array([e[3][name] for e in entries])
                              for name in store.spec.partial_columns})
                continue
            for key, start, end, acc in content["generic"]:
                kid = self.timers.key_id(key, group)
                self.entries[(kid, start)] = [end, self.function.thawed(acc)]
                if self.assigner.merging:
                    self.sessions.setdefault(kid, []).append(start)
        if self.disk_generic_sessions is not None:  # a heap checkpoint into a disk job
            self.disk_generic_sessions.move_in(self.entries, self.sessions)

    def _restore_heap_sessions(self, disk: DiskSessions, group: int,
                               content: dict[str, Any]) -> None:
        """A heap checkpoint's open sessions of key group ``group`` into RocksDB (their
        timers are restored already)."""
        if content.get("sessions") is not None:
            keys, starts, ends, partials = content["sessions"]
        elif content["generic"]:  # version 2: sessions one by one
            entries = content["generic"]
            keys = [e[0] for e in entries]
            starts = np.array([e[1] for e in entries], dtype=np.int64)
            ends = np.array([e[2] for e in entries], dtype=np.int64)
            partials = {name: np.array([e[3][name] for e in entries])
                        for name in disk.spec.partial_columns}
        else:
            return
        disk.restore_heap(self.timers.key_ids(keys, np.full(len(keys), group)), starts, ends,
                          partials)

    def _restore_heap_entries(self, disk: DiskEntries, group: int, entries: list) -> None:
        """A heap checkpoint's (key, window) accumulators of key group ``group`` into
        RocksDB (a ``ProcessWindowFunction``'s rows as one chunk per window; their timers
        are restored already)."""
        if not entries:
            return
        kids = self.timers.key_ids([e[0] for e in entries], np.full(len(entries), group))
        disk.put(disk.entry_keys(kids, np.array([e[2] for e in entries], dtype=np.int64)),
                 np.array([e[1] for e in entries], dtype=np.int64),
                 [self.function.thawed(e[3]) for e in entries])

    def _restore_dense(self, group: int, starts: np.ndarray, keys: list,
                       columns: dict[str, np.ndarray]) -> None:
        kids = self.timers.key_ids(keys, np.full(len(keys), group))
        if self.dtypes is None:
            self.dtypes = {n: c.dtype for n, c in columns.items()}
        panes = self.disk_panes
        if panes is not None:  # a heap savepoint into a disk job: its timers are restored
            if panes.record is None:
                panes.set_dtypes(self.dtypes)
            panes.merge(self._ends(starts), kids, columns)
            return
        for start in np.unique(starts).tolist():
            mine = starts == start
            window = self._dense_window(start, self.timers.num_keys)
            for name, values in columns.items():
                window.columns[name][kids[mine]] = values[mine]
            window.present[kids[mine]] = True
            window.count += int(np.count_nonzero(mine))
            window.timed[group] = True  # its timers are in the restored timer sections


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
