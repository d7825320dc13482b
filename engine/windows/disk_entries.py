"""Window state of user window functions in the disk state backend's RocksDB.

With ``CheckpointConfig(state_backend="disk")`` the window operator's generic
layout for tumbling and sliding windows keeps its (key, window) state in the
operator instance's RocksDB instead of a dict on the heap.

A user ``AggregateFunction``'s accumulator (:class:`DiskEntries`) is one entry per
(key, window)::

    key group (uint16) | state id (uint16) | window end (uint64, big-endian) | key

with the window end offset by 2**63 so byte order is numeric order (as
:mod:`raystream.engine.windows.disk_panes`), and the key encoded as the disk
backend encodes keys. The value is the window's start (int64, little-endian)
and then the accumulator serialized as the backend serializes state values
(MessagePack, pickle for opaque objects). A batch reads its (key, window)
groups' accumulators with one multi-get and writes the merged ones with one
write batch.

A ``ProcessWindowFunction``'s rows (:class:`DiskChunks`, a state of its own) are
appended, never rewritten: each batch writes its rows of a (key, window) as a new
*chunk* beside a small *marker*::

    marker: key group | state id | window end | key
            -> window start (int64 LE) | number of chunks (uint64 LE)
    chunk:  key group | state id | window end | key | seq (uint64, big-endian)
            -> the batch's rows of the window as an Arrow IPC stream

``seq`` numbers a (key, window)'s chunks 0, 1, 2, ... in the order their rows
arrived: a batch reads the markers of its (key, window) pairs (16 bytes each, one
multi-get; a missing one is a new window, whose timers it registers), writes each
pair's chunk at ``seq`` = the marker's count and the count + 1, in one write batch.
The counter lives with the window's entries, in the same key group, so snapshots,
restores and rescaling carry it with them: a seq is never reused, whatever instance
appends next. (Encoded keys are self-delimiting MessagePack, so no key's marker is a
prefix of another key's entries either.) Arrow IPC reads back without copying or
unpickling (a pickled slice of a batch may carry its parent's whole buffers). A
firing reads its due windows' markers and then all their chunks with a second
multi-get, concatenates them in seq order (the heap path's order) and calls the
function once; the cleanup deletes the markers and the chunks it counted with point
deletes in one write batch (no range tombstones), and without allowed lateness, where
the cleanup is the firing, counts them from the markers the firing read. An older
checkpoint's ``ProcessWindowFunction`` windows (one entry of :class:`DiskEntries`
holding all the rows) become one chunk each when the state is restored; a checkpoint
written since names the chunks' state, so restoring it looks for no such entries.

Timers, one per key and window as on the heap (the generic path's timers), are in
the same database (:mod:`raystream.timers.disk_service`). The entries share the
backend's key-group prefix, so its full and incremental snapshots, restores and
rescaling carry them like any keyed state.

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
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> kids = timers.key_ids(["a"], np.array([1]))
    >>> chunks = DiskChunks(backend, timers)
    >>> keys = chunks.entry_keys(kids[:1], np.array([10]))
    >>> for x in ([1, 2], [3]):
    ...     chunks.append(keys, np.array([0]), [tuple(pa.table({"x": x}).to_batches())]).tolist()
    [True]
    [False]
    >>> [(start, pa.Table.from_batches(rows)["x"].to_pylist()) for start, rows in chunks.get(keys)]
    [(0, [1, 2, 3])]
    >>> chunks.delete(keys); chunks.get(keys), chunks.chunks_of(keys)
    ([None], [0])
    >>> backend.close()
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from raystream.checkpoint.disk_layout import (KEYED_PREFIX, ORDERED, SEQUENCE, ordered, ordered_value,
                                             pack_value, state_id_of, state_prefix,
                                             unpack_value)
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.timers.disk_service import DiskTimerService

STATE_NAME = "__window_entries"
KIND = "window-entries"
CHUNKS_NAME = "__window_chunks"
CHUNKS_KIND = "window-chunks"
_START = struct.Struct("<q")
_MARKER = struct.Struct("<qQ")  # window start, number of chunks


class DiskEntries:
    """The (key, window) accumulators of one window operator instance's generic layout,
    in its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService, *,
                 name: str = STATE_NAME, kind: str = KIND) -> None:
        self._backend = backend
        self._timers = timers
        self._name, self._kind = name, kind
        self._sid = state_id_of(backend.raw_state_id(name, kind))

    def entry_keys(self, kids: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """The stored keys of the (key id, window end) pairs ``kids``, ``ends``."""
        pack, sid = ORDERED.pack, self._sid
        offsets = ordered(ends)  # by window end, then key
        return [pack(group, sid, end) + code
                for code, group, end in zip(self._timers.codes(kids),
                                            self._timers.key_groups_of(kids).tolist(), offsets)]

    def get(self, keys: list[bytes]) -> list[tuple[int, Any] | None]:
        """(window start, accumulator) stored at each of ``keys`` (None if none): one
        multi-get."""
        if not keys:
            return []
        raws = list(self._backend.raw_db[keys])  # a list of keys: a multi-get
        return [None if raw is None else (_START.unpack_from(raw)[0], unpack_value(raw[8:]))
                for raw in raws]

    def put(self, keys: list[bytes], starts: np.ndarray, accumulators: list[Any]) -> None:
        """Store the accumulators of windows ``starts`` at ``keys``: one write batch."""
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, start, acc in zip(keys, starts.tolist(), accumulators):
            batch.put(key, _START.pack(start) + pack_value(acc))
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

    def take(self, keys: list[bytes]) -> list[tuple[int, Any] | None]:
        """:meth:`get` then :meth:`delete` of the same ``keys``: a firing that is also its
        windows' cleanup (no allowed lateness)."""
        entries = self.get(keys)
        self.delete(keys)
        return entries

    def export(self) -> Iterator[tuple[int, list[tuple[Any, int, int, Any]]]]:
        """Each key group's windows as ``(key, start, end, value)``: one range scan per key
        group (a disk savepoint restored into a heap job, from a scratch database)."""
        decode = DiskKeyedStateBackend.decode_key
        for group, entries in self._backend.raw_state_entries(self._name, self._kind):
            keys = self._window_keys(entries)
            yield group, [(decode(key[ORDERED.size:]), found[0], ordered_value(key), found[1])
                          for key, found in zip(keys, self.get(keys)) if found is not None]

    def _window_keys(self, entries: list[tuple[bytes, bytes]]) -> list[bytes]:
        """The keys of the windows among a key group's ``entries`` (in key order)."""
        return [key for key, _ in entries]


class DiskChunks(DiskEntries):
    """The rows of a ``ProcessWindowFunction``'s (key, window)s, appended chunk by chunk
    (accumulators are tuples of record batches); ``entry_keys`` are the markers'."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService) -> None:
        # Only a checkpoint written before chunks holds windows as single entries: one
        # written since names the chunks' state too (declared below, before any move),
        # so its restores skip the scan for entries the first restore moved.
        older = (backend.state_kind(STATE_NAME) == KIND
                 and backend.state_kind(CHUNKS_NAME) is None)
        super().__init__(backend, timers, name=CHUNKS_NAME, kind=CHUNKS_KIND)
        if older:
            self._move_in_entries()

    def _window_keys(self, entries: list[tuple[bytes, bytes]]) -> list[bytes]:
        # a marker's chunks follow it in key order, each its key and 8 bytes of seq (no
        # encoded key is a prefix of another's entries): every other entry is a marker
        markers: list[bytes] = []
        for key, _ in entries:
            if not (markers and len(key) == len(markers[-1]) + SEQUENCE.size
                    and key.startswith(markers[-1])):
                markers.append(key)
        return markers

    def _markers(self, keys: list[bytes]) -> list[tuple[int, int] | None]:
        raws = list(self._backend.raw_db[keys]) if keys else []  # one multi-get
        return [None if raw is None else _MARKER.unpack(raw) for raw in raws]

    def chunks_of(self, keys: list[bytes]) -> list[int]:
        """How many chunks each window at ``keys`` holds (0: none)."""
        return [0 if marker is None else marker[1] for marker in self._markers(keys)]

    def append(self, keys: list[bytes], starts: np.ndarray, accumulators: list[Any]
               ) -> np.ndarray:
        """Append each window's rows ``accumulators`` as its next chunk without reading
        the stored ones (one multi-get of the markers, one write batch): which windows
        are new."""
        import rocksdict

        markers = self._markers(keys)
        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, start, rows, marker in zip(keys, starts.tolist(), accumulators, markers):
            seq = 0 if marker is None else marker[1]
            batch.put(chunk_key(key, seq), ipc_bytes(rows))
            batch.put(key, _MARKER.pack(start, seq + 1))
        self._backend.raw_db.write(batch)
        return np.fromiter((m is None for m in markers), dtype=bool, count=len(markers))

    def put(self, keys: list[bytes], starts: np.ndarray, accumulators: list[Any]) -> None:
        """:meth:`append` (a restored heap window is one chunk)."""
        self.append(keys, starts, accumulators)

    def get(self, keys: list[bytes]) -> list[tuple[int, Any] | None]:
        """(window start, all its rows in arrival order) of each window at ``keys`` (None
        if none): the markers, then every chunk, each with one multi-get."""
        return self._windows(keys, self._markers(keys))

    def delete(self, keys: list[bytes]) -> None:
        """Delete the windows at ``keys``: their markers and the chunks they count, with
        point deletes in one write batch."""
        self._delete(keys, self._markers(keys))

    def take(self, keys: list[bytes]) -> list[tuple[int, Any] | None]:
        """:meth:`get` then :meth:`delete`, reading the markers once."""
        markers = self._markers(keys)
        windows = self._windows(keys, markers)
        self._delete(keys, markers)
        return windows

    def _windows(self, keys: list[bytes], markers: list[tuple[int, int] | None]
                 ) -> list[tuple[int, Any] | None]:
        wanted = [chunk_key(key, seq) for key, marker in zip(keys, markers)
                  if marker is not None for seq in range(marker[1])]
        raws = iter(list(self._backend.raw_db[wanted]) if wanted else [])
        out: list[tuple[int, Any] | None] = []
        for marker in markers:
            if marker is None:
                out.append(None)
                continue
            rows: list = []
            for _ in range(marker[1]):
                raw = next(raws)
                if raw is not None:  # every counted chunk is there (one write batch each)
                    rows.extend(ipc_batches(raw))
            out.append((marker[0], tuple(rows)))
        return out

    def _delete(self, keys: list[bytes], markers: list[tuple[int, int] | None]) -> None:
        super().delete([*keys, *(chunk_key(key, seq) for key, marker in zip(keys, markers)
                                 if marker is not None for seq in range(marker[1]))])

    def _move_in_entries(self) -> None:
        """An older checkpoint's windows, one entry each holding all their rows: one chunk
        each now."""
        import rocksdict

        backend = self._backend
        for group, entries in backend.raw_state_entries(STATE_NAME, KIND):
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, raw in entries:
                mine = state_prefix(group, self._sid) + key[4:]
                batch.put(chunk_key(mine, 0), ipc_bytes(tuple(unpack_value(raw[8:]))))
                batch.put(mine, _MARKER.pack(_START.unpack_from(raw)[0], 1))
                batch.delete(key)
            backend.raw_db.write(batch)


def chunk_key(key: bytes, seq: int) -> bytes:
    """The key of chunk ``seq`` of the entry at ``key`` (windows' rows here, sessions' in
    :mod:`~raystream.engine.windows.disk_session_join` and
    :mod:`~raystream.engine.windows.disk_generic_sessions`): its chunks follow it in seq
    order."""
    return key + SEQUENCE.pack(seq)


def is_header(key: bytes) -> bool:
    """Whether stored ``key`` is a header in the backend's keyed layout (``kg | sid |
    len(key) | key``), not one of its chunks (:func:`chunk_key`)."""
    return len(key) == KEYED_PREFIX.size + KEYED_PREFIX.unpack_from(key)[2]


def ipc_bytes(rows: Sequence[pa.RecordBatch]) -> bytes:
    """Record batches of one schema as one Arrow IPC stream (empty: no batches)."""
    if not rows:
        return b""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows[0].schema) as writer:
        for batch in rows:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def ipc_batches(raw: bytes) -> tuple:
    """The record batches of :func:`ipc_bytes`'s bytes (zero-copy over ``raw``)."""
    return tuple(pa.ipc.open_stream(pa.py_buffer(raw))) if raw else ()
