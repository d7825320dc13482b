"""Window join and window co-group of two streams (Flink's ``JoinedStreams`` / ``CoGroupedStreams``).

``left.join(right).where(key_left).equal_to(key_right).window(assigner, timestamp="ts")``
pairs, per window, every left row with every right row of the same key (an inner
join per window); ``co_group`` instead hands a function all rows of a key's window
from both sides, also when one side has none.

    >>> import raystream as rs
    >>> env = rs.StreamEnvironment(parallelism=2)
    >>> clicks = env.from_collection([{"user": 1, "ts": 100, "page": "home"}])
    >>> buys = env.from_collection([{"user": 1, "ts": 900, "item": "pen"}])
    >>> joined = clicks.join(buys).where("user").equal_to("user") \\
    ...     .window(rs.TumblingEventTimeWindows(size_ms=1000), timestamp="ts").join()
    >>> env.execute("window-join").table(joined.collect()).to_pylist()  # doctest: +SKIP
    [{'user': 1, 'ts': 100, 'page': 'home', 'user_right': 1, 'ts_right': 900, 'item': 'pen',
      'window_start': 0, 'window_end': 1000}]

Finishing a join:

* ``.join(right_suffix="_right", left_suffix="_left")``: vectorized. Each fired
  window's rows of both sides meet in one Arrow hash join (``pyarrow.Table.join``
  on key id and window), and the pairs are emitted as Arrow batches: the left
  columns, the right columns, then ``window_start`` and ``window_end``. A right
  column named like a left column gets ``right_suffix``; a column of either side
  named ``window_start`` or ``window_end`` gets its side's suffix.
* ``.apply(fn)``: ``fn(left_row, right_row)`` per pair (dict rows, Flink's
  ``JoinFunction``) returns a row or None (no output for that pair).

Finishing a co-group: ``.apply(fn)`` with ``fn(key, left, right, window)`` once
per key and window that has rows on either side: ``left`` and ``right`` are
``pyarrow.Table`` s of that key's rows in the window (one of them may be empty),
``window`` a :class:`~raystream.engine.windows.functions.Window`; it returns or
yields dict rows (or None).

Rows a function returns get the window's ``window_start`` / ``window_end``
columns unless they have them, so every result has Flink's event time
``window_end - 1`` (``rs.WINDOW_TIME``): a window on the results needs no
``timestamp=``.

How it runs (Flink's semantics; no Python per row on the built-in path):

* Windows are event time: tumbling, sliding or session. A row belongs to the
  windows its side's timestamp assigns it to; for sessions, the rows of *both*
  sides of a key make the sessions (gaps of more than ``gap_ms`` split them).
* A row late for every window it belongs to (``end - 1 <= watermark``, the window
  operator's rule; for sessions, a row whose own window ``[ts, ts + gap)`` ended is
  late only when no open session of its key, made by both sides' rows, takes it in:
  :func:`~raystream.engine.windows.sessions.late_for_sessions`) is dropped
  and counted: ``late_records_dropped`` (and per side) in the operator's metrics,
  and a warning logged at most once a minute.
* Each side's rows are buffered as Arrow tables (one copy per window a row is
  in, as Flink keeps one per window) with their window start and key id. A
  watermark ``W`` fires every window with ``end - 1 <= W``: its rows are joined
  or co-grouped, emitted, and dropped from the buffers.
* Buffers are keyed state, snapshotted per key group (part ``"join"``), so they
  survive failover and follow their key groups when the job is rescaled.
* On the disk state backend, tumbling and sliding windows keep the buffered rows
  in the subtask's RocksDB (:class:`~raystream.engine.operators.disk_join.DiskWindowRows`:
  one range scan and one range deletion per key group and window when it fires),
  and session windows keep each key's open sessions in a small header entry and
  both sides' rows in chunk entries beside it
  (:class:`~raystream.engine.windows.disk_session_join.DiskSessionRows`: a batch
  reads its keys' headers with one multi-get and writes its rows as new chunks,
  never reading or rewriting the stored ones; a firing reads the due keys' chunks;
  a session's timer at its end names the key to fire), carried by that backend's
  snapshots.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np
import pyarrow as pa

from raystream.engine.batches import capture_row, rows_to_batch
from raystream.engine.errors import BadRecordError, describe_record
from raystream.engine.graph import InputEdge
from raystream.engine.keys import KeySelector, KeySpec
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.operators import disk_join
from raystream.engine.operators.disk_join import DiskWindowRows
from raystream.engine.operators.functions import close_function, open_function
from raystream.engine.operators.keyed_rows import (BufferedJoinOperator, JoinSide, KeyedRows,
                                                   joined_names)
from raystream.engine.windows import disk_session_join
from raystream.engine.windows.assigners import (CumulativeEventTimeWindows,
                                                DynamicEventTimeSessionWindows,
                                                EventTimeSessionWindows, GlobalWindows,
                                                SlidingEventTimeWindows,
                                                TumblingEventTimeWindows, WindowAssigner)
from raystream.engine.windows.disk_session_join import DiskSessionRows
from raystream.engine.windows.functions import Window
from raystream.engine.windows.sessions import Windows, late_for_sessions
from raystream.engine.windows.operator import LATE_LOG_INTERVAL_S, WINDOW_TIME, event_times
from raystream.timers.disk_service import DiskTimerService

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream

_START = "__window_start"  # a buffered row's window start (session: its timestamp) in snapshots
WINDOW_COLUMNS = ("window_start", "window_end")
_NONE = np.empty(0, np.int64)

log = logging.getLogger(__name__)

JoinWindows = TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows

JoinFunction = Callable[[dict, dict], "dict | None"]
CoGroupFunction = Callable[[Any, pa.Table, pa.Table, Window], "Iterable[dict] | None"]


class WindowJoinKind(enum.Enum):
    """What a fired window's rows become."""

    JOIN = "join"          # pairs of equal keys: joined rows, or fn(left, right) per pair
    CO_GROUP = "co_group"  # fn(key, left rows, right rows, window) per key with rows


@dataclass(frozen=True)
class WindowJoinSpec:
    """What a window join operator needs: the windows, key selector and timestamp
    column per side, and the suffixes of clashing column names in the joined rows."""

    kind: WindowJoinKind
    assigner: WindowAssigner
    keys: tuple[KeySelector, KeySelector]
    timestamps: tuple[str, str]
    left_suffix: str = "_left"
    right_suffix: str = "_right"

    def __post_init__(self) -> None:
        if isinstance(self.assigner, DynamicEventTimeSessionWindows):
            raise ValueError(f"{self.kind.value}(...).window: session windows of a dynamic "
                             f"gap cannot join (a row's gap would be its side's); use "
                             f"EventTimeSessionWindows(gap_ms=...)")
        if isinstance(self.assigner, CumulativeEventTimeWindows):
            raise ValueError(f"{self.kind.value}(...).window: cumulating windows cannot join "
                             f"(their windows share a start); join over tumbling, sliding "
                             f"or session windows")
        if not self.assigner.event_time:
            raise ValueError(f"{self.kind.value}(...).window: only event-time windows "
                             f"(tumbling, sliding, session) can join, got "
                             f"{type(self.assigner).__name__}")
        if not self.left_suffix or not self.right_suffix or self.left_suffix == self.right_suffix:
            raise ValueError(f"{self.kind.value}: left_suffix and right_suffix must be "
                             f"different non-empty strings, got {self.left_suffix!r} and "
                             f"{self.right_suffix!r}")

    @property
    def windows(self) -> JoinWindows:
        """The assigner, of a kind a join takes (``__post_init__`` refused the others)."""
        assigner = self.assigner
        if isinstance(assigner, (DynamicEventTimeSessionWindows, GlobalWindows,
                                 CumulativeEventTimeWindows)):
            raise TypeError(f"a window join over {type(assigner).__name__}")
        return assigner

    def output_names(self, left: list[str], right: list[str], where: str) -> list[str]:
        """Names of the joined rows' columns: left, right, ``window_start``, ``window_end``.

            >>> from raystream.engine.windows.assigners import TumblingEventTimeWindows
            >>> spec = WindowJoinSpec(WindowJoinKind.JOIN, TumblingEventTimeWindows(10),
            ...                       (KeySelector.of("k"),) * 2, ("ts", "ts"))
            >>> spec.output_names(["k", "window_end"], ["k", "x"], where="example")
            ['k', 'window_end_left', 'k_right', 'x', 'window_start', 'window_end']
        """
        names = [n + self.left_suffix if n in WINDOW_COLUMNS else n for n in left]
        if len(set(names)) < len(names) or set(names) & set(WINDOW_COLUMNS):
            raise ValueError(f"{where}: left columns {left} clash with the window columns even "
                             f"with suffix {self.left_suffix!r}; choose another left_suffix")
        return [*joined_names(names, right, self.right_suffix, where=where,
                              reserved=WINDOW_COLUMNS), *WINDOW_COLUMNS]


class _LateLog:
    """Logs dropped late rows: at the first drop, then at most once every
    :data:`LATE_LOG_INTERVAL_S` seconds with the count since the last log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.logged_at: float | None = None
        self.logged_count = 0

    def dropped(self, total: int) -> None:
        now = time.monotonic()
        if self.logged_at is not None and now - self.logged_at < LATE_LOG_INTERVAL_S:
            return
        log.warning("window join '%s' dropped %d late record(s) (%d in total; a row is late "
                    "when every window it belongs to has fired)",
                    self.name, total - self.logged_count, total)
        self.logged_at, self.logged_count = now, total


@dataclass(frozen=True)
class _Fired:
    """The rows of one side in windows that fire, with each row's window."""

    rows: KeyedRows  # ts: window start
    ends: np.ndarray


class WindowJoinOperator(BufferedJoinOperator):
    """The two-input keyed operator behind ``join(...)`` / ``co_group(...)`` windows.

    ``fn`` None (joins only): emit joined rows as Arrow batches. Otherwise a
    :data:`JoinFunction` per pair or a :data:`CoGroupFunction` per key and window.
    """

    # on the disk backend the rows are in RocksDB: by window (DiskWindowRows), or for
    # sessions (merging) by key (DiskSessionRows)
    supports_disk_state = True
    disk_only_kinds = (disk_join.WINDOW_KIND, disk_session_join.KIND, disk_join.SCHEMA_KIND)
    label = "window join"
    disk_rows: DiskWindowRows | DiskSessionRows | None

    def __init__(self, name: str, spec: WindowJoinSpec, fn: Callable | None = None, *,
                 schema: pa.Schema | None = None) -> None:
        super().__init__(name, spec.keys[0])
        if fn is None and spec.kind is WindowJoinKind.CO_GROUP:
            raise TypeError(f"operator '{name}': co_group(...).apply needs a function "
                            f"fn(key, left, right, window)")
        if fn is not None and not callable(fn):
            raise TypeError(f"operator '{name}': {spec.kind.value}(...).apply needs a "
                            f"callable, got {type(fn).__name__}")
        self.spec = spec
        self.fn = fn
        self.schema = schema
        self._late_log = _LateLog(name)
        # the columns of each side's rows (for a co-group's empty side), once seen
        self.schemas: list[pa.Schema | None] = [None, None]

    # -- lifecycle -----------------------------------------------------------------------
    def disk_rows_over(self, backend: DiskKeyedStateBackend, timers: DiskTimerService
                       ) -> DiskWindowRows | DiskSessionRows:
        assigner = self.spec.windows
        if isinstance(assigner, EventTimeSessionWindows):
            return DiskSessionRows(backend, timers, assigner.gap_ms)
        return DiskWindowRows(backend, timers)

    def open(self) -> None:
        if self.fn is not None:
            open_function(self.fn, self.ctx)

    def close(self) -> None:
        if self.fn is not None:
            close_function(self.fn)

    # -- records -------------------------------------------------------------------------
    def _where(self, side: JoinSide) -> str:
        return f"window {self.spec.kind.value} '{self.name}' ({side.name.lower()} input)"

    def _key_ids(self, batch: pa.RecordBatch, side: JoinSide) -> np.ndarray:
        distinct = self.spec.keys[side].distinct_keys(batch, self.ctx.max_parallelism)
        return self.timers.key_ids(distinct.keys, distinct.groups)[distinct.inverse]

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        self.release_key_ids()  # a safe point: between batches and firings
        side = JoinSide(input_index)
        self.schemas[side] = batch.schema
        ts = event_times(batch, self.spec.timestamps[side], where=self._where(side))
        kid = self._key_ids(batch, side)
        assigner = self.spec.windows
        rows, starts = assigner.assign(ts)
        ends = (starts + assigner.gap_ms if isinstance(assigner, EventTimeSessionWindows)
                else assigner.end_of(starts))  # sessions (merging) end a gap after the last
        late = ends - 1 <= self.watermarks_of_key_ids(kid[rows])
        disk = self.disk_rows
        if isinstance(disk, DiskSessionRows):  # late rows judged by the headers it reads
            # (a session assigner gives each row one window: rows is every row, in order)
            dropped = disk.append(side, KeyedRows(pa.Table.from_batches([batch]), starts, kid),
                                  late=late, watermarks=self.watermarks_of_key_ids)
            self._count_late(side, int(np.count_nonzero(dropped)))
            return
        if late.any() and isinstance(assigner, EventTimeSessionWindows):
            late = late_for_sessions(kid[rows], starts, ends, late, self._buffered_windows,
                                     self.watermarks_of_key_ids, 0)
        if late.any():
            on_time = ~late
            self._count_late(side, batch.num_rows - len(np.unique(rows[on_time])))
            rows, starts = rows[on_time], starts[on_time]
            if not len(rows):
                return
        table = pa.Table.from_batches([batch])
        if not (len(rows) == batch.num_rows and bool(np.all(rows == np.arange(len(rows))))):
            table = table.take(pa.array(rows))
        if disk is None:
            self.buffers[side].append(KeyedRows(table, starts, kid[rows]))
        else:
            disk.append(side, KeyedRows(table, starts, kid[rows]))

    def _count_late(self, side: JoinSide, late: int) -> None:
        if late:
            self.late_dropped[side] += late
            self._late_log.dropped(sum(self.late_dropped))

    def _buffered_windows(self, keys: np.ndarray) -> Windows:
        """The own windows ``[ts, ts + gap)`` of both sides' buffered rows of the key ids
        ``keys`` (session joins on the heap: the rows are the sessions)."""
        assigner = self.spec.windows
        if not isinstance(assigner, EventTimeSessionWindows):
            raise TypeError(f"window join '{self.name}': rows are sessions for session "
                            f"windows only")
        held = [rows for rows in (b.combined() for b in self.buffers) if rows is not None]
        mine = [np.isin(rows.kid, keys) for rows in held]
        kids = np.concatenate([r.kid[m] for r, m in zip(held, mine)] or [_NONE])
        ts = np.concatenate([r.ts[m] for r, m in zip(held, mine)] or [_NONE])
        return Windows(kids, ts, ts + assigner.gap_ms)

    # -- time ----------------------------------------------------------------------------
    def process_watermark(self, watermark: int) -> None:
        self.advance_watermark(watermark)
        # the operator's own watermark: a restored key group's floor can be further, but
        # its windows up to the floor fired before the checkpoint (none is buffered)
        self._fire(self.current_watermark)
        self.output.emit_watermark(watermark)

    def _fire(self, watermark: int) -> None:
        self.release_key_ids()  # a safe point: between batches and firings
        size = self.spec.windows.max_size_ms
        if isinstance(self.disk_rows, DiskSessionRows):
            # chunk by chunk of due timers, each emitted before the next: a safe point
            while (taken := self.disk_rows.take_due(watermark)) is not None:
                fired = self._fired_of(taken)
                if fired is not None:
                    self._emit_fired(*fired)
                self.release_key_ids()
            return
        if self.disk_rows is not None:
            fired = self._take_fired_disk(self.disk_rows, watermark)
        elif not any(b.min_ts is not None and b.min_ts + size - 1 <= watermark
                     for b in self.buffers):
            return  # no window of a buffered row can have ended
        else:
            fired = self._take_fired(watermark)
        if fired is not None:
            self._emit_fired(*fired)

    def _emit_fired(self, left: _Fired, right: _Fired) -> None:
        """Join, co-group or apply the rows of the windows that fired."""
        if self.spec.kind is WindowJoinKind.CO_GROUP:
            self._co_group(left, right)
        elif self.fn is None:
            self._join(left, right)
        else:
            self._apply(left, right)

    def _take_fired(self, watermark: int) -> tuple[_Fired, _Fired] | None:
        """Remove from the buffers the rows of windows that end by ``watermark``."""
        rows = [b.combined() for b in self.buffers]
        empty = KeyedRows(pa.table({}), np.empty(0, np.int64), np.empty(0, np.int64))
        rows = [r if r is not None else empty for r in rows]
        assigner = self.spec.windows
        if isinstance(assigner, EventTimeSessionWindows):  # merging: sessions over both sides' rows
            n_left = len(rows[0].ts)
            starts, ends = _sessions(np.concatenate([rows[0].kid, rows[1].kid]),
                                     np.concatenate([rows[0].ts, rows[1].ts]), assigner.gap_ms)
            windows = [(starts[:n_left], ends[:n_left]), (starts[n_left:], ends[n_left:])]
        else:
            windows = [(r.ts, assigner.end_of(r.ts)) for r in rows]
        fired = []
        for side, side_rows, (starts, ends) in zip(JoinSide, rows, windows):
            due = ends - 1 <= watermark
            index = np.flatnonzero(due)
            taken = side_rows.take(index) if len(index) else empty
            fired.append(_Fired(KeyedRows(taken.table, starts[index], taken.kid), ends[index]))
            if len(index):
                self.buffers[side].keep_rows(~due)
        if not any(len(f.ends) for f in fired):
            return None
        return fired[0], fired[1]

    def _take_fired_disk(self, disk: DiskWindowRows, watermark: int
                         ) -> tuple[_Fired, _Fired] | None:
        """Read and delete the disk rows of windows that end by ``watermark``."""
        assigner = self.spec.windows
        due = sorted(s for s in disk.windows if s + assigner.max_size_ms - 1 <= watermark)
        if not due:
            return None
        left, right = disk.take(due)
        size = assigner.max_size_ms  # not sessions
        return self._fired_of((None if left is None else (left, left.ts + size),
                               None if right is None else (right, right.ts + size)))

    def _fired_of(self, taken: tuple[tuple[KeyedRows, np.ndarray] | None, ...]
                  ) -> tuple[_Fired, _Fired] | None:
        """Each side's rows read from disk (with their windows' ends) as fired rows;
        None when neither side has any."""
        if all(t is None for t in taken):
            return None
        empty = KeyedRows(pa.table({}), np.empty(0, np.int64), np.empty(0, np.int64))
        fired = []
        for side, found in zip(JoinSide, taken):
            if found is None:
                fired.append(_Fired(empty, np.empty(0, np.int64)))
                continue
            rows, ends = found
            if self.schemas[side] is None:  # restored: the schema of a co-group's empty side
                self.schemas[side] = rows.table.schema
            fired.append(_Fired(rows, ends))
        return fired[0], fired[1]

    # -- output --------------------------------------------------------------------------
    @staticmethod
    def _pairs(left: _Fired, right: _Fired) -> tuple[np.ndarray, np.ndarray]:
        """(left row, right row) of every pair of equal key id and window: one Arrow
        hash join of the two sides' (key id, window start, row number)."""
        if not len(left.ends) or not len(right.ends):
            empty = np.empty(0, np.int64)
            return empty, empty
        probe = pa.table({"kid": left.rows.kid, "start": left.rows.ts,
                          "left": np.arange(len(left.ends))})
        build = pa.table({"kid": right.rows.kid, "start": right.rows.ts,
                          "right": np.arange(len(right.ends))})
        # one thread: a firing's join is small, and a subtask has its core to itself
        pairs = probe.join(build, keys=["kid", "start"], join_type="inner", use_threads=False)
        return (pairs["left"].to_numpy().astype(np.int64),
                pairs["right"].to_numpy().astype(np.int64))

    def _join(self, left: _Fired, right: _Fired) -> None:
        li, ri = self._pairs(left, right)
        if not len(li):
            return
        left_rows = left.rows.table.take(pa.array(li))
        right_rows = right.rows.table.take(pa.array(ri))
        names = self.spec.output_names(left_rows.column_names, right_rows.column_names,
                                       where=f"window join '{self.name}'")
        columns = [*left_rows.columns, *right_rows.columns,
                   pa.array(left.rows.ts[li]), pa.array(left.ends[li])]
        for batch in pa.Table.from_arrays(columns, names=names).combine_chunks().to_batches():
            self.output.emit(batch)

    def _apply(self, left: _Fired, right: _Fired) -> None:
        li, ri = self._pairs(left, right)
        if not len(li):
            return
        fn, out, windows = self.fn, [], []
        for l_row, r_row, w in zip(left.rows.table.take(pa.array(li)).to_pylist(),
                                   right.rows.table.take(pa.array(ri)).to_pylist(),
                                   li.tolist()):
            try:
                row = fn(l_row, r_row)  # type: ignore[misc]
            except Exception as exc:
                exc.add_note(f"pair: left {describe_record(l_row)}, right "
                             f"{describe_record(r_row)}")
                raise
            if row is not None:
                out.append(capture_row(row))
                windows.append(w)
        index = np.array(windows, dtype=np.int64)
        self._emit(out, left.rows.ts[index], left.ends[index])

    def _co_group(self, left: _Fired, right: _Fired) -> None:
        """``fn`` once per (key, window) with rows on either side, in (key id, start)
        order; each side's rows of it are one slice of that side sorted by window."""
        sides = [_Groups.of(f) for f in (left, right)]
        groups = sorted(set(sides[0].ranges) | set(sides[1].ranges))
        empties = [f.rows.table.slice(0, 0) if f.rows.table.num_columns
                   else (schema or pa.schema([])).empty_table()
                   for f, schema in zip((left, right), self.schemas)]
        timers, fn, out, starts, ends = self.timers, self.fn, [], [], []
        for kid, start in groups:
            tables, end = [], 0
            for side, empty in zip(sides, empties):
                span = side.ranges.get((kid, start))
                if span is None:
                    tables.append(empty)
                else:
                    tables.append(side.table.slice(span[0], span[1] - span[0]))
                    end = int(side.ends[span[0]])
            key = timers.key(kid)
            try:
                produced = fn(key, tables[0], tables[1], Window(start, end))  # type: ignore[misc]
                produced = list(map(capture_row, produced)) if produced is not None else []
            except Exception as exc:
                exc.add_note(f"co_group of key {key!r} in window [{start}, {end})")
                raise
            out.extend(produced)
            starts.extend([start] * len(produced))
            ends.extend([end] * len(produced))
        self._emit(out, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64))

    def _emit(self, rows: list, starts: np.ndarray, ends: np.ndarray) -> None:
        """Emit a function's rows, with their window's columns where they have none."""
        if not rows:
            return
        where = f"window {self.spec.kind.value} '{self.name}'"
        for row in rows:
            if not isinstance(row, dict):
                raise BadRecordError(f"{where}: the function must return dict rows, got "
                                     f"{type(row).__name__}: {describe_record(row)}", record=row)
        batch = rows_to_batch(rows, schema=self.schema, where=where)
        for name, values in zip(WINDOW_COLUMNS, (starts, ends)):
            if name not in batch.schema.names:
                batch = batch.append_column(name, pa.array(values))
        self.output.emit(batch)

    # -- state ---------------------------------------------------------------------------
    def snapshot_table(self, table: pa.Table, ts: np.ndarray) -> pa.Table:
        return table.append_column(_START, pa.array(ts))

    def restore_side(self, side: JoinSide, table: pa.Table) -> None:
        self.schemas[side] = table.schema.remove(table.schema.get_field_index(_START))
        disk = self._disk_rows()  # a heap snapshot restored on disk: its rows move in
        for batch in table.to_batches():
            starts = batch.column(_START).to_numpy()
            batch = batch.drop_columns([_START])
            rows = KeyedRows(pa.Table.from_batches([batch]), starts, self._key_ids(batch, side))
            if disk is None:
                self.buffers[side].append(rows)
            else:
                disk.append(side, rows)


@dataclass(frozen=True)
class _Groups:
    """One side's fired rows sorted by (key id, window start): the row range per group."""

    table: pa.Table
    ends: np.ndarray
    ranges: dict[tuple[int, int], tuple[int, int]]

    @classmethod
    def of(cls, fired: _Fired) -> "_Groups":
        kid, start = fired.rows.kid, fired.rows.ts
        if not len(kid):
            return cls(fired.rows.table, fired.ends, {})
        order = np.lexsort((start, kid))
        kid, start = kid[order], start[order]
        edges = np.flatnonzero((np.diff(kid) != 0) | (np.diff(start) != 0)) + 1
        firsts = np.concatenate([[0], edges])
        lasts = np.concatenate([edges, [len(kid)]])
        ranges = {(k, s): (a, b) for k, s, a, b in zip(kid[firsts].tolist(),
                                                       start[firsts].tolist(),
                                                       firsts.tolist(), lasts.tolist())}
        return cls(fired.rows.table.take(pa.array(order)), fired.ends[order], ranges)


def _sessions(kid: np.ndarray, ts: np.ndarray, gap: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the start and end of its session: per key, rows whose timestamps are at
    most ``gap`` apart share one, ``[first ts, last ts + gap)`` (windows that touch
    merge, as in the window operator and Flink).

        >>> _sessions(np.array([0, 0, 0, 1]), np.array([30, 0, 10, 5]), 10)
        (array([30,  0,  0,  5]), array([40, 20, 20, 15]))
    """
    n = len(ts)
    if not n:
        return ts.copy(), ts.copy()
    order = np.lexsort((ts, kid))
    k, t = kid[order], ts[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (k[1:] != k[:-1]) | (t[1:] - t[:-1] > gap)
    session = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    lasts = np.append(firsts[1:] - 1, n - 1)
    starts, ends = np.empty(n, np.int64), np.empty(n, np.int64)
    starts[order] = t[firsts][session]
    ends[order] = t[lasts][session] + gap
    return starts, ends


# -- the builder: a.join(b).where(k).equal_to(k).window(...) --------------------------------

class TwoStreams:
    """``a.join(b)`` or ``a.co_group(b)``: name the left key with :meth:`where`."""

    def __init__(self, kind: WindowJoinKind, left: "DataStream", right: "DataStream") -> None:
        self.kind, self.left, self.right = kind, left, right

    def where(self, key: KeySpec) -> "TwoStreamsWhere":
        """The left stream's key: a column, a list of columns or a function of a row."""
        return TwoStreamsWhere(self, KeySelector.of(key, where=f"{self.kind.value}(...).where"))


class TwoStreamsWhere:
    """``a.join(b).where(k)``: name the right key with :meth:`equal_to`."""

    def __init__(self, streams: TwoStreams, left_key: KeySelector) -> None:
        self.streams, self.left_key = streams, left_key

    def equal_to(self, key: KeySpec) -> "TwoStreamsKeyed":
        """The right stream's key; rows join when their keys are equal (same values and
        types, so that both sides' rows of a key meet in one subtask)."""
        right_key = KeySelector.of(key, where=f"{self.streams.kind.value}(...).equal_to")
        return TwoStreamsKeyed(self.streams, (self.left_key, right_key))


class TwoStreamsKeyed:
    """``a.join(b).where(k).equal_to(k)``: choose the windows with :meth:`window`."""

    def __init__(self, streams: TwoStreams, keys: tuple[KeySelector, KeySelector]) -> None:
        self.streams, self.keys = streams, keys

    def window(self, assigner: WindowAssigner, *, timestamp: str | None = None,
               left_timestamp: str | None = None,
               right_timestamp: str | None = None) -> "WindowedTwoStreams":
        """Event-time windows (``rs.TumblingEventTimeWindows``, ``rs.SlidingEventTimeWindows``,
        ``rs.EventTimeSessionWindows``) over both streams. ``timestamp`` names the
        event-time column of both sides (or ``left_timestamp`` / ``right_timestamp``);
        a side without one uses its stream's default (``rs.WINDOW_TIME`` for a
        window's results)."""
        streams = self.streams
        stamps = (left_timestamp or timestamp or streams.left.default_timestamp,
                  right_timestamp or timestamp or streams.right.default_timestamp)
        if stamps[0] is None or stamps[1] is None:
            raise ValueError(f"{streams.kind.value}(...).window: name the event-time column of "
                             f"both sides (timestamp=..., or left_timestamp=... and "
                             f"right_timestamp=...)")
        return WindowedTwoStreams(self, assigner, (stamps[0], stamps[1]))


class WindowedTwoStreams:
    """Two streams joined or co-grouped per key and window: finish with :meth:`apply`
    (and, for a join, the vectorized :meth:`join`)."""

    def __init__(self, keyed: TwoStreamsKeyed, assigner: WindowAssigner,
                 timestamps: tuple[str, str]) -> None:
        self.keyed, self.assigner, self.timestamps = keyed, assigner, timestamps

    def _add(self, fn: Callable | None, suffixes: tuple[str, str], name: str | None,
             schema: pa.Schema | None, parallelism: int | None) -> "DataStream":
        streams, keys = self.keyed.streams, self.keyed.keys
        kind = streams.kind
        spec = WindowJoinSpec(kind, self.assigner, keys, self.timestamps, *suffixes)
        left, right = streams.left.key_by(keys[0]), streams.right.key_by(keys[1])
        inputs: list[InputEdge] = [left._edge(0), right._edge(1)]
        result = left._add("operator", f"window_{kind.value}",
                           lambda n: WindowJoinOperator(n, spec, fn, schema=schema),
                           name=name, parallelism=parallelism, inputs=inputs)
        result.default_timestamp = WINDOW_TIME  # results carry event time window_end - 1
        return result

    def join(self, *, right_suffix: str = "_right", left_suffix: str = "_left",
             name: str | None = None, parallelism: int | None = None) -> "DataStream":
        """Every pair as one row (vectorized: an Arrow hash join per firing): the left
        columns, the right columns (suffixed with ``right_suffix`` where named like a
        left one), ``window_start``, ``window_end`` (a data column so named gets its
        side's suffix)."""
        if self.keyed.streams.kind is not WindowJoinKind.JOIN:
            raise TypeError("co_group(...).window(...): finish a co-group with apply(fn)")
        return self._add(None, (left_suffix, right_suffix), name, None, parallelism)

    def apply(self, fn: Callable, *, name: str | None = None, schema: pa.Schema | None = None,
              parallelism: int | None = None) -> "DataStream":
        """Join: ``fn(left_row, right_row)`` per pair returns a dict row or None.
        Co-group: ``fn(key, left: pa.Table, right: pa.Table, window)`` per key and
        window returns or yields dict rows. Rows without ``window_start`` /
        ``window_end`` get their window's."""
        if not callable(fn):
            raise TypeError(f"{self.keyed.streams.kind.value}(...).apply needs a function, "
                            f"got {type(fn).__name__}")
        return self._add(fn, ("_left", "_right"), name, schema, parallelism)

