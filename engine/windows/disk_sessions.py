"""Open session windows in the disk state backend's RocksDB (large session state).

With ``CheckpointConfig(state_backend="disk")`` the window operator's columnar
sessions (session windows of built-in aggregates,
:mod:`raystream.engine.windows.sessions`) keep each key's open sessions in the
operator instance's RocksDB instead of the heap's :class:`SessionStore`. Each
key is one entry, in the backend's own layout for keyed state::

    key group (uint16) | state id (uint16) | len(key) (uint32) | key

with the key encoded as the disk backend encodes keys. The value is the key's
open sessions, by start, as fixed-width little-endian numpy records: start,
end (int64) and the aggregates' partial columns. The record's dtype is in the
state's kind (``"session-windows [[field, dtype], ...]"``), which the backend's
section directory and incremental-checkpoint manifest carry, so a restored job
decodes its sessions before any record arrives.

A batch reads its distinct keys' sessions with one multi-get into a
:class:`SessionStore` of those keys only (which also judges its late rows:
a row is late only when the session it would merge into is), merges with the
store's own sorts, and writes back the keys its rows that are not late merged
into with one write batch (a key whose rows were all late is left as stored);
firing timers read their keys the same way, and a key left without sessions is
deleted. Python runs per distinct key (its entry key and value slice), never
per session or record. Timers, as
for heap sessions, are in the same database
(:mod:`raystream.timers.disk_service`). The entries share the
backend's key-group prefix, so its full and incremental snapshots, restores and
rescaling carry them like any keyed state.

    >>> from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    >>> from raystream.engine.windows.aggregates import AggregateSpec
    >>> from raystream.timers.disk_service import DiskTimerService
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> spec = AggregateSpec.of({"n": ("count", None)})
    >>> disk = DiskSessions(backend, spec, timers, where="window 'w'")
    >>> kids = timers.key_ids(["a", "b"], np.array([1, 2]))
    >>> _ = disk.merge(disk.load(kids), kids[[0, 0, 1]], np.array([0, 30, 5]),
    ...                np.array([10, 40, 9]), {"__n.n": np.array([2, 1, 4])})
    >>> loaded = disk.load(kids[:1])
    >>> loaded.store.starts.tolist()
    [0, 30]
    >>> _ = disk.merge(loaded, kids[:1], np.array([10]), np.array([30]),
    ...                {"__n.n": np.array([5])})
    >>> store = loaded.store
    >>> store.starts.tolist(), store.ends.tolist(), store.partials["__n.n"].tolist()
    ([0], [40], [8])
    >>> keys = disk.entry_keys(kids)
    >>> disk.read(kids, keys).partials["__n.n"].tolist()
    [8, 4]
    >>> backend.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from raystream.checkpoint.disk_layout import KEYED_PREFIX
from raystream.checkpoint.disk_layout import partials_record
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.disk_records import PartialsState
from raystream.engine.windows.sessions import Merged, SessionStore
from raystream.engine.windows.store import SessionRows
from raystream.timers.disk_service import DiskTimerService

STATE_NAME = "__session_windows"
KIND = "session-windows"
_START, _END = "__start", "__end"  # the record's first fields


@dataclass(frozen=True)
class Loaded:
    """The open sessions of a batch's distinct key ids, read from RocksDB: ``store`` holds
    them, ``keys`` are their stored keys (none before the state's first write)."""

    distinct: np.ndarray
    keys: list[bytes]
    store: SessionStore


class DiskSessions(PartialsState):
    """The open sessions of one window operator instance, in its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, spec: AggregateSpec,
                 timers: DiskTimerService, *, where: str) -> None:
        super().__init__(backend, timers, state=STATE_NAME, kind=KIND, own=(_START, _END),
                         where=where)
        self.spec = spec

    def _declare(self, partials: dict[str, np.ndarray]) -> None:
        """The first partials of a state that has no record yet fix it."""
        if self.record is None:
            self._use(*partials_record(KIND, {n: v.dtype for n, v in partials.items()},
                                       where=self._where,
                                       first=[(_START, "<i8"), (_END, "<i8")]))

    def entry_keys(self, kids: np.ndarray) -> list[bytes]:
        """The stored keys of key ids ``kids`` (one encoding per distinct key)."""
        timers = self._timers
        return self._backend.entry_keys(self._sid, timers.keys(kids), timers.key_groups_of(kids))

    def read(self, kids: np.ndarray, keys: list[bytes]) -> SessionStore:
        """A store of the open sessions of the distinct key ids ``kids`` (stored at
        ``keys``): one multi-get."""
        store = SessionStore(self.spec)
        record = self.record
        if record is None or not keys:  # no state yet
            return store
        raws = list(self._backend.raw_db[keys])  # a list of keys: a multi-get
        sizes = np.array([0 if r is None else len(r) for r in raws], dtype=np.int64)
        width = record.itemsize
        if np.any(sizes % width):
            raise ValueError(f"{self._where}: a stored key's sessions are not whole records "
                             f"of {width} bytes (state written by another version?)")
        records = np.frombuffer(b"".join([r for r in raws if r is not None]), dtype=record)
        store.extend(np.repeat(kids, sizes // width), records[_START].astype(np.int64),
                     records[_END].astype(np.int64),
                     {n: np.ascontiguousarray(records[n]) for n in self._columns})
        return store

    def write(self, kids: np.ndarray, keys: list[bytes], store: SessionStore) -> None:
        """Store the sessions ``store`` holds of each of the distinct key ids ``kids``
        (at ``keys``); a key without any is deleted: one write batch."""
        import rocksdict

        record = self.record
        if record is None:
            return
        order = np.lexsort((store.starts, store.kids))
        records = np.empty(len(order), dtype=record)
        records[_START], records[_END] = store.starts[order], store.ends[order]
        for name in self._columns:
            records[name] = store.partials[name][order]
        data, width = records.tobytes(), record.itemsize
        sorted_kids = store.kids[order]
        los = np.searchsorted(sorted_kids, kids, side="left").tolist()
        his = np.searchsorted(sorted_kids, kids, side="right").tolist()
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, a, b in zip(keys, los, his):
            if a == b:
                batch.delete(key)
            else:
                batch.put(key, data[a * width:b * width])
        self._backend.raw_db.write(batch)

    def load(self, kids: np.ndarray) -> Loaded:
        """The stored sessions of the key ids ``kids`` (one multi-get), to judge a batch's
        late rows by and merge it into."""
        distinct = np.unique(kids)
        if self.record is None:  # no state yet (nor a state id to key it by)
            return Loaded(distinct, [], SessionStore(self.spec))
        keys = self.entry_keys(distinct)
        return Loaded(distinct, keys, self.read(distinct, keys))

    def merge(self, loaded: Loaded, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
              partials: dict[str, np.ndarray]) -> Merged:
        """Merge a batch's sessions (of keys ``loaded`` holds) into their keys' stored ones
        (as :meth:`SessionStore.add` does) and write them back (one write batch); returns
        where the merged sessions are in ``loaded.store``."""
        self._declare(partials)
        merged = loaded.store.add(kids, starts, ends, partials)
        # only the keys the merge touched: the others were loaded to judge late rows by
        # and are as stored (a batch's keys whose rows were all late)
        touched = np.flatnonzero(np.isin(loaded.distinct, kids))
        distinct = loaded.distinct[touched]
        keys = ([loaded.keys[i] for i in touched.tolist()] if loaded.keys
                else self.entry_keys(distinct))
        self.write(distinct, keys, loaded.store)
        return merged

    def export(self) -> Iterator[tuple[int, SessionRows]]:
        """Each key group's open sessions as the heap store's rows (a disk savepoint
        restored into a heap job): one range scan per key group, one ``frombuffer``."""
        record, kind = self.record, self._backend.state_kind(STATE_NAME)
        if record is None or kind is None:
            return
        width, decode = record.itemsize, DiskKeyedStateBackend.decode_key
        for group, entries in self._backend.raw_state_entries(STATE_NAME, kind):
            sizes = np.array([len(v) for _, v in entries], dtype=np.int64)
            if np.any(sizes % width):
                raise ValueError(f"{self._where}: a stored key's sessions are not whole "
                                 f"records of {width} bytes (state written by another version?)")
            records = np.frombuffer(b"".join([v for _, v in entries]), dtype=record)
            keys = [decode(k[KEYED_PREFIX.size:]) for k, _ in entries]  # one per stored key
            yield group, SessionRows(
                [keys[i] for i in np.repeat(np.arange(len(keys)), sizes // width).tolist()],
                records[_START].astype(np.int64), records[_END].astype(np.int64),
                {n: np.ascontiguousarray(records[n]) for n in self._columns})

    def restore_heap(self, kids: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     partials: dict[str, np.ndarray]) -> None:
        """Move a heap checkpoint's open sessions (disjoint, new to this state) into
        RocksDB."""
        if not len(kids):
            return
        self._declare(partials)
        store = SessionStore(self.spec)
        store.extend(kids, starts, ends, partials)
        distinct = np.unique(kids)
        self.write(distinct, self.entry_keys(distinct), store)
