"""Session windows of a window join or co-group in the disk state backend's RocksDB.

With ``CheckpointConfig(state_backend="disk")`` a window join (or co-group) over
``EventTimeSessionWindows`` keeps each key's open sessions and both sides' rows of
them in the instance's RocksDB instead of the heap's row buffers. Each key is one
entry, in the backend's own layout for keyed state::

    key group (uint16) | state id (uint16) | len(key) (uint32) | key

with the key encoded as the disk backend encodes keys. The value is the key's open
sessions, then chunks of its rows::

    n (uint32) | n x (start, end) (int64, little-endian, by start) |
    chunk: side (uint8) | format fingerprint (8 bytes) | len (uint32) | rows ...

A chunk's rows (with their event time in column ``__ts``) are stored as
:mod:`raystream.engine.operators.disk_join` stores join rows, with its formats
(fixed-width numpy records, or an Arrow IPC message; the format's schema an entry
of its own per key group): nothing is pickled.

A batch reads its distinct keys' entries with one multi-get, merges its rows'
sessions ``[ts, ts + gap)`` into the stored ones (numpy, over all its keys at
once), appends one chunk per key and side without decoding the stored rows, and
writes the entries back with one write batch; a session that took in rows gets a
timer at ``end - 1`` on the timer service (the namespace is its start). A
watermark pops the due timers (a bounded chunk at a time, see
:class:`~raystream.timers.disk_service.DiskTimerService`) and reads their keys
with one multi-get: the rows
of each key's sessions with ``end - 1 <= watermark`` are decoded (one Arrow call
per format), fire, and the key's entry is rewritten with the rest (deleted when
nothing is left) in one write batch. A timer left by a session that merged into
a longer one finds nothing due: sessions only grow, so the last timer of a
session is at its end. Python runs per distinct key, never per row. Key ids come
from the timer service within one call and are not kept. Entries share the
backend's key-group prefix, so its full and incremental snapshots, restores and
rescaling carry them like any keyed state.

    >>> import numpy as np
    >>> import pyarrow as pa
    >>> from raystream.timers.disk_service import DiskTimerService
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> disk = DiskSessionRows(backend, timers, gap_ms=10)
    >>> kid = timers.key_ids(["a"], np.array([1]))
    >>> disk.append(JoinSide.LEFT, KeyedRows(pa.table({"id": [1, 2]}), np.array([0, 25]),
    ...                                      kid[[0, 0]]))
    >>> disk.append(JoinSide.RIGHT, KeyedRows(pa.table({"id": [3]}), np.array([5]), kid))
    >>> (left, left_ends), (right, _) = disk.take_due(20)  # the session [0, 15) fires
    >>> left.table["id"].to_pylist(), left.ts.tolist(), left_ends.tolist()
    ([1], [0], [15])
    >>> right.table["id"].to_pylist(), disk.stored_entries()  # [25, 35) stays
    ([3], 1)
    >>> disk.take_due(20) is None  # no timer is due any more
    True
    >>> backend.close()
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.operators.disk_join import RowFormat, RowFormats
from raystream.engine.operators.keyed_rows import JoinSide, KeyedRows, concat_tables
from raystream.engine.windows.sessions import session_breaks
from raystream.timers.disk_service import DiskTimerService

STATE_NAME = "__session_join_rows"
KIND = "session-join-rows"
TS = "__ts"  # a stored row's event time
_COUNT = struct.Struct("<I")
_CHUNK = struct.Struct("<B8sI")  # side, format fingerprint, payload length
_SESSION = np.dtype([("start", "<i8"), ("end", "<i8")])


class _Entry:
    """One key's stored value, parsed lazily: its sessions, and its chunks' bytes."""

    __slots__ = ("starts", "ends", "chunks")

    def __init__(self, raw: bytes | None) -> None:
        if raw is None:
            self.starts = self.ends = np.empty(0, np.int64)
            self.chunks = b""
            return
        (n,) = _COUNT.unpack_from(raw)
        sessions = np.frombuffer(raw, dtype=_SESSION, count=n, offset=_COUNT.size)
        self.starts = sessions["start"].astype(np.int64)
        self.ends = sessions["end"].astype(np.int64)
        self.chunks = raw[_COUNT.size + n * _SESSION.itemsize:]


def _head(starts: np.ndarray, ends: np.ndarray) -> bytes:
    sessions = np.empty(len(starts), dtype=_SESSION)
    sessions["start"], sessions["end"] = starts, ends
    return _COUNT.pack(len(starts)) + sessions.tobytes()


def _chunks(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """(side, fingerprint, payload) of a key's chunks."""
    out, at = [], 0
    while at < len(data):
        side, fp, size = _CHUNK.unpack_from(data, at)
        at += _CHUNK.size
        out.append((side, fp, data[at:at + size]))
        at += size
    return out


class DiskSessionRows:
    """Both sides' rows of one session window join instance, by key, in its disk backend.

    ``append(side, rows)`` (``rows.ts``: event times) as the tumbling / sliding
    :class:`~raystream.engine.operators.disk_join.DiskWindowRows` does; :meth:`take_due`
    instead of its ``take``."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService, gap_ms: int
                 ) -> None:
        self._backend = backend
        self._timers = timers
        self._gap = int(gap_ms)
        self._sid = backend.raw_state_id(STATE_NAME, KIND)
        self._formats = RowFormats(backend)
        self._first = backend.key_groups.start

    def _keys(self, kids: np.ndarray) -> list[bytes]:
        timers = self._timers
        return self._backend.entry_keys(self._sid, timers.keys(kids), timers.key_groups_of(kids))

    def _read(self, keys: list[bytes]) -> list[_Entry]:
        return [_Entry(raw) for raw in self._backend.raw_db[keys]]  # a list: a multi-get

    def append(self, side: JoinSide, rows: KeyedRows) -> None:
        """Add ``rows`` of ``side`` to their keys' sessions: one multi-get, one chunk per
        key, one write batch; timers for the sessions that took rows in."""
        import rocksdict

        if not len(rows.kid):
            return
        order = np.lexsort((rows.ts, rows.kid))
        kid, ts = rows.kid[order], rows.ts[order]
        distinct, firsts = np.unique(kid, return_index=True)
        lasts = np.append(firsts[1:], len(kid))
        keys = self._keys(distinct)
        entries = self._read(keys)
        # the stored sessions and the rows' own [ts, ts + gap), merged per key
        n_old = np.fromiter((len(e.starts) for e in entries), np.int64, len(entries))
        all_kid = np.concatenate([np.repeat(distinct, n_old), kid])
        all_start = np.concatenate([*(e.starts for e in entries), ts])
        all_end = np.concatenate([*(e.ends for e in entries), ts + self._gap])
        is_new = np.concatenate([np.zeros(int(n_old.sum()), bool), np.ones(len(kid), bool)])
        by = np.lexsort((all_start, all_kid))
        all_kid, all_start, all_end, is_new = (all_kid[by], all_start[by], all_end[by],
                                               is_new[by])
        breaks = np.flatnonzero(session_breaks(all_kid, all_start, all_end))
        s_kid, s_start = all_kid[breaks], all_start[breaks]
        s_end = np.maximum.reduceat(all_end, breaks)
        changed = np.logical_or.reduceat(is_new, breaks)
        self._timers.register_event_time_timers(s_kid[changed], s_start[changed],
                                                s_end[changed] - 1)
        # the batch's rows of each key: one payload per key, in the batch's format
        table = rows.table.append_column(TS, pa.array(rows.ts, pa.int64()))
        batch = table.take(pa.array(order, pa.int64())).combine_chunks().to_batches()[0]
        writes = rocksdict.WriteBatch(raw_mode=True)
        fp, fmt = self._formats.of(batch, self._timers.key_groups_of(distinct) - self._first,
                                   writes)
        payloads = fmt.payloads(batch, firsts.tolist(), lasts.tolist())
        s_los = np.searchsorted(s_kid, distinct, side="left").tolist()
        s_his = np.searchsorted(s_kid, distinct, side="right").tolist()
        for key, entry, payload, a, b in zip(keys, entries, payloads, s_los, s_his):
            writes.put(key, _head(s_start[a:b], s_end[a:b]) + entry.chunks
                       + _CHUNK.pack(side, fp, len(payload)) + payload)
        self._backend.raw_db.write(writes)

    def take_due(self, watermark: int) -> tuple[tuple[KeyedRows, np.ndarray] | None, ...] | None:
        """Pop a chunk of the timers due at ``watermark`` (None: none was due); read and
        remove the rows of their keys' sessions with ``end - 1 <= watermark``: per side,
        the rows (``ts``: their session's start) and their session's ends (None: no row
        of that side). Call it again, after a safe point, until it returns None."""
        import rocksdict

        _, kids, _ = self._timers.advance_watermark(watermark)
        if not len(kids):
            return None
        distinct = np.unique(kids)
        keys = self._keys(distinct)
        entries = self._read(keys)
        due_keys = [i for i, e in enumerate(entries) if len(e.ends) and e.ends[0] - 1 <= watermark]
        if not due_keys:
            return None, None
        # every stored row of the due keys, per (side, format): one decode each
        found: dict[tuple[int, bytes], tuple[list[bytes], list[int], int]] = {}
        groups = self._timers.key_groups_of(distinct).tolist()
        for i in due_keys:
            for side, fp, payload in _chunks(entries[i].chunks):
                # a key group holding the format (a restored one is read from there)
                payloads, owners, _ = found.setdefault((side, fp), ([], [], groups[i]))
                payloads.append(payload)
                owners.append(i)
        s_index = np.repeat(np.arange(len(due_keys)),
                            [len(entries[i].starts) for i in due_keys])
        s_start = np.concatenate([entries[i].starts for i in due_keys])
        s_end = np.concatenate([entries[i].ends for i in due_keys])
        key_pos = np.full(len(entries), -1, np.int64)
        key_pos[due_keys] = np.arange(len(due_keys))
        fired: list[list[tuple[pa.Table, np.ndarray, np.ndarray]]] = [[], []]
        kept: list[tuple[int, bytes, RowFormat, pa.RecordBatch, np.ndarray]] = []
        for (side, fp), (payloads, owners, group) in found.items():
            fmt = self._formats.get(fp, group)
            table, sizes = fmt.table(payloads)
            owner = np.repeat(key_pos[owners], sizes)
            ts = table.column(TS).to_numpy()
            session = _session_of(s_index, s_start, owner, ts)
            due = s_end[session] - 1 <= watermark
            rows = table.drop_columns([TS])
            if due.any():
                at = np.flatnonzero(due)
                fired[side].append((rows.take(pa.array(at)), session[at], owner[at]))
            if not due.all():
                rest = np.flatnonzero(~due)
                rest = rest[np.argsort(owner[rest], kind="stable")]
                kept.append((side, fp, fmt, _one_batch(table.take(pa.array(rest))), owner[rest]))
        # the due keys' entries: the sessions that stay, and their rows, rewritten
        stay = s_end - 1 > watermark
        positions = np.arange(len(due_keys))
        k_index, k_start, k_end = s_index[stay], s_start[stay], s_end[stay]
        heads = [[_head(k_start[a:b], k_end[a:b])] for a, b in zip(
            np.searchsorted(k_index, positions, side="left").tolist(),
            np.searchsorted(k_index, positions, side="right").tolist())]
        for side, fp, fmt, batch, owner in kept:  # rows that stay, by key
            lo = np.searchsorted(owner, positions, side="left")
            hi = np.searchsorted(owner, positions, side="right")
            held = np.flatnonzero(hi > lo)
            for at, payload in zip(held.tolist(), fmt.payloads(batch, lo[held].tolist(),
                                                               hi[held].tolist())):
                heads[at].append(_CHUNK.pack(side, fp, len(payload)) + payload)
        writes = rocksdict.WriteBatch(raw_mode=True)
        for at, i in enumerate(due_keys):
            if len(heads[at]) == 1 and heads[at][0] == _COUNT.pack(0):
                writes.delete(keys[i])
            else:
                writes.put(keys[i], b"".join(heads[at]))
        self._backend.raw_db.write(writes)
        due_kids = distinct[due_keys]
        return (_fired(fired[0], due_kids, s_start, s_end),
                _fired(fired[1], due_kids, s_start, s_end))

    def stored_entries(self) -> int:
        """How many keys hold sessions (tests; a full scan)."""
        backend = self._backend
        read_options = backend.read_options(struct.pack(">H", backend.key_groups.stop))
        return sum(1 for k in backend.raw_db.keys(from_key=struct.pack(
            ">H", backend.key_groups.start), read_opt=read_options) if k[2:4] == self._sid)


def _session_of(s_index: np.ndarray, s_start: np.ndarray, owner: np.ndarray,
                ts: np.ndarray) -> np.ndarray:
    """Per row (its key's position ``owner`` among the due keys, its time ``ts``), the
    index of its session among the sessions (``s_index``: their key's position, by start
    within each key): the last session of its key starting at or before it.

        >>> _session_of(np.array([0, 0, 1]), np.array([0, 50, 7]), np.array([1, 0, 0]),
        ...             np.array([9, 60, 3])).tolist()
        [2, 1, 0]
    """
    n = len(s_index)
    kind = np.concatenate([np.zeros(n, np.int8), np.ones(len(ts), np.int8)])
    order = np.lexsort((kind, np.concatenate([s_start, ts]), np.concatenate([s_index, owner])))
    marks = np.where(order < n, order, -1)
    carried = np.maximum.accumulate(marks)  # sessions are in (key, start) order: indices grow
    out = np.empty(len(ts), np.int64)
    rows = order >= n
    out[order[rows] - n] = carried[rows]
    return out


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def _fired(parts: Sequence[tuple[pa.Table, np.ndarray, np.ndarray]], due_kids: np.ndarray,
           s_start: np.ndarray, s_end: np.ndarray) -> tuple[KeyedRows, np.ndarray] | None:
    """One side's fired rows as :class:`KeyedRows` (``ts``: the session start) and their
    sessions' ends."""
    if not parts:
        return None
    table = concat_tables([t for t, _, _ in parts]) if len(parts) > 1 else parts[0][0]
    session = np.concatenate([s for _, s, _ in parts])
    owner = np.concatenate([o for _, _, o in parts])
    return KeyedRows(table, s_start[session], due_kids[owner]), s_end[session]
