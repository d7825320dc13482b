"""The window-store protocol: where a window operator keeps its windows' contents.

The :class:`~raystream.engine.windows.operator.WindowOperator` assigns a batch's rows to
windows, judges lateness, owns the timers and writes the output; a :class:`WindowStore`
keeps what the windows hold and is asked four things:

* :meth:`~WindowStore.add`: merge a batch's assigned rows (or an upstream
  pre-aggregator's partials) into their windows; register the timers of the windows new
  to it, and fire again at once a window that had fired and took in rows within the
  allowed lateness;
* :meth:`~WindowStore.fire`: the due timers (:class:`DueTimers`: timestamp, key id,
  window start, and their time domain): emit the windows whose firing time it is, drop
  those whose cleanup time it is;
* :meth:`~WindowStore.capture`: the synchronous part of a snapshot, returning the
  asynchronous part that gives a :class:`WindowSection` per key group;
* :meth:`~WindowStore.restore` a key group's section, then :meth:`~WindowStore.restored`
  once all are in.

One implementation per state layout and backend, chosen once when the operator's state
is initialised (:func:`raystream.engine.windows.operator.WindowOperator.open_store`):

=====================  ========================================  ============================================
layout                 heap                                      disk
=====================  ========================================  ============================================
dense (built-in        :class:`~.dense.HeapDenseWindows`         :class:`~.dense.DiskDenseWindows`
aggregates, fixed
windows)
sessions (built-in     :class:`~.session_windows.HeapSession     :class:`~.session_windows.DiskSession
aggregates)            Windows`                                  Windows`
generic (user          :class:`~.generic.HeapGenericWindows`     :class:`~.generic.DiskGenericWindows`,
functions)                                                       :class:`~.generic.DiskGenericSessionWindows`
=====================  ========================================  ============================================

A store reaches the operator only through :class:`WindowHost`, so it never imports it.
A heap store's sections are pickled in the operator's checkpoint part ``"windows"``; a
disk store keeps everything in the backend's database (its sections are empty) and
restores a heap store's sections into it, so a heap savepoint restores into either
backend; a disk store also exports its windows as heap sections
(:class:`DiskWindowStore`), so a disk savepoint restores into either backend too.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pyarrow as pa

from raystream.engine.windows.assigners import WindowAssigner
from raystream.engine.windows.functions import WindowFunction
from raystream.engine.windows.sessions import Windows
from raystream.timers.protocol import TimeDomain, Timers

WINDOW_START = "__window_start"  # pre-aggregated partial rows: their window's (or pane's) start

_VERSION = 3  # 2: a key group's dense windows as flat arrays; 3: sessions too
_READABLE_VERSIONS = (2, 3)


@dataclass(frozen=True)
class Assigned:
    """A batch's window assignments: row ``rows[i]`` belongs to window ``[starts[i],
    ends[i])`` of key id ``kids[i]`` (a row of sliding windows appears once per window);
    ``times[i]``: the row's event time (or the clock's, for processing time), given to
    stores of triggered windows.

        >>> import numpy as np
        >>> a = Assigned(np.array([0, 1]), np.array([0, 10]), np.array([10, 20]),
        ...              np.array([5, 5]))
        >>> len(a.where(a.starts > 0)), a.where(a.starts > 0).rows.tolist()
        (1, [1])
    """

    rows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    kids: np.ndarray
    times: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, mask: np.ndarray) -> Assigned:
        return Assigned(self.rows[mask], self.starts[mask], self.ends[mask], self.kids[mask],
                        None if self.times is None else self.times[mask])


@dataclass(frozen=True)
class DueTimers:
    """Timers a pop returned, in one time domain: timer ``i`` at ``timestamps[i]`` of the
    window starting at ``starts[i]`` of key id ``kids[i]``; ``now_ms`` is the clock (the
    largest time at the end of the input, when processing-time windows fire)."""

    timestamps: np.ndarray
    kids: np.ndarray
    starts: np.ndarray
    domain: TimeDomain
    now_ms: int


class WindowHost(Protocol):
    """What a store may ask of its window operator."""

    name: str
    assigner: WindowAssigner
    function: WindowFunction
    lateness: int  # allowed lateness in ms
    partial_input: bool  # rows are an upstream pre-aggregator's partials
    timers: Timers

    @property
    def event_time(self) -> bool: ...

    @property
    def max_parallelism(self) -> int: ...

    def watermarks_of_key_ids(self, key_ids: np.ndarray) -> np.ndarray | int: ...

    def now_ms(self) -> int:
        """The clock of processing time, in ms since the epoch."""
        ...

    def window_ends(self, starts: np.ndarray) -> np.ndarray: ...

    def judge_late(self, batch: pa.RecordBatch, assigned: Assigned,
                   held: Callable[[np.ndarray], Windows] | None = None) -> Assigned:
        """The assignments that are not late; the late rows go to the late output (or
        are dropped and counted). ``held(keys)``: the keys' open sessions."""
        ...

    def register_timers(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        ...

    def delete_timers(self, kid: int, start: int, end: int) -> None: ...

    def emit_results(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     results: dict[str, pa.Array]) -> None:
        """Emit built-in aggregates' results of windows ``[starts, ends)`` of ``kids``."""
        ...

    def emit_windows(self, fired: list[tuple[int, int, int, Any]]) -> None:
        """Emit the result rows of user-function windows (key id, start, end,
        accumulator)."""
        ...

    def release_key_ids(self) -> bool:
        """A safe point: nothing holds a key id (a disk store's firing between chunks)."""
        ...


@dataclass(frozen=True)
class DenseRows:
    """Dense windows of one key group: (window start, key, partials) per entry."""

    starts: np.ndarray
    keys: list[Any]
    columns: dict[str, np.ndarray]


@dataclass(frozen=True)
class SessionRows:
    """Open sessions of built-in aggregates of one key group."""

    keys: list[Any]
    starts: np.ndarray
    ends: np.ndarray
    partials: dict[str, np.ndarray]


@dataclass(frozen=True)
class WindowSection:
    """One key group's windows in a checkpoint: the dense layout's, the columnar
    sessions', the generic layout's ``(key, start, end, frozen accumulator)`` and the
    triggered layout's ``(key, start, end, records since the last firing, frozen
    accumulator or None when purged)``."""

    dense: DenseRows | None = None
    sessions: SessionRows | None = None
    generic: list[tuple[Any, int, int, Any]] = field(default_factory=list)
    triggered: list[tuple[Any, int, int, int, Any]] = field(default_factory=list)

    def encode(self) -> bytes:
        dense, sessions = self.dense, self.sessions
        return pickle.dumps((_VERSION, {
            "dense": None if dense is None else (dense.starts, dense.keys, dense.columns),
            "sessions": None if sessions is None else (sessions.keys, sessions.starts,
                                                       sessions.ends, sessions.partials),
            "generic": self.generic, "triggered": self.triggered}), protocol=5)

    @staticmethod
    def decode(blob: bytes, *, group: int, where: str) -> WindowSection:
        version, content = pickle.loads(blob)  # this job's own checkpoint file
        if version not in _READABLE_VERSIONS:
            raise ValueError(f"{where}: window state version {version} in key group {group}; "
                             f"this raystream reads versions "
                             f"{', '.join(map(str, _READABLE_VERSIONS))}")
        dense, sessions = content["dense"], content.get("sessions")
        return WindowSection(dense=None if dense is None else DenseRows(*dense),
                             sessions=None if sessions is None else SessionRows(*sessions),
                             generic=content["generic"],
                             triggered=content.get("triggered", []))

    def session_rows(self, partial_columns: list[str]) -> SessionRows | None:
        """The columnar sessions, also of a version-2 section (which held them one by one
        among the generic entries)."""
        if self.sessions is not None or not self.generic:
            return self.sessions
        entries = self.generic
        return SessionRows([e[0] for e in entries],
                           np.array([e[1] for e in entries], dtype=np.int64),
                           np.array([e[2] for e in entries], dtype=np.int64),
                           {name: np.array([e[3][name] for e in entries])
                            for name in partial_columns})

    def only(self, *layouts: str, where: str) -> None:
        """Refuse a section that holds windows of a layout other than ``layouts``
        (``"dense"``, ``"sessions"``, ``"generic"``, ``"triggered"``)."""
        held = [name for name, value in (("dense", self.dense), ("sessions", self.sessions),
                                         ("generic", self.generic),
                                         ("triggered", self.triggered)) if value]
        other = [name for name in held if name not in layouts]
        if other:
            raise ValueError(f"{where}: the checkpoint holds {other[0]} windows, this "
                             f"window keeps {' or '.join(layouts)} ones (a savepoint restores "
                             f"into the same window definition)")


class WindowStore(Protocol):
    """The contents of a window operator's windows (see the module docs)."""

    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None: ...

    def fire(self, due: DueTimers) -> None: ...

    def capture(self) -> Callable[[], dict[int, WindowSection]]: ...

    def restore(self, group: int, section: WindowSection) -> None: ...

    def restored(self) -> None: ...


class DiskWindowStore(WindowStore, Protocol):
    """A store in the disk backend's database, which also gives its windows back as the
    heap stores' sections: how a heap job restores a disk savepoint (the store opened
    over a scratch database, see :mod:`~raystream.engine.operators.moved_disk_state`)."""

    def export(self) -> Iterator[tuple[int, WindowSection]]: ...


def no_sections() -> dict[int, WindowSection]:
    """A disk store's snapshot: everything is in the backend's database."""
    return {}


def by_key_group(timers: Timers, kids: np.ndarray,
                 *arrays: np.ndarray, columns: dict[str, np.ndarray]
                 ) -> Iterator[tuple[int, list[Any], tuple[np.ndarray, ...],
                                     dict[str, np.ndarray]]]:
    """(key group, keys, arrays, columns) slices of entries of key ids ``kids``: sorted
    by key group once."""
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


def rows_of(table: pa.Table, columns: list[str], rows: np.ndarray) -> pa.Table:
    """``columns`` of ``table`` at ``rows`` (a row may repeat); with no columns, a
    placeholder column keeps the row count."""
    if not columns:
        return pa.table({"__row": pa.array(rows)})
    selected = table.select(columns)
    return selected if is_identity(rows, table.num_rows) else selected.take(pa.array(rows))


def is_identity(rows: np.ndarray, n: int) -> bool:
    """Is ``rows`` exactly ``0, 1, ..., n-1`` (every row once, in order)?

        >>> import numpy as np
        >>> is_identity(np.arange(3), 3), is_identity(np.array([0, 2]), 3)
        (True, False)
    """
    return len(rows) == n and (n == 0 or (rows[0] == 0 and rows[-1] == n - 1
                                          and bool(np.all(np.diff(rows) == 1))))
