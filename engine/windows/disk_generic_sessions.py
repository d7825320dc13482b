"""Session windows of user functions in the disk state backend's RocksDB.

With ``CheckpointConfig(state_backend="disk")`` the window operator's generic
layout for session windows (a user ``AggregateFunction``, ``reduce`` or a
``ProcessWindowFunction`` over ``EventTimeSessionWindows``) keeps each key's open
sessions in the operator instance's RocksDB instead of the heap's ``entries`` and
``sessions`` dicts. Each key is one entry, in the backend's own layout for keyed
state::

    key group (uint16) | state id (uint16) | len(key) (uint32) | key

with the key encoded as the disk backend encodes keys. The value is the key's
open sessions, ``[[start, end, accumulator], ...]``, serialized as the backend
serializes state values (MessagePack, pickle only for opaque objects such as a
``ProcessWindowFunction``'s row batches: what :mod:`~raystream.engine.windows.disk_entries`
stores too).

A batch (or a firing of timers) loads its distinct keys' sessions with one
multi-get into the operator's ``entries`` and ``sessions`` dicts, which are empty
otherwise, runs the heap path's own session merging (or firing) over just those
keys, then writes them back with one write batch (a key left without sessions is
deleted) and empties the dicts: no key id outlives the call. Python runs per
distinct key and per session, as the heap path does. Timers stay on the timer
service, one per session as on the heap. The entries share the backend's
key-group prefix, so its full and incremental snapshots, restores and rescaling
carry them like any keyed state.

    >>> from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    >>> from raystream.timers.disk_service import DiskTimerService
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> disk = DiskGenericSessions(backend, timers)
    >>> kids = timers.key_ids(["a", "b"], np.array([1, 2]))
    >>> entries, sessions = {}, {}
    >>> with disk.loaded(kids, entries, sessions):
    ...     entries[(int(kids[0]), 0)] = [10, (1, 2)]
    ...     sessions[int(kids[0])] = [0]
    >>> entries, sessions
    ({}, {})
    >>> with disk.loaded(kids, entries, sessions):
    ...     entries == {(int(kids[0]), 0): [10, (1, 2)]}
    True
    >>> backend.close()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from raystream.checkpoint.disk_state import DiskKeyedStateBackend, _pack, _unpack
from raystream.timers.disk_service import DiskTimerService

STATE_NAME = "__generic_sessions"
KIND = "generic-session-windows"

Entries = dict[tuple[int, int], list[Any]]  # (key id, start) -> [end, accumulator]
Sessions = dict[int, list[int]]  # key id -> starts of its open sessions


class DiskGenericSessions:
    """The open sessions of user window functions of one window operator instance, in
    its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService) -> None:
        self._backend = backend
        self._timers = timers
        self._sid = backend.raw_state_id(STATE_NAME, KIND)

    def entry_keys(self, kids: np.ndarray) -> list[bytes]:
        """The stored keys of key ids ``kids`` (one encoding per key)."""
        timers = self._timers
        return self._backend.entry_keys(self._sid, timers.keys(kids), timers.key_groups_of(kids))

    @contextmanager
    def loaded(self, kids: np.ndarray, entries: Entries, sessions: Sessions) -> Iterator[None]:
        """The sessions of the distinct key ids ``kids`` in ``entries`` and ``sessions``
        (both empty before) for the body, written back after it (one multi-get, one write
        batch); both are emptied again, also when the body fails (then nothing is
        written: the job restores from its last checkpoint)."""
        keys = self.entry_keys(kids)
        try:
            self._load(kids, keys, entries, sessions)
            yield
            self._store(kids, keys, entries, sessions)
        finally:
            entries.clear()
            sessions.clear()

    def _load(self, kids: np.ndarray, keys: list[bytes], entries: Entries,
              sessions: Sessions) -> None:
        if not keys:
            return
        raws = list(self._backend.raw_db[keys])  # a list of keys: a multi-get
        for kid, raw in zip(kids.tolist(), raws):
            if raw is None:
                continue
            stored = _unpack(raw)
            sessions[kid] = [start for start, _, _ in stored]
            for start, end, acc in stored:
                entries[(kid, start)] = [end, acc]

    def _store(self, kids: np.ndarray, keys: list[bytes], entries: Entries,
               sessions: Sessions) -> None:
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for kid, key in zip(kids.tolist(), keys):
            starts = sessions.get(kid)
            if not starts:
                batch.delete(key)
                continue
            batch.put(key, _pack([[start, *entries[(kid, start)]] for start in sorted(starts)]))
        self._backend.raw_db.write(batch)

    def move_in(self, entries: Entries, sessions: Sessions) -> None:
        """A heap checkpoint's sessions (restored into ``entries`` and ``sessions``) into
        RocksDB, emptying both."""
        kids = np.fromiter(sessions, dtype=np.int64, count=len(sessions))
        keys = self.entry_keys(kids)
        try:
            self._store(kids, keys, entries, sessions)
        finally:
            entries.clear()
            sessions.clear()
