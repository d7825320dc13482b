"""Accumulators of user window functions in the disk state backend's RocksDB.

With ``CheckpointConfig(state_backend="disk")`` the window operator's generic
layout for tumbling and sliding windows (a user ``AggregateFunction`` or a
``ProcessWindowFunction``) keeps each (key, window)'s accumulator in the
operator instance's RocksDB instead of a dict on the heap. Each entry is::

    key group (uint16) | state id (uint16) | window end (uint64, big-endian) | key

with the window end offset by 2**63 so byte order is numeric order (as
:mod:`raystream.engine.windows.disk_panes`), and the key encoded as the disk
backend encodes keys. The value is the window's start (int64, little-endian)
and then the accumulator serialized as the backend serializes state values
(MessagePack, pickle for opaque objects such as a ``ProcessWindowFunction``'s
row batches).

A batch reads its (key, window) groups' accumulators with one multi-get and
writes the merged ones with one write batch; firing timers read their due
(key, window) pairs with one multi-get, and the cleanup timers delete theirs
with one write batch. Timers, one per key and window as on the heap (the
generic path's timers), are in the same database
(:mod:`raystream.timers.disk_service`). The entries share the
backend's key-group prefix, so its full and incremental snapshots, restores
and rescaling carry them like any keyed state.

    >>> from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    >>> from raystream.timers.disk_service import DiskTimerService
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> disk = DiskEntries(backend, timers)
    >>> kids = timers.key_ids(["a", "b"], np.array([1, 2]))
    >>> keys = disk.entry_keys(kids, np.array([10, 10]))
    >>> disk.get(keys)
    [None, None]
    >>> disk.put(keys, np.array([0, 0]), [(1, 2), [3]])
    >>> disk.get(keys)
    [(0, (1, 2)), (0, [3])]
    >>> disk.delete(keys[:1]); disk.get(keys)[0] is None
    True
    >>> backend.close()
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from raystream.checkpoint.disk_state import DiskKeyedStateBackend, _pack, _unpack
from raystream.timers.disk_service import DiskTimerService

STATE_NAME = "__window_entries"
KIND = "window-entries"
_ENTRY = struct.Struct(">HHQ")  # key group, state id, window end + 2**63
_START = struct.Struct("<q")
_SIGN = 1 << 63


class DiskEntries:
    """The (key, window) accumulators of one window operator instance's generic layout,
    in its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService) -> None:
        self._backend = backend
        self._timers = timers
        self._sid = struct.unpack(">H", backend.raw_state_id(STATE_NAME, KIND))[0]

    def entry_keys(self, kids: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """The stored keys of the (key id, window end) pairs ``kids``, ``ends``."""
        pack, sid = _ENTRY.pack, self._sid
        offsets = (np.ascontiguousarray(ends, dtype=np.int64).view(np.uint64)
                   ^ np.uint64(_SIGN)).tolist()  # end + 2**63: byte order is numeric order
        return [pack(group, sid, end) + code
                for code, group, end in zip(self._timers.codes(kids),
                                            self._timers.key_groups_of(kids).tolist(), offsets)]

    def get(self, keys: list[bytes]) -> list[tuple[int, Any] | None]:
        """(window start, accumulator) stored at each of ``keys`` (None if none): one
        multi-get."""
        if not keys:
            return []
        raws = list(self._backend.raw_db[keys])  # a list of keys: a multi-get
        return [None if raw is None else (_START.unpack_from(raw)[0], _unpack(raw[8:]))
                for raw in raws]

    def put(self, keys: list[bytes], starts: np.ndarray, accumulators: list[Any]) -> None:
        """Store the accumulators of windows ``starts`` at ``keys``: one write batch."""
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, start, acc in zip(keys, starts.tolist(), accumulators):
            batch.put(key, _START.pack(start) + _pack(acc))
        self._backend.raw_db.write(batch)

    def delete(self, keys: list[bytes]) -> None:
        """Delete the entries at ``keys``: one write batch."""
        import rocksdict

        if not keys:
            return
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key in keys:
            batch.delete(key)
        self._backend.raw_db.write(batch)
