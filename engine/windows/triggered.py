"""The window store of windows with a trigger of their own (and of global windows).

A window given a trigger other than its assigner's default (``window(..., trigger=...)``,
:mod:`raystream.engine.windows.triggers`), and every global window, keeps one entry per
(key, window): the records it took in since it last fired and its accumulator (of any
window function: built-in aggregates as dicts of partials, a user ``AggregateFunction``'s,
a ``ProcessWindowFunction``'s rows), or none once purged. The window stays (with its
timers) until its cleanup time, ``end - 1 + allowed_lateness`` in event time, ``end - 1``
for processing-time windows, never for a global window; a purged window that takes in
records again starts from an empty accumulator, as in Flink.

Per batch: the rows are assigned and judged late as for any window; then, for a trigger
that counts records, split into *rounds* so that no window reaches its count twice in one
round (a round is every window's rows up to its next count); each round's (key, window)
groups merge into their entries (one read and one write for the round), the trigger
decides which fire (and purge), and the windows new in the round register their cleanup
timer and the trigger's first timers. A pop of due timers reads its windows once, lets
the trigger decide over all of them, fires each window at most once, and drops the
windows whose cleanup time it is.

Fixed windows only (tumbling, sliding, global, processing-time): session windows keep
their default trigger (a window merge would have to merge trigger state).

* :class:`HeapTriggerEntries`: a dict; snapshotted as the ``triggered`` entries of a
  :class:`~raystream.engine.windows.store.WindowSection`;
* :class:`DiskTriggerEntries`: RocksDB entries of the disk backend
  (:class:`~raystream.engine.windows.disk_entries.DiskEntries` under a state of their
  own); a heap checkpoint's entries move into them on restore.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pyarrow as pa

from raystream.engine.windows.assigners import GlobalWindows
from raystream.engine.windows.disk_entries import DiskEntries
from raystream.engine.windows.functions import BuiltinAggregates
from raystream.engine.windows.generic import accumulate
from raystream.engine.windows.store import (Assigned, DueTimers, WindowHost, WindowSection,
                                            no_sections)
from raystream.engine.windows.triggers import (Created, Due, Filled, Timers, Trigger, fires,
                                               purges)
from raystream.timers.protocol import TimeDomain

STATE_NAME = "__window_triggered"
KIND = "window-triggered"

Entry = tuple[int, Any]  # records since the window last fired, accumulator (None: purged)


class TriggerEntries(Protocol):
    """(key id, window) entries of triggered windows, read and written in bulk."""

    def get(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray
            ) -> list[Entry | None]: ...

    def put(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            entries: list[Entry]) -> None: ...

    def delete(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None: ...


class HeapTriggerEntries:
    """Entries in a dict by (key id, window start) holding (end, count, accumulator)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], tuple[int, int, Any]] = {}

    def get(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Entry | None]:
        found = self.entries.get
        return [None if (e := found(w)) is None else (e[1], e[2])
                for w in zip(kids.tolist(), starts.tolist())]

    def put(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            entries: list[Entry]) -> None:
        for kid, start, end, (count, acc) in zip(kids.tolist(), starts.tolist(), ends.tolist(),
                                                 entries):
            self.entries[(kid, start)] = (end, count, acc)

    def delete(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        for window in zip(kids.tolist(), starts.tolist()):
            self.entries.pop(window, None)


class DiskTriggerEntries:
    """Entries in the disk backend: (window start, (count, accumulator)) per (key,
    window end), one multi-get or write batch per call."""

    def __init__(self, disk: DiskEntries) -> None:
        self.disk = disk

    def get(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[Entry | None]:
        return [None if e is None else tuple(e[1])  # type: ignore[misc]
                for e in self.disk.get(self.disk.entry_keys(kids, ends))]

    def put(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
            entries: list[Entry]) -> None:
        self.disk.put(self.disk.entry_keys(kids, ends), starts, entries)

    def delete(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.disk.delete(self.disk.entry_keys(kids, ends))

    def export(self) -> Iterator[tuple[int, list[tuple[Any, int, int, int, Any]]]]:
        """Each key group's entries as ``(key, start, end, count, accumulator)``."""
        for group, found in self.disk.export():
            yield group, [(key, start, end, *entry) for key, start, end, entry in found]


class TriggeredWindows:
    """Fixed windows fired by ``trigger``, their entries in ``entries`` (see the module
    docs)."""

    def __init__(self, host: WindowHost, trigger: Trigger, entries: TriggerEntries) -> None:
        self.host, self.trigger, self.entries = host, trigger, entries

    # -- records ---------------------------------------------------------------------------
    def add(self, batch: pa.RecordBatch, assigned: Assigned) -> None:
        assigned = self.host.judge_late(batch, assigned)
        if not len(assigned):
            return
        rounds, known = self._rounds(assigned)
        for r, part in enumerate(rounds):
            self._add_round(batch, part, known if r == 0 else None)

    def _rounds(self, assigned: Assigned
                ) -> tuple[list[Assigned], dict[tuple[int, int], Entry | None] | None]:
        """``assigned`` cut where a window reaches its trigger's count: round ``r`` holds
        each window's rows after its ``r``-th firing of this batch (rows keep the batch's
        order within a window); and the entries read to cut them, by (key id, window
        start), which the first round takes instead of reading them again."""
        count = getattr(_counting(self.trigger), "count", None)
        if count is None:
            return [assigned], None
        kids, starts = assigned.kids, assigned.starts
        order = np.lexsort((np.arange(len(kids)), starts, kids))
        k, s = kids[order], starts[order]
        first = np.concatenate([[True], (np.diff(k) != 0) | (np.diff(s) != 0)])
        group = np.cumsum(first) - 1
        heads = np.flatnonzero(first)
        rank = np.arange(len(order)) - heads[group]
        found = self.entries.get(k[heads], s[heads], assigned.ends[order][heads])
        held = np.array([0 if e is None else e[0] for e in found], dtype=np.int64)
        rounds = np.empty(len(order), dtype=np.int64)
        rounds[order] = (held[group] + rank) // count
        known = dict(zip(zip(k[heads].tolist(), s[heads].tolist()), found))
        return [assigned.where(rounds == r) for r in range(int(rounds.max()) + 1)], known

    def _add_round(self, batch: pa.RecordBatch, assigned: Assigned,
                   known: dict[tuple[int, int], Entry | None] | None) -> None:
        host, trigger = self.host, self.trigger
        groups = accumulate(host, batch, assigned)
        kids, starts, ends = groups.kids, groups.starts, groups.ends
        old = (self.entries.get(kids, starts, ends) if known is None else
               [known[w] for w in zip(kids.tolist(), starts.tolist())])
        merge = host.function.merge
        counts = np.array([0 if e is None else e[0] for e in old], dtype=np.int64) + groups.sizes
        accumulators = [acc if e is None or e[1] is None else merge(e[1], acc)
                        for e, acc in zip(old, groups.accumulators)]
        watermarks = np.broadcast_to(host.watermarks_of_key_ids(kids), kids.shape)
        results = trigger.on_records(Filled(ends, counts, watermarks))
        fired = np.flatnonzero(fires(results))
        self._emit(kids[fired], starts[fired], ends[fired], [accumulators[i] for i in fired])
        counts[fired] = 0
        for i in np.flatnonzero(purges(results)).tolist():
            accumulators[i] = None
        self.entries.put(kids, starts, ends, list(zip(counts.tolist(), accumulators)))
        new = np.fromiter((e is None for e in old), dtype=bool, count=len(old))
        if new.any():
            first_times = groups.first_times
            if first_times is None:
                raise TypeError(f"window '{host.name}': triggered windows need each "
                                f"assignment's time")
            created = Created(ends[new], first_times[new], watermarks[new], host.now_ms())
            self._register(kids[new], starts[new], (*self._cleanup_timers(created.ends),
                                                    *trigger.first_timers(created)))

    # -- timers ----------------------------------------------------------------------------
    def fire(self, due: DueTimers) -> None:
        """A pop's due timers, decided by the trigger over their windows (each read once);
        a window fires at most once per pop, and is dropped at its cleanup time."""
        host = self.host
        windows, at = np.unique(np.stack([due.kids, due.starts]), axis=1, return_inverse=True)
        at = at.reshape(-1)
        kids, starts = windows[0], windows[1]
        ends = host.window_ends(starts)
        found = self.entries.get(kids, starts, ends)
        held = np.fromiter((e is not None for e in found), dtype=bool, count=len(found))
        entries: list[Entry] = [(0, None) if e is None else e for e in found]
        timer_ends = ends[at]
        watermarks = np.broadcast_to(host.watermarks_of_key_ids(due.kids), due.kids.shape)
        results, later = self.trigger.on_timers(Due(due.domain, due.timestamps, timer_ends,
                                                    watermarks, due.now_ms))
        decided = np.zeros(len(kids), dtype=np.int8)
        np.bitwise_or.at(decided, at, results)
        cleanup = np.zeros(len(kids), dtype=bool)
        cleanup[at[self._is_cleanup(due, timer_ends)]] = True
        purged = purges(decided) & held
        # a purged window fires nothing until it takes in records again
        fire = fires(decided) & np.fromiter((e[1] is not None for e in entries), dtype=bool,
                                            count=len(entries))
        index = np.flatnonzero(fire)
        self._emit(kids[index], starts[index], ends[index], [entries[i][1] for i in index])
        changed = np.flatnonzero((fire | purged) & ~cleanup)
        if len(changed):
            self.entries.put(kids[changed], starts[changed], ends[changed], [
                (0 if fire[i] else entries[i][0], None if purged[i] else entries[i][1])
                for i in changed.tolist()])
        gone = cleanup & held
        if gone.any():
            self.entries.delete(kids[gone], starts[gone], ends[gone])
        # the trigger's next timers, for windows that stay; one due already would fire the
        # window again with what it has just emitted
        stays = held & ~cleanup
        now = watermarks if due.domain == TimeDomain.EVENT_TIME else due.now_ms
        self._register(due.kids, due.starts, tuple(
            Timers(t.domain, t.index[keep], t.timestamps[keep]) for t in later
            for keep in [stays[at[t.index]] & (t.timestamps > np.broadcast_to(
                now, due.kids.shape)[t.index])]))

    def _cleanup(self) -> tuple[TimeDomain, int] | None:
        """The domain of this window's cleanup timers and their offset from the end, or
        None for a global window (it has no end)."""
        host = self.host
        if isinstance(host.assigner, GlobalWindows):
            return None
        if host.event_time:
            return TimeDomain.EVENT_TIME, host.lateness - 1
        return TimeDomain.PROCESSING_TIME, -1

    def _cleanup_timers(self, ends: np.ndarray) -> tuple[Timers, ...]:
        cleanup = self._cleanup()
        if cleanup is None:
            return ()
        domain, offset = cleanup
        return (Timers(domain, np.arange(len(ends)), ends + offset),)

    def _is_cleanup(self, due: DueTimers, ends: np.ndarray) -> np.ndarray:
        cleanup = self._cleanup()
        if cleanup is None or due.domain != cleanup[0]:
            return np.zeros(len(ends), dtype=bool)
        return due.timestamps == ends + cleanup[1]

    def _register(self, kids: np.ndarray, starts: np.ndarray,
                  timers: tuple[Timers, ...]) -> None:
        service = self.host.timers
        for t in timers:
            if not len(t.index):
                continue
            register = (service.register_event_time_timers if t.domain == TimeDomain.EVENT_TIME
                        else service.register_processing_time_timers)
            register(kids[t.index], starts[t.index], t.timestamps)

    # -- output ----------------------------------------------------------------------------
    def _emit(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
              accumulators: list[Any]) -> None:
        if not len(kids):
            return
        fn = self.host.function
        if isinstance(fn, BuiltinAggregates):
            self.host.emit_results(kids, starts, ends, fn.results(accumulators))
        else:
            self.host.emit_windows(list(zip(kids.tolist(), starts.tolist(), ends.tolist(),
                                            accumulators)))

    # -- checkpoints -----------------------------------------------------------------------
    def capture(self) -> Callable[[], dict[int, WindowSection]]:
        entries = self.entries
        if not isinstance(entries, HeapTriggerEntries):
            return no_sections
        freeze, timers = self.host.function.frozen, self.host.timers
        frozen = [(kid, start, end, count, None if acc is None else freeze(acc))
                  for (kid, start), (end, count, acc) in entries.entries.items()]

        def sections() -> dict[int, WindowSection]:
            by_group: dict[int, WindowSection] = {}
            for kid, start, end, count, acc in frozen:
                by_group.setdefault(timers.key_group(kid), WindowSection()).triggered.append(
                    (timers.key(kid), start, end, count, acc))
            return by_group
        return sections

    def restore(self, group: int, section: WindowSection) -> None:
        """A key group's entries (on disk too: a heap checkpoint's move into RocksDB;
        their timers are restored already)."""
        section.only("triggered", where=f"window '{self.host.name}'")
        rows = section.triggered
        if not rows:
            return
        host = self.host
        thawed = host.function.thawed
        kids = host.timers.key_ids([r[0] for r in rows], np.full(len(rows), group))
        self.entries.put(kids, np.array([r[1] for r in rows], dtype=np.int64),
                         np.array([r[2] for r in rows], dtype=np.int64),
                         [(r[3], None if r[4] is None else thawed(r[4])) for r in rows])

    def restored(self) -> None:
        pass

    def export(self) -> Iterator[tuple[int, WindowSection]]:
        """Every key group's entries as the heap store's sections (a disk savepoint
        restored into a heap job, through a scratch database)."""
        entries = self.entries
        if not isinstance(entries, DiskTriggerEntries):
            raise TypeError(f"window '{self.host.name}': only windows on disk export")
        freeze = self.host.function.frozen
        for group, found in entries.export():
            yield group, WindowSection(triggered=[
                (key, start, end, count, None if acc is None else freeze(acc))
                for key, start, end, count, acc in found])


def _counting(trigger: Trigger) -> Trigger:
    """The trigger that counts (inside a purging one)."""
    inner = getattr(trigger, "trigger", None)
    return inner if isinstance(inner, Trigger) else trigger


