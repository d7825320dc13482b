"""Session windows of a window join or co-group in the disk state backend's RocksDB.

With ``CheckpointConfig(state_backend="disk")`` a window join (or co-group) over
``EventTimeSessionWindows`` keeps each key's open sessions and both sides' rows of
them in the instance's RocksDB instead of the heap's row buffers. Each key has a
small *header*, in the backend's own layout for keyed state, and its rows in
*chunks* beside it, one per batch that brought the key rows of one side::

    header: key group (uint16) | state id (uint16) | len(key) (uint32) | key
            -> chunks (uint64) | n (uint32) | n x (start, end) (int64, by start)
    chunk:  key group | state id | len(key) | key | seq (uint64, big-endian)
            -> side (uint8) | format fingerprint (8 bytes) | rows

with the key encoded as the disk backend encodes keys, the values' numbers
little-endian and ``seq`` numbering a key's chunks 0, 1, ..., ``chunks - 1`` (the
key's length in front makes no header's key a prefix of another key's entries). A
chunk's rows (with their event time in column ``__ts``) are stored as
:mod:`raystream.engine.operators.disk_join` stores join rows, with its formats
(fixed-width numpy records, or an Arrow IPC message; the format's schema an entry
of its own per key group): nothing is pickled.

A batch reads its distinct keys' headers with one multi-get, drops its late rows
(a row whose own window is late and that no open session takes in), merges its rows'
sessions ``[ts, ts + gap)`` into the stored ones (numpy, over all its keys at
once), and in one write batch puts one chunk per key at ``seq`` = the header's count
and the header with the merged sessions and the count + 1: it never reads or
rewrites the rows stored before, so a key with many rows in one open session pays,
per batch, for that batch's rows and a header of 12 bytes + 16 per open session. A
session that took in rows gets a timer at ``end - 1`` on the timer service (the
namespace is its start). A watermark pops the due timers (a bounded chunk at a
time, see :class:`~raystream.timers.disk_service.DiskTimerService`) and reads their
keys' headers with one multi-get; the keys with a session with ``end - 1 <=
watermark`` have all their chunks read with a second one and decoded (one Arrow call
per side and format), the due sessions' rows fire, and one write batch stores the
rows that stay as the key's new chunks (one per side and format, from seq 0),
deletes the chunks beyond those and rewrites the header (deleting it when no
session is left). A key's sessions do not overlap, so the due ones are its earliest
and the rows that stay belong to later sessions: few in a stream in order (those
within the watermark's lag), already decoded to split them from the due ones, and
compacted so that a header's count is all it takes to find a key's chunks. A timer
left by a session that merged into a longer one finds nothing due in the header
(sessions only grow, so the last timer of a session is at its end), and no chunk is
read. Python runs per distinct key and chunk, never per row. Key ids come from the
timer service within one call and are not kept. Entries share the backend's
key-group prefix, so its full and incremental snapshots, restores and rescaling
carry them like any keyed state. An older checkpoint's keys (one entry each, of a
state of its own: the sessions, then every chunk with its length) become a header
and chunks when the state is restored; a checkpoint written since names the chunks'
state, so restoring it looks for no such entries.

    >>> import numpy as np
    >>> import pyarrow as pa
    >>> from raystream.timers.disk_service import DiskTimerService
    >>> backend = DiskKeyedStateBackend(max_parallelism=8, key_groups=range(8))
    >>> timers = DiskTimerService(backend)
    >>> disk = DiskSessionRows(backend, timers, gap_ms=10)
    >>> kid = timers.key_ids(["a"], np.array([1]))
    >>> _ = disk.append(JoinSide.LEFT, KeyedRows(pa.table({"id": [1, 2]}), np.array([0, 25]),
    ...                                          kid[[0, 0]]))
    >>> _ = disk.append(JoinSide.RIGHT, KeyedRows(pa.table({"id": [3]}), np.array([5]), kid))
    >>> disk.chunks_of(kid)  # one per batch, neither rewritten by the other
    [2]
    >>> (left, left_ends), (right, _) = disk.take_due(20)  # [0, 15) fires, [25, 35) stays
    >>> left.table["id"].to_pylist(), left.ts.tolist(), left_ends.tolist()
    ([1], [0], [15])
    >>> right.table["id"].to_pylist(), disk.stored_entries(), disk.chunks_of(kid)
    ([3], 1, [1])
    >>> disk.take_due(20) is None  # no timer is due any more
    True
    >>> backend.close()
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from raystream.checkpoint.disk_layout import group_bound
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.operators.disk_join import RowFormat, RowFormats
from raystream.engine.operators.keyed_rows import JoinSide, KeyedRows, concat_tables
from raystream.engine.windows.disk_entries import chunk_key, is_header
from raystream.engine.windows.sessions import (Windows, late_for_sessions,
                                              session_at_or_before, session_breaks)
from raystream.timers.disk_service import DiskTimerService

# A checkpoint written before chunks holds each key as one entry of this state; its kind
# begins the chunks' too, so a heap job refuses both (the operator's disk-only kinds).
STATE_NAME = "__session_join_rows"
KIND = "session-join-rows"
CHUNKS_NAME = "__session_join_chunks"
CHUNKS_KIND = "session-join-rows-chunks"
TS = "__ts"  # a stored row's event time
_HEAD = struct.Struct("<QI")  # number of chunks, number of sessions
_CHUNK = struct.Struct("<B8s")  # side, format fingerprint
_SESSION = np.dtype([("start", "<i8"), ("end", "<i8")])
_OLD_COUNT = struct.Struct("<I")  # the older layout: sessions, then chunks with lengths
_OLD_CHUNK = struct.Struct("<B8sI")
_NO_SESSIONS = np.empty(0, np.int64)


class _Head:
    """One key's header: its number of chunks and its sessions (by start)."""

    __slots__ = ("chunks", "starts", "ends")

    def __init__(self, raw: bytes | None) -> None:
        if raw is None:
            self.chunks, self.starts, self.ends = 0, _NO_SESSIONS, _NO_SESSIONS
            return
        self.chunks, n = _HEAD.unpack_from(raw)
        sessions = np.frombuffer(raw, dtype=_SESSION, count=n, offset=_HEAD.size)
        self.starts = sessions["start"].astype(np.int64)
        self.ends = sessions["end"].astype(np.int64)


def _head(chunks: int, starts: np.ndarray, ends: np.ndarray) -> bytes:
    sessions = np.empty(len(starts), dtype=_SESSION)
    sessions["start"], sessions["end"] = starts, ends
    return _HEAD.pack(chunks, len(starts)) + sessions.tobytes()


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
        # Only a checkpoint written before chunks holds keys as single entries: one
        # written since names the chunks' state too (declared below, before any move),
        # so its restores skip the scan for entries the first restore moved.
        older = (backend.state_kind(STATE_NAME) == KIND
                 and backend.state_kind(CHUNKS_NAME) is None)
        self._sid = backend.raw_state_id(CHUNKS_NAME, CHUNKS_KIND)
        self._formats = RowFormats(backend)
        self._first = backend.key_groups.start
        if older:
            self._move_in_entries()

    def _keys(self, kids: np.ndarray) -> list[bytes]:
        timers = self._timers
        return self._backend.entry_keys(self._sid, timers.keys(kids), timers.key_groups_of(kids))

    def _heads(self, keys: list[bytes]) -> list[_Head]:
        return [_Head(raw) for raw in self._backend.raw_db[keys]]  # a list: a multi-get

    def append(self, side: JoinSide, rows: KeyedRows, *, late: np.ndarray | None = None,
               watermarks: Callable[[np.ndarray], np.ndarray | int] | None = None
               ) -> np.ndarray:
        """Add ``rows`` of ``side`` to their keys' sessions: one multi-get of the headers,
        one chunk per key, one write batch; timers for the sessions that took rows in.
        ``late``: the rows whose own window is late (``watermarks(kids)``: the watermark
        judging each key); those that no open session takes in
        (:func:`~raystream.engine.windows.sessions.late_for_sessions`, judged by the
        headers read) are dropped: returns them."""
        import rocksdict

        dropped = np.zeros(len(rows.kid), dtype=bool)
        if not len(rows.kid):
            return dropped
        every = np.unique(rows.kid)
        every_keys = self._keys(every)
        every_heads = self._heads(every_keys)
        if late is not None and late.any():
            if watermarks is None:
                raise TypeError("late rows need the watermarks that judge them")
            held = Windows(np.repeat(every, [len(h.starts) for h in every_heads]),
                           np.concatenate([_NO_SESSIONS, *(h.starts for h in every_heads)]),
                           np.concatenate([_NO_SESSIONS, *(h.ends for h in every_heads)]))
            dropped = late_for_sessions(rows.kid, rows.ts, rows.ts + self._gap, late,
                                        lambda _: held, watermarks, 0)
            if dropped.all():
                return dropped
            if dropped.any():
                rows = rows.take(np.flatnonzero(~dropped))
        order = np.lexsort((rows.ts, rows.kid))
        kid, ts = rows.kid[order], rows.ts[order]
        distinct, firsts = np.unique(kid, return_index=True)
        lasts = np.append(firsts[1:], len(kid))
        at = np.searchsorted(every, distinct).tolist()  # keys left with rows
        keys = [every_keys[i] for i in at]
        heads = [every_heads[i] for i in at]
        # the stored sessions and the rows' own [ts, ts + gap), merged per key
        n_old = np.fromiter((len(h.starts) for h in heads), np.int64, len(heads))
        all_kid = np.concatenate([np.repeat(distinct, n_old), kid])
        all_start = np.concatenate([*(h.starts for h in heads), ts])
        all_end = np.concatenate([*(h.ends for h in heads), ts + self._gap])
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
        # the batch's rows of each key: one chunk per key, in the batch's format
        table = rows.table.append_column(TS, pa.array(rows.ts, pa.int64()))
        batch = table.take(pa.array(order, pa.int64())).combine_chunks().to_batches()[0]
        writes = rocksdict.WriteBatch(raw_mode=True)
        fp, fmt = self._formats.of(batch, self._timers.key_groups_of(distinct) - self._first,
                                   writes)
        payloads = fmt.payloads(batch, firsts.tolist(), lasts.tolist())
        s_los = np.searchsorted(s_kid, distinct, side="left").tolist()
        s_his = np.searchsorted(s_kid, distinct, side="right").tolist()
        tag = _CHUNK.pack(side, fp)
        for key, head, payload, a, b in zip(keys, heads, payloads, s_los, s_his):
            writes.put(chunk_key(key, head.chunks), tag + payload)
            writes.put(key, _head(head.chunks + 1, s_start[a:b], s_end[a:b]))
        self._backend.raw_db.write(writes)
        return dropped

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
        heads = self._heads(keys)
        # a key's sessions do not overlap: its due ones are its earliest
        due_keys = [i for i, h in enumerate(heads) if len(h.ends) and h.ends[0] - 1 <= watermark]
        if not due_keys:
            return None, None
        # every stored row of the due keys (a second multi-get), per (side, format): one
        # decode each
        wanted = [chunk_key(keys[i], seq) for i in due_keys for seq in range(heads[i].chunks)]
        raws = iter(self._backend.raw_db[wanted] if wanted else [])
        found: dict[tuple[int, bytes], tuple[list[bytes], list[int], int]] = {}
        groups = self._timers.key_groups_of(distinct).tolist()
        for at, i in enumerate(due_keys):
            for _ in range(heads[i].chunks):
                raw = next(raws)  # every counted chunk is there (one write batch each)
                side, fp = _CHUNK.unpack_from(raw)
                # a key group holding the format (a restored one is read from there)
                payloads, owners, _ = found.setdefault((side, fp), ([], [], groups[i]))
                payloads.append(raw[_CHUNK.size:])
                owners.append(at)
        s_index = np.repeat(np.arange(len(due_keys)), [len(heads[i].starts) for i in due_keys])
        s_start = np.concatenate([heads[i].starts for i in due_keys])
        s_end = np.concatenate([heads[i].ends for i in due_keys])
        fired: list[list[tuple[pa.Table, np.ndarray, np.ndarray]]] = [[], []]
        kept: list[tuple[bytes, RowFormat, pa.RecordBatch, np.ndarray]] = []
        for (side, fp), (payloads, owners, group) in found.items():
            fmt = self._formats.get(fp, group)
            table, sizes = fmt.table(payloads)
            owner = np.repeat(np.array(owners, np.int64), sizes)
            ts = table.column(TS).to_numpy()
            session = session_at_or_before(s_index, s_start, owner, ts)
            due = s_end[session] - 1 <= watermark
            rows = table.drop_columns([TS])
            if due.any():
                at = np.flatnonzero(due)
                fired[side].append((rows.take(pa.array(at)), session[at], owner[at]))
            if not due.all():
                rest = np.flatnonzero(~due)
                rest = rest[np.argsort(owner[rest], kind="stable")]
                kept.append((_CHUNK.pack(side, fp), fmt, _one_batch(table.take(pa.array(rest))),
                             owner[rest]))
        # the rows that stay, by key: its new chunks, one per side and format, from seq 0
        positions = np.arange(len(due_keys))
        stays: list[list[bytes]] = [[] for _ in due_keys]
        for tag, fmt, batch, owner in kept:
            lo = np.searchsorted(owner, positions, side="left")
            hi = np.searchsorted(owner, positions, side="right")
            held = np.flatnonzero(hi > lo)
            for at, payload in zip(held.tolist(), fmt.payloads(batch, lo[held].tolist(),
                                                               hi[held].tolist())):
                stays[at].append(tag + payload)
        stay = s_end - 1 > watermark
        k_index, k_start, k_end = s_index[stay], s_start[stay], s_end[stay]
        writes = rocksdict.WriteBatch(raw_mode=True)
        for at, a, b in zip(positions.tolist(),
                            np.searchsorted(k_index, positions, side="left").tolist(),
                            np.searchsorted(k_index, positions, side="right").tolist()):
            key, chunks = keys[due_keys[at]], stays[at]
            for seq, chunk in enumerate(chunks):
                writes.put(chunk_key(key, seq), chunk)
            for seq in range(len(chunks), heads[due_keys[at]].chunks):
                writes.delete(chunk_key(key, seq))
            if a == b:  # no session left, hence no row
                writes.delete(key)
            else:
                writes.put(key, _head(len(chunks), k_start[a:b], k_end[a:b]))
        self._backend.raw_db.write(writes)
        due_kids = distinct[due_keys]
        return (_fired(fired[0], due_kids, s_start, s_end),
                _fired(fired[1], due_kids, s_start, s_end))

    def export(self) -> Iterator[tuple[JoinSide, pa.Table, np.ndarray]]:
        """Both sides' rows with their times, key group by key group (a disk savepoint
        restored into a heap job, whose buffers are the rows): one range scan per key
        group."""
        for group, entries in self._backend.raw_state_entries(CHUNKS_NAME, CHUNKS_KIND):
            found: dict[tuple[int, bytes], list[bytes]] = {}
            for key, value in entries:
                if not is_header(key):
                    side, fp = _CHUNK.unpack_from(value)
                    found.setdefault((side, fp), []).append(value[_CHUNK.size:])
            for (side, fp), payloads in sorted(found.items()):
                table, _ = self._formats.get(fp, group).table(payloads)
                yield (JoinSide(side), table.drop_columns([TS]),
                       table[TS].to_numpy().astype(np.int64))

    def chunks_of(self, kids: np.ndarray) -> list[int]:
        """How many chunks each of the key ids ``kids`` holds (0: none): one multi-get."""
        return [head.chunks for head in self._heads(self._keys(kids))]

    def stored_entries(self) -> int:
        """How many keys hold sessions: their headers (tests; a full scan)."""
        backend = self._backend
        read_options = backend.read_options(group_bound(backend.key_groups.stop))
        return sum(1 for k in backend.raw_db.keys(from_key=group_bound(
            backend.key_groups.start), read_opt=read_options)
            if k[2:4] == self._sid and is_header(k))

    def _move_in_entries(self) -> None:
        """An older checkpoint's keys, one entry each holding the sessions and then every
        chunk with its length: a header and an entry per chunk now."""
        import rocksdict

        backend = self._backend
        for _, entries in backend.raw_state_entries(STATE_NAME, KIND):
            writes = rocksdict.WriteBatch(raw_mode=True)
            for key, raw in entries:
                new = key[:2] + self._sid + key[4:]
                (n,) = _OLD_COUNT.unpack_from(raw)
                at = _OLD_COUNT.size + n * _SESSION.itemsize
                seq = 0
                while at < len(raw):
                    side, fp, size = _OLD_CHUNK.unpack_from(raw, at)
                    at += _OLD_CHUNK.size
                    writes.put(chunk_key(new, seq), _CHUNK.pack(side, fp) + raw[at:at + size])
                    at += size
                    seq += 1
                writes.put(new, _HEAD.pack(seq, n) + raw[_OLD_COUNT.size:
                                                         _OLD_COUNT.size + n * _SESSION.itemsize])
                writes.delete(key)
            backend.raw_db.write(writes)




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
