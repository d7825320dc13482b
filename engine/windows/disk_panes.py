"""Dense window partials in the disk state backend's RocksDB (large window state).

With ``CheckpointConfig(state_backend="disk")`` the window operator's dense
layout (tumbling and sliding windows of built-in aggregates) keeps the partials
of every (key, window) in the operator instance's RocksDB instead of numpy
arrays on the heap. Each entry is::

    key group (uint16) | state id (uint16) | window end (uint64, big-endian) | key

with the window end offset by 2**63 so byte order is numeric order, and the key
encoded as the disk backend encodes keys. The value is the (key, window)'s
partial columns as one fixed-width little-endian numpy record (not
MessagePack), so the values of a batch decode with one ``np.frombuffer`` over
their joined bytes. The record's dtype is in the state's kind
(``"window-panes [[column, dtype], ...]"``), which the backend's section
directory and incremental-checkpoint manifest carry, so a restored job knows
it before any record arrives. The record ends with the key's id in the timer
service of the instance that wrote it and a random tag of that instance and
key table (a new tag when the timer service empties its key table, see
:mod:`raystream.timers.disk_service`): a firing window finds its keys' ids
with numpy for the entries written under the current tag, and decodes keys
only for the others (restored, or of an emptied key table) not rewritten since.

Window before key: a window fires per key group (one timer per key group and
window), so firing is one bounded range scan per (key group, window) and
clearing one ``delete_range``. A batch merges with one multi-get of its (key,
window) pairs' stored partials, a numpy merge, and one write batch. The
multi-get asks only for pairs that may be stored: a window this instance
created remembers which key ids it wrote (one byte per key id, for open windows
only), so a key's first rows in a window cost no lookup; a window holding
restored entries, or open when the key table was emptied, asks for every pair.

The entries share the backend's key-group prefix, so its full and incremental
snapshots, restores and rescaling carry them like any keyed state. Their timers
(at most one per key group and window) are in the same database
(:mod:`raystream.timers.disk_service`), which also gives the keys' encoded bytes.

    >>> import numpy as np
    >>> from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    >>> from raystream.engine.windows.aggregates import AggregateSpec
    >>> from raystream.timers.disk_service import DiskTimerService
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> spec = AggregateSpec.of({"n": ("count", None)})
    >>> panes = DiskPanes(backend, spec, timers, where="window 'w'")
    >>> panes.set_dtypes({"__n.n": np.dtype(np.int64)})
    >>> kids = timers.key_ids(["a", "b"], np.array([1, 1]))
    >>> panes.merge(np.array([10, 10]), kids, {"__n.n": np.array([2, 3])}).first.tolist()
    [0]
    >>> merged = panes.merge(np.array([10]), kids[:1], {"__n.n": np.array([4])})
    >>> merged.values["__n.n"].tolist(), merged.first.tolist()
    ([6], [])
    >>> found, partials = panes.read(10, [1])
    >>> sorted(zip(timers.keys(found), partials["__n.n"].tolist()))
    [('a', 6), ('b', 3)]
    >>> panes.clear(10, [1]); panes.read(10, [1])[0].tolist()
    []
    >>> backend.close()
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from raystream.checkpoint.disk_layout import (MAX_ORDERED, ORDERED, group_bound, ordered,
                                             ordered_key, ordered_value, state_id_of,
                                             state_prefix)
from raystream.checkpoint.disk_layout import partials_record
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.disk_records import PartialsState
from raystream.timers.disk_service import DiskTimerService

STATE_NAME = "__window_panes"
KIND = "window-panes"
_PREFIX = ORDERED.size
_KID, _TAG = "__kid", "__tag"  # the record's last fields: who wrote the entry


@dataclass(frozen=True)
class Merged:
    """What :meth:`DiskPanes.merge` did with a batch's (window end, key id) pairs."""

    values: dict[str, np.ndarray]  # the merged partials, pair by pair
    groups: np.ndarray  # each pair's key group
    first: np.ndarray  # positions of the pairs to scope new timers to (one per new group)


class DiskPanes(PartialsState):
    """The dense windows' partials of one operator instance, in its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, spec: AggregateSpec,
                 timers: DiskTimerService, *, where: str) -> None:
        super().__init__(backend, timers, state=STATE_NAME, kind=KIND, own=(_KID, _TAG),
                         where=where)
        self._spec = spec
        self._tag = np.frombuffer(os.urandom(8), dtype="<u8")[0]  # this instance's entries
        self._generation = timers.generation  # of the key table the tag's key ids are in
        # window end -> the key groups holding entries of it (each has its timers)
        self.timed: dict[int, np.ndarray] = {}
        # window end -> which key ids have entries, for windows this instance created
        self._written: dict[int, np.ndarray] = {}
        self._restored: set[int] = set()  # windows holding restored entries: get every pair
        if self.record is not None:  # restored
            self._find_windows()

    @property
    def dtypes(self) -> dict[str, np.dtype] | None:
        record = self.record
        return None if record is None else {n: record[n] for n in self._columns}

    def set_dtypes(self, dtypes: dict[str, np.dtype]) -> None:
        self._use(*partials_record(KIND, dtypes, where=self._where,
                                   last=[(_KID, "<i8"), (_TAG, "<u8")]))

    def _timed(self, end: int) -> np.ndarray:
        timed = self.timed.get(end)
        if timed is None:
            timed = self.timed[end] = np.zeros(self._backend.max_parallelism, dtype=bool)
        return timed

    def _range(self, group: int, end: int) -> tuple[bytes, bytes]:
        sid = state_id_of(self._sid)
        return ordered_key(group, sid, end), ordered_key(group, sid, end + 1)

    def _find_windows(self) -> None:
        """After a restore: the windows each key group holds, one seek per window."""
        backend = self._backend
        sid = state_id_of(self._sid)
        read_options = backend.read_options(group_bound(backend.key_groups.stop))
        it = backend.raw_db.iter(read_options)
        for group in backend.key_groups:
            head = state_prefix(group, sid)
            it.seek(head + bytes(8))
            while it.valid():
                key = it.key()
                if key[:4] != head:
                    break
                end = ordered_value(key)
                self._timed(end)[group] = True
                self._restored.add(end)
                if end == MAX_ORDERED:
                    break
                it.seek(ordered_key(group, sid, end + 1))
        del it

    # -- merge, read, clear ------------------------------------------------------------------
    def _check_generation(self) -> None:
        """The timer service emptied its key table: the key ids of the entries written so
        far are gone, so they count as another instance's (a new tag; their windows read
        as restored ones)."""
        if self._generation == self._timers.generation:
            return
        self._generation = self._timers.generation
        self._tag = np.frombuffer(os.urandom(8), dtype="<u8")[0]
        self._restored.update(self.timed)
        self._written.clear()

    def merge(self, ends: np.ndarray, kids: np.ndarray, values: dict[str, np.ndarray]
              ) -> Merged:
        """Merge partials of distinct (window end, key id) pairs into the stored ones (one
        multi-get, one write batch)."""
        self._check_generation()
        record = self.record
        if record is None:
            raise RuntimeError(f"{self._where}: disk panes before the dtypes of their partials")
        import rocksdict

        order = np.lexsort((kids, ends, self._timers.key_groups_of(kids)))
        ends, kids = ends[order], kids[order]  # near key order: RocksDB reads and writes
        values = {name: v[order] for name, v in values.items()}  # neighbouring blocks
        groups = self._timers.key_groups_of(kids)
        sid = state_id_of(self._sid)
        pack = ORDERED.pack
        offsets = ordered(ends)  # by window end, then key
        keys = [pack(g, sid, e) + c for g, e, c in zip(groups.tolist(), offsets,
                                                       self._timers.codes(kids))]
        db = self._backend.raw_db
        n = len(keys)
        asked = np.flatnonzero(self._maybe_stored(ends, kids))
        raws = list(db[[keys[i] for i in asked.tolist()]]) if len(asked) else []  # multi-get
        spec = self._spec
        merged = {name: np.full(n, spec.identity(name, record[name]), dtype=record[name])
                  for name in self._columns}
        present = asked[np.fromiter((r is not None for r in raws), dtype=bool, count=len(raws))]
        if len(present):
            old = np.frombuffer(b"".join([r for r in raws if r is not None]), dtype=record)
            for name in self._columns:
                merged[name][present] = old[name]
        spec.merge_all(merged, np.arange(n),
                       {name: values[name].astype(record[name], copy=False)
                        for name in self._columns})
        rows = np.empty(n, dtype=record)
        for name in self._columns:
            rows[name] = merged[name]
        rows[_KID] = kids
        rows[_TAG] = self._tag
        data, width = rows.tobytes(), record.itemsize
        batch = rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        for key, at in zip(keys, range(0, n * width, width)):
            put(key, data[at:at + width])
        db.write(batch)
        self._mark_written(ends, kids)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(n)
        return Merged({name: v[inverse] for name, v in merged.items()}, groups[inverse],
                      order[self._untimed(ends, groups)])

    def _maybe_stored(self, ends: np.ndarray, kids: np.ndarray) -> np.ndarray:
        """Which (window end, key id) pairs may have stored partials: those this instance
        wrote before, and all pairs of a window it restored (the others are read as new,
        without a get: the first row of a key in a window costs no lookup)."""
        maybe = np.ones(len(kids), dtype=bool)
        for end in np.unique(ends).tolist():
            if end in self._restored:
                continue
            at = np.flatnonzero(ends == end)
            written = self._written.get(end)
            maybe[at] = False
            if written is not None:  # keys new since it last grew were not written
                at = at[kids[at] < len(written)]
                maybe[at] = written[kids[at]]
        return maybe

    def _mark_written(self, ends: np.ndarray, kids: np.ndarray) -> None:
        n = self._timers.num_keys
        for end in np.unique(ends).tolist():
            if end in self._restored:
                continue
            written = self._written.get(end)
            if written is None or len(written) < n:
                grown = np.zeros(max(n, 2 * len(written) if written is not None else n), bool)
                if written is not None:
                    grown[:len(written)] = written
                written = self._written[end] = grown
            written[kids[ends == end]] = True

    def _untimed(self, ends: np.ndarray, groups: np.ndarray) -> np.ndarray:
        """Positions of the first pair of each (window end, key group) that had no entries
        (so no timers) before, now marked as timed: scope its window's timers to it."""
        out = []
        for end in np.unique(ends).tolist():
            at = np.flatnonzero(ends == end)
            timed = self._timed(end)
            untimed = ~timed[groups[at]]
            fresh, first = np.unique(groups[at][untimed], return_index=True)
            timed[fresh] = True
            out.append(at[untimed][first])
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def read(self, end: int, groups: Iterable[int]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Key ids and partials of window ``end`` in key groups ``groups``: one bounded
        range scan per key group."""
        self._check_generation()
        timed, record = self.timed.get(end), self.record
        if timed is None or record is None:
            return np.empty(0, dtype=np.int64), {}
        db, keys, values = self._backend.raw_db, [], []
        foreign = end in self._restored  # entries of another instance: their keys are needed
        for group in groups:
            if not timed[group]:
                continue
            lo, hi = self._range(group, end)
            read_options = self._backend.read_options(hi)
            if foreign:
                entries = list(db.items(from_key=lo, read_opt=read_options))
                keys.extend(k for k, _ in entries)
                values.extend(v for _, v in entries)
            else:
                values.extend(db.values(from_key=lo, read_opt=read_options))
        rows = np.frombuffer(b"".join(values), dtype=record)
        kids = rows[_KID].copy()
        restored = np.flatnonzero(rows[_TAG] != self._tag)
        if len(restored):
            if not foreign:
                raise RuntimeError(f"{self._where}: window {end} holds entries of another "
                                   f"instance it did not restore")
            at = restored.tolist()
            kids[restored] = self._timers.key_ids_of_codes(
                [keys[i][_PREFIX:] for i in at],
                np.array([ORDERED.unpack_from(keys[i])[0] for i in at], dtype=np.int64))
        return kids, {n: rows[n] for n in self._columns}

    def clear(self, end: int, groups: Iterable[int]) -> None:
        """Delete window ``end`` in key groups ``groups`` (one range deletion each)."""
        self._check_generation()
        timed = self.timed.get(end)
        if timed is None:
            return
        db = self._backend.raw_db
        cleared = [g for g in groups if timed[g]]
        for group in cleared:
            db.delete_range(*self._range(group, end))
        timed[cleared] = False
        if not timed.any():
            del self.timed[end]
            self._written.pop(end, None)
            self._restored.discard(end)
        elif end in self._written:  # some key groups of the window remain
            written = self._written[end]
            kids = np.flatnonzero(written)
            written[kids[np.isin(self._timers.key_groups_of(kids), cleared)]] = False
