"""The window operator: keyed windows on the timer service (Flink's ``WindowOperator``).

Per record batch: assign windows (vectorized), drop or side-output the rows
that are late for every window they belong to (a session row: when the session it
would merge into is late, judged by its key's open sessions), fold the rest into one
accumulator per (key, window), and register the window's timers at ``end - 1``
(plus a cleanup timer at ``end - 1 + allowed_lateness`` when there is
lateness). A timer firing emits the window's result; the cleanup timer drops
its state. A record that is late but within the allowed lateness updates its
window and re-emits the result at once.

What a window holds is kept by a *window store*
(:mod:`raystream.engine.windows.store`), one per state layout and backend, chosen once
when the state is initialised (:meth:`WindowOperator.open_store`):

* **dense** (tumbling/sliding/processing-time windows with built-in aggregates; the
  fast path, :mod:`raystream.engine.windows.dense`): numpy arrays of partials per
  window, indexed by key id, or on the disk backend RocksDB entries per (window, key);
  one timer per key group of a window instead of one per key;
* **sessions** (session windows with built-in aggregates,
  :mod:`raystream.engine.windows.session_windows`): every open session's key id,
  start, end and partials in flat arrays, merged with a batch by sorting;
* **generic** (user ``AggregateFunction``, full-window ``process``,
  :mod:`raystream.engine.windows.generic`): one accumulator object per (key, window);
  Python runs per (key, window) of a batch, and per row only inside a user function.

The operator also reads *partials* from an upstream pre-aggregator
(:mod:`raystream.engine.windows.pre_aggregate`) instead of raw rows.

State and timers are snapshotted per key group (part ``"windows"`` beside
``"state"`` and ``"timers"``; the disk backend's entries in its own sections), so
windows survive failover and rescaling.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from raystream.actors.operator import RestoredState
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.batches import rows_to_batch
from raystream.engine.keys import DistinctKeys, KeySelector
from raystream.engine.operators.functions import close_function, open_function
from raystream.engine.operators.keyed import KeyedOperator
from raystream.engine.watermarks import MAX_LATENESS_MS, timestamps_ms
from raystream.engine.windows import (disk_entries, disk_generic_sessions, disk_panes,
                                      disk_sessions)
from raystream.engine.windows.assigners import (CumulativeEventTimeWindows, GlobalWindows,
                                                SessionWindows, WindowAssigner)
from raystream.engine.windows.dense import DiskDenseWindows, HeapDenseWindows
from raystream.engine.windows.disk_entries import DiskChunks, DiskEntries
from raystream.engine.windows.disk_generic_sessions import DiskGenericSessions
from raystream.engine.windows.disk_panes import DiskPanes
from raystream.engine.windows.disk_sessions import DiskSessions
from raystream.engine.windows.functions import (BuiltinAggregates, ProcessWindow,
                                                UserAggregate, Window, WindowFunction)
from raystream.engine.windows.generic import (DiskGenericSessionWindows, DiskGenericWindows,
                                              HeapGenericWindows)
from raystream.engine.windows.session_windows import DiskSessionWindows, HeapSessionWindows
from raystream.engine.windows.sessions import Windows, late_for_sessions
from raystream.engine.windows.store import (WINDOW_START, Assigned, DiskWindowStore, DueTimers,
                                            WindowSection, WindowStore)
from raystream.engine.windows.triggered import (KIND as TRIGGERED_KIND,
                                                STATE_NAME as TRIGGERED_STATE,
                                                DiskTriggerEntries, HeapTriggerEntries,
                                                TriggeredWindows)
from raystream.engine.windows.triggers import Trigger, default_trigger
from raystream.timers.disk_service import DiskTimerService
from raystream.timers.protocol import Popped, TimeDomain

WINDOW_TIME = "window_end - 1"
"""``timestamp=WINDOW_TIME``: a window result's event time, ``window_end - 1`` (Flink's
``TimeWindow.maxTimestamp()``), read from its ``window_end`` column. It is the default
timestamp of a window's result stream, so a second windowed stage chains without naming
a column: a result is emitted before the watermark that fired it, so the next stage never
finds it late (unless it is a late re-firing within the allowed lateness)."""
LATE_LOG_INTERVAL_S = 60.0  # at most one "dropped late records" log per operator per interval

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    """Processing time: the wall clock in ms since the epoch."""
    return int(time.time() * 1000)


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


def _concat(chunks: list[pa.Array]) -> pa.Array:
    kind = chunks[0].type
    return pa.concat_arrays([c if c.type == kind else c.cast(kind) for c in chunks])


class WindowOperator(KeyedOperator):
    """Keyed windows over ``assigner``, computing ``function`` per (key, window); what the
    windows hold is in its :attr:`store` (a :class:`~raystream.engine.windows.store.
    WindowStore`), through which it is the store's
    :class:`~raystream.engine.windows.store.WindowHost`."""

    # on the disk backend every layout keeps its state in RocksDB (part "windows" is empty)
    supports_disk_state = True
    disk_only_kinds = (disk_panes.KIND, disk_sessions.KIND, disk_entries.KIND,
                       disk_entries.CHUNKS_KIND,
                       disk_generic_sessions.KIND, TRIGGERED_KIND)
    label = "window"

    def __init__(self, name: str, keys: KeySelector, assigner: WindowAssigner, *,
                 function: WindowFunction, timestamp: str | None, allowed_lateness_ms: int = 0,
                 late_output: str | None = None, partial_input: bool = False,
                 schema: pa.Schema | None = None, emit_keys: bool = True,
                 trigger: Trigger | None = None,
                 clock: Callable[[], int] = wall_clock_ms) -> None:
        super().__init__(name, keys)
        self.clock = clock  # processing time's (a test drives its own)
        default = default_trigger(assigner)
        self.trigger = default if trigger is None else trigger
        # a trigger of its own (or a global window): the triggered store
        self.triggered = isinstance(assigner, GlobalWindows) or self.trigger != default
        if (assigner.event_time or self.trigger.record_times) and not timestamp \
                and not partial_input:
            raise ValueError(f"window '{name}': event-time windows and triggers need the "
                             f"timestamp column (window(..., timestamp='ts'); a window's "
                             f"results have the default rs.WINDOW_TIME)")
        if self.triggered and (assigner.merging or partial_input):
            raise ValueError(f"window '{name}': session windows keep their default trigger "
                             f"({type(default).__name__}), got {self.trigger}")
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
        self.key_names = list(keys.columns) if keys.columns else ["key"]
        self.emit_keys = emit_keys  # False for window_all: its key column is internal
        self.late_dropped = 0
        self._late_logged_at: float | None = None  # monotonic time of the last late-drop log
        self._late_logged_count = 0  # late_dropped at that log
        self.late_side_output = 0
        self.fired = 0
        self._store: WindowStore | None = None

    @property
    def event_time(self) -> bool:
        return self.assigner.event_time

    @property
    def max_parallelism(self) -> int:
        return self.ctx.max_parallelism

    def now_ms(self) -> int:
        return self.clock()

    @property
    def store(self) -> WindowStore:
        if self._store is None:
            raise RuntimeError(f"window '{self.name}': its state is not initialised")
        return self._store

    # -- life cycle ---------------------------------------------------------------------
    def initialize_state(self, restored: RestoredState | None) -> None:
        self._store = None
        super().initialize_state(restored)  # timers first, then our part "windows"
        if self._store is None:  # nothing restored
            self._store = self.open_store()
        self.key_columns = KeyColumns(self.key_names)
        self._sync_key_columns(None, None)

    def open_store(self) -> WindowStore:
        """The store for this window's layout and backend: once the backend's state is
        restored (a disk store finds its entries in it)."""
        backend = self.backend
        if isinstance(backend, DiskKeyedStateBackend):
            return self.disk_store_over(backend, self.disk_timers)
        if self.triggered:
            return TriggeredWindows(self, self.trigger, HeapTriggerEntries())
        fn = self.function
        if isinstance(fn, BuiltinAggregates):
            return (HeapSessionWindows(self, fn.spec) if self.assigner.merging
                    else HeapDenseWindows(self, fn.spec))
        return HeapGenericWindows(self)

    def disk_store_over(self, backend: DiskKeyedStateBackend, timers: DiskTimerService
                        ) -> DiskWindowStore:
        """The disk store of this window's layout over ``backend`` (this subtask's, or a
        scratch database holding a disk savepoint for a heap job)."""
        fn, merging, where = self.function, self.assigner.merging, f"window '{self.name}'"
        if self.triggered:
            return TriggeredWindows(self, self.trigger, DiskTriggerEntries(DiskEntries(
                backend, timers, name=TRIGGERED_STATE, kind=TRIGGERED_KIND)))
        if isinstance(fn, BuiltinAggregates):
            if merging:
                return DiskSessionWindows(self, fn.spec,
                                          DiskSessions(backend, fn.spec, timers, where=where))
            return DiskDenseWindows(self, fn.spec,
                                    DiskPanes(backend, fn.spec, timers, where=where))
        rows = isinstance(fn, ProcessWindow)
        if merging:
            return DiskGenericSessionWindows(self, DiskGenericSessions(backend, timers,
                                                                       rows=rows))
        # a ProcessWindowFunction's rows: appended chunks, not one growing entry
        return DiskGenericWindows(self, (DiskChunks if rows else DiskEntries)(backend, timers))

    def open(self) -> None:
        fn = getattr(self.function, "fn", None)
        if fn is not None:
            open_function(fn, self.ctx)

    def close(self) -> None:
        fn = getattr(self.function, "fn", None)
        if fn is not None:
            close_function(fn)

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
            if self.assigner.event_time or self.trigger.record_times:
                if self.timestamp is None:  # __init__ requires it for event time
                    raise ValueError(f"window '{self.name}': event-time windows need the "
                                     f"timestamp column")
                times = event_times(batch, self.timestamp, where=f"window '{self.name}'")
            else:
                times = np.full(batch.num_rows, self.now_ms(), dtype=np.int64)
            rows, starts = self.assigner.assign(times)
        if isinstance(self.assigner, SessionWindows):  # each row's gap: [ts, ts + gap)
            ends = starts + self.assigner.gaps(batch, where=f"window '{self.name}'")[rows]
        else:
            ends = self.window_ends(starts)
        self.store.add(batch, Assigned(rows, starts, ends, key_ids[rows],
                                       times[rows] if self.triggered else None))

    def window_ends(self, starts: np.ndarray) -> np.ndarray:
        """The ends of fixed windows of ``starts`` (a session's end is its own)."""
        assigner = self.assigner
        if isinstance(assigner, SessionWindows):
            raise TypeError(f"window '{self.name}': a session window's end is its own, not "
                            f"its start's")
        return assigner.end_of(starts)

    def window_starts(self, starts: np.ndarray) -> np.ndarray:
        """The emitted starts of the windows a store knows by ``starts``: their own, but
        a cumulating window's is its cumulation's (a store knows it by ``end - max_size``,
        :class:`~raystream.engine.windows.assigners.CumulativeEventTimeWindows`)."""
        assigner = self.assigner
        if isinstance(assigner, CumulativeEventTimeWindows):
            return assigner.start_of(starts)
        return starts

    def judge_late(self, batch: pa.RecordBatch, assigned: Assigned,
                   held: Callable[[np.ndarray], Windows] | None = None) -> Assigned:
        """Keep assignments to windows that are not late; rows late for all of their
        windows go to the late side output (or are dropped and counted). A partial
        (pre-aggregated input) is one assignment: late or not as a whole, by the same rule,
        since all its rows belong to its window. For session windows a row is late only
        when the session it would merge into is (:func:`late_for_sessions`; ``held(keys)``:
        the keys' open sessions)."""
        if not self.assigner.event_time:
            return assigned
        kids, starts, ends = assigned.kids, assigned.starts, assigned.ends
        late = ends - 1 + self.lateness <= self.watermarks_of_key_ids(kids)
        if late.any() and self.assigner.merging:
            if held is None:
                raise TypeError(f"window '{self.name}': session windows judge late rows by "
                                f"their keys' open sessions")
            late = late_for_sessions(kids, starts, ends, late, held,
                                     self.watermarks_of_key_ids, self.lateness)
        if not late.any():
            return assigned
        on_time_rows = np.zeros(batch.num_rows, dtype=bool)
        on_time_rows[assigned.rows[~late]] = True
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
        return assigned.where(~late)

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

    # -- timers -------------------------------------------------------------------------
    def register_timers(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
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

    def delete_timers(self, kid: int, start: int, end: int) -> None:
        self.timers.delete_event_time_timer(kid, start, end - 1)
        if self.lateness:
            self.timers.delete_event_time_timer(kid, start, end - 1 + self.lateness)

    def process_watermark(self, watermark: int) -> None:
        self.advance_watermark(watermark)
        self._on_timers(lambda: self.timers.advance_watermark(watermark), TimeDomain.EVENT_TIME,
                        self.now_ms())
        self.output.emit_watermark(watermark)

    def next_processing_time(self) -> int | None:
        return self.timers.next_processing_time()

    def on_processing_time(self, now_ms: int) -> None:
        self._on_timers(lambda: self.timers.fire_processing_time(now_ms),
                        TimeDomain.PROCESSING_TIME, now_ms)

    def finish(self) -> None:
        # Processing-time windows and timers still open at the end of the input fire now
        # rather than vanish (their time would never come).
        if not self.assigner.event_time or TimeDomain.PROCESSING_TIME in self.trigger.domains:
            end = int(np.iinfo(np.int64).max)
            self._on_timers(lambda: self.timers.fire_processing_time(end),
                            TimeDomain.PROCESSING_TIME, end)

    def _on_timers(self, pop: Callable[[], Popped], domain: TimeDomain, now_ms: int) -> None:
        """Fire the due timers ``pop`` returns, pop after pop until none is due; each
        pop's windows are emitted within its iteration, so before the next pop (on disk
        a bounded chunk) is a safe point."""
        while True:
            self.release_key_ids()  # a safe point: between batches and firings (chunks)
            timestamps, kids, starts = pop()
            if not len(timestamps):
                return
            # emit_results syncs the key columns
            self.store.fire(DueTimers(timestamps, kids, starts, domain, now_ms))

    # -- output ---------------------------------------------------------------------------
    def release_key_ids(self) -> bool:
        """On disk, every store keeps no key id across batches and firings, so the timer
        service empties a full key table here, and the output key columns start anew with
        it."""
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

    def emit_results(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     results: dict[str, pa.Array]) -> None:
        n = len(kids)
        if not n:
            return
        self._sync_key_columns(None, None)  # on disk: restored keys read for the first time
        self.fired += n
        columns = dict(zip(self.key_names, self.key_columns.take(kids))) if self.emit_keys else {}
        columns["window_start"] = pa.array(
            self.window_starts(np.broadcast_to(starts, n).astype(np.int64)))
        columns["window_end"] = pa.array(np.broadcast_to(ends, n).astype(np.int64))
        columns.update(results)
        self.output.emit(pa.RecordBatch.from_pydict(columns))

    def emit_windows(self, fired: list[tuple[int, int, int, Any]]) -> None:
        fn, timers = self.function, self.timers
        out: list[dict] = []
        self.fired += len(fired)
        starts = self.window_starts(np.fromiter((f[1] for f in fired), np.int64, len(fired)))
        for (kid, _, end, acc), start in zip(fired, starts.tolist()):
            window, key = Window(start, end), timers.key(kid)
            if isinstance(fn, UserAggregate):
                out.extend(fn.rows(self._key_fields(key), window, acc))
            else:
                out.extend(fn.rows(key if self.emit_keys else None, window, acc))
        if out:
            self.output.emit(rows_to_batch(out, schema=self.schema,
                                           where=f"window '{self.name}'"))

    def _key_fields(self, key: Any) -> dict:
        if not self.emit_keys:
            return {}
        if len(self.key_names) == 1:
            return {self.key_names[0]: key}
        return dict(zip(self.key_names, key))

    # -- checkpoints ------------------------------------------------------------------------
    def keyed_snapshot_parts(self):
        parts = super().keyed_snapshot_parts()
        capture = self.store.capture()  # synchronous: copies, frozen accumulators
        parts["windows"] = lambda: {group: section.encode()
                                    for group, section in capture().items()}
        return parts

    def restore_keyed_parts(self, parts) -> None:
        blobs = parts.pop("windows", [])
        super().restore_keyed_parts(parts)
        store = self._store = self.open_store()  # the backend is restored: its entries
        where = f"window '{self.name}'"
        for group, blob in blobs:
            store.restore(group, WindowSection.decode(blob, group=group, where=where))
        moved = self.moved_disk_state
        if moved is not None:  # a disk savepoint's windows, for this heap job
            for group, section in self.disk_store_over(moved.backend, moved.timers).export():
                store.restore(group, section)
        store.restored()
