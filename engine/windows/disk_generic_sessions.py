"""Session windows of user functions in the disk state backend's RocksDB.

With ``CheckpointConfig(state_backend="disk")`` the window operator's generic
layout for session windows (a user ``AggregateFunction``, ``reduce`` or a
``ProcessWindowFunction`` over ``EventTimeSessionWindows``) keeps each key's open
sessions in the operator instance's RocksDB instead of the heap's ``entries`` and
``sessions`` dicts. Each key has a *header*, in the backend's own layout for keyed
state, and, for a ``ProcessWindowFunction``, its sessions' rows in *chunks* beside
it::

    header: key group (uint16) | state id (uint16) | len(key) (uint32) | key
            -> [next seq, [[start, end, 0, accumulator] or [start, end, 1, runs], ...]]
    chunk:  key group | state id | len(key) | key | seq (uint64, big-endian)
            -> record batches of a session's rows as an Arrow IPC stream

with the key encoded as the disk backend encodes keys and the header serialized as
the backend serializes state values (MessagePack, pickle only for opaque objects).
An ``AggregateFunction``'s or ``reduce``'s accumulator is small and stays in the
header (``0``); a ``ProcessWindowFunction``'s (its session's record batches) is a
list of chunks, named by ``runs``: ``[first seq, count, ...]``, runs of consecutive
seqs in the order of the session's rows (``1``). A key's seqs count up from 0 while
it has a header, never reused: one open session fed by many batches has one run.

A batch (or a firing of timers) loads its distinct keys' headers with one
multi-get into the operator's ``entries`` and ``sessions`` dicts, which are empty
otherwise, runs the heap path's own session merging (or firing) over just those
keys, then writes back those whose header changed with one write batch (a key left
without sessions is deleted; one whose rows in the batch were all late is loaded to
judge them by, and left as stored) and empties the dicts: no key id outlives the
call. A session's stored rows are loaded as a :class:`StoredRows`, which the heap
path's merge (``a + b`` of row tuples) extends without reading them; writing back
puts the rows a batch added as one new chunk per session (one per schema, should it
change within one), so a batch never reads or rewrites rows stored before and a key
with many rows in one open session pays per batch for that batch's rows and a header
of a few dozen bytes. A firing reads the chunks of all the sessions it fires with
one multi-get (:meth:`DiskGenericSessions.read_ahead`; the timers' pop bounds them)
and hands each session its own as it iterates its rows; the chunks of the sessions a
firing or cleanup dropped are deleted in the write batch. Python runs per distinct
key, session and chunk, as the heap path runs per session. Timers
stay on the timer service, one per session as on the heap. The entries share the
backend's key-group prefix, so its full and incremental snapshots, restores and
rescaling carry them like any keyed state. An older checkpoint's keys (one entry of
a state of its own, ``[[start, end, accumulator], ...]`` with the rows inline)
become headers and chunks when the state is restored; a checkpoint written since
names the chunks' state, so restoring it looks for no such entries.

    >>> import pyarrow as pa
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

A ``ProcessWindowFunction``'s rows: each batch appends a chunk, the stored ones
unread until the session fires::

    >>> pwf = DiskGenericSessions(backend, timers, rows=True)
    >>> rows = [tuple(pa.table({"x": x}).to_batches()) for x in ([1, 2], [3])]
    >>> kid = int(kids[1])
    >>> with pwf.loaded(kids[1:], entries, sessions):
    ...     entries[(kid, 0)] = [10, rows[0]]
    ...     sessions[kid] = [0]
    >>> with pwf.loaded(kids[1:], entries, sessions):
    ...     entries[(kid, 0)][1] = entries[(kid, 0)][1] + rows[1]  # the heap path's merge
    >>> pwf.chunks_of(kids[1:])
    [2]
    >>> with pwf.loaded(kids[1:], entries, sessions):
    ...     pa.Table.from_batches(list(entries[(kid, 0)][1]))["x"].to_pylist()
    ...     del entries[(kid, 0)], sessions[kid]  # fired and cleared
    [1, 2, 3]
    >>> pwf.chunks_of(kids)
    [0, 0]
    >>> backend.close()
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from raystream.checkpoint.disk_layout import KEYED_PREFIX, pack_value, unpack_value
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.windows.disk_entries import chunk_key, ipc_batches, ipc_bytes, is_header
from raystream.timers.disk_service import DiskTimerService

# A checkpoint written before chunks holds each key as one entry of this state; its kind
# begins the chunks' too, so a heap job refuses both (the operator's disk-only kinds).
STATE_NAME = "__generic_sessions"
KIND = "generic-session-windows"
CHUNKS_NAME = "__generic_session_chunks"
CHUNKS_KIND = "generic-session-windows-chunks"
_INLINE, _CHUNKED = 0, 1  # how a session's accumulator is stored in the header

Entries = dict[tuple[int, int], list[Any]]  # (key id, start) -> [end, accumulator]
Sessions = dict[int, list[int]]  # key id -> starts of its open sessions


@dataclass(frozen=True)
class Head:
    """What a key's header says beyond its sessions, kept from its load to its store: the
    seq its next chunk gets, the runs of chunks its sessions named when loaded (those
    no session names at the store are deleted then) and the header as read (None: none),
    which a key whose sessions the call left as they were is not written over with."""

    next_seq: int = 0
    named: tuple[range, ...] = ()
    raw: bytes | None = None


class Chunks:
    """The chunks of one load's sessions read so far and not yet handed out (stored key ->
    value): a firing's sessions are read together (:meth:`DiskGenericSessions.read_ahead`),
    then each takes its own."""

    __slots__ = ("_db", "_read")

    def __init__(self, db: Any) -> None:
        self._db = db
        self._read: dict[bytes, bytes] = {}

    def read(self, wanted: list[bytes]) -> None:
        """Read the chunks ``wanted`` not read yet: one multi-get."""
        missing = [key for key in wanted if key not in self._read]
        if missing:
            self._read.update(zip(missing, self._db[missing]))  # a list of keys: a multi-get

    def take(self, wanted: list[bytes]) -> list[bytes]:
        """The chunks ``wanted`` (read now unless read ahead), no longer held here."""
        self.read(wanted)
        return [self._read.pop(key) for key in wanted]


class StoredRows:
    """A ``ProcessWindowFunction`` session's rows while its key is loaded: runs of its
    stored chunks (``range`` of seqs, not read) and the record batches added since, in
    order. ``+`` with a tuple of record batches (or another one) is the heap path's
    merge; iterating takes the chunks from its load's :class:`Chunks` (read there with
    one multi-get, unless read ahead with other sessions') and yields every batch."""

    __slots__ = ("chunks", "_key", "parts")

    def __init__(self, chunks: Chunks, key: bytes,
                 parts: tuple[range | pa.RecordBatch, ...]) -> None:
        self.chunks, self._key, self.parts = chunks, key, parts

    def __add__(self, other: Any) -> StoredRows:
        parts = other.parts if isinstance(other, StoredRows) else tuple(other)
        return StoredRows(self.chunks, self._key, self.parts + parts)

    def __radd__(self, other: Any) -> StoredRows:
        return StoredRows(self.chunks, self._key, tuple(other) + self.parts)

    def wanted(self) -> list[bytes]:
        """The stored keys of its chunks, in order."""
        return [chunk_key(self._key, seq) for part in self.parts if isinstance(part, range)
                for seq in part]

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        wanted = self.wanted()
        raws = iter(self.chunks.take(wanted) if wanted else [])
        for part in self.parts:
            if not isinstance(part, range):
                yield part
                continue
            for _ in part:
                yield from ipc_batches(next(raws))


class DiskGenericSessions:
    """The open sessions of user window functions of one window operator instance, in
    its disk backend."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService, *,
                 rows: bool = False) -> None:
        self._backend = backend
        self._timers = timers
        # a ProcessWindowFunction's accumulators are its sessions' rows (chunks); any other
        # function's are its own values, whatever their type (the header holds them)
        self._rows = rows
        # Only a checkpoint written before chunks holds keys as single entries: one
        # written since names the chunks' state too (declared below, before any move),
        # so its restores skip the scan for entries the first restore moved.
        older = (backend.state_kind(STATE_NAME) == KIND
                 and backend.state_kind(CHUNKS_NAME) is None)
        self._sid = backend.raw_state_id(CHUNKS_NAME, CHUNKS_KIND)
        if older:
            self._move_in_entries()

    def entry_keys(self, kids: np.ndarray) -> list[bytes]:
        """The stored keys (headers) of key ids ``kids`` (one encoding per key)."""
        timers = self._timers
        return self._backend.entry_keys(self._sid, timers.keys(kids), timers.key_groups_of(kids))

    def chunks_of(self, kids: np.ndarray) -> list[int]:
        """How many chunks the sessions of each of the key ids ``kids`` name (0: none)."""
        out = []
        for raw in self._backend.raw_db[self.entry_keys(kids)]:  # a list: a multi-get
            stored = [] if raw is None else unpack_value(raw)[1]
            out.append(sum(sum(runs[1::2]) for _, _, how, runs in stored if how == _CHUNKED))
        return out

    @contextmanager
    def loaded(self, kids: np.ndarray, entries: Entries, sessions: Sessions) -> Iterator[None]:
        """The sessions of the distinct key ids ``kids`` in ``entries`` and ``sessions``
        (both empty before) for the body, written back after it (one multi-get, one write
        batch); both are emptied again, also when the body fails (then nothing is
        written: the job restores from its last checkpoint)."""
        keys = self.entry_keys(kids)
        try:
            heads = self._load(kids, keys, entries, sessions)
            yield
            self._store(kids, keys, heads, entries, sessions)
        finally:
            entries.clear()
            sessions.clear()

    def _load(self, kids: np.ndarray, keys: list[bytes], entries: Entries,
              sessions: Sessions) -> list[Head]:
        """Per key: its :class:`Head`; its sessions into ``entries`` and ``sessions``."""
        if not keys:
            return []
        db = self._backend.raw_db
        chunks = Chunks(db)  # the sessions' chunks, read when they fire
        heads = []
        for kid, key, raw in zip(kids.tolist(), keys, db[keys]):  # a list of keys: a multi-get
            if raw is None:
                heads.append(Head())
                continue
            next_seq, stored = unpack_value(raw)
            sessions[kid] = [start for start, _, _, _ in stored]
            named: list[range] = []
            for start, end, how, acc in stored:
                if how == _CHUNKED:
                    runs = tuple(range(first, first + n) for first, n in zip(acc[::2], acc[1::2]))
                    named.extend(runs)
                    acc = StoredRows(chunks, key, runs)
                entries[(kid, start)] = [end, acc]
            heads.append(Head(next_seq, tuple(named), raw))
        return heads

    def _store(self, kids: np.ndarray, keys: list[bytes], heads: list[Head],
               entries: Entries, sessions: Sessions) -> None:
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for kid, key, head in zip(kids.tolist(), keys, heads):
            next_seq, stored = head.next_seq, []
            for start in sorted(sessions.get(kid, ())):
                end, acc = entries[(kid, start)]
                if not self._rows:
                    stored.append([start, end, _INLINE, acc])
                    continue
                parts = acc.parts if isinstance(acc, StoredRows) else acc
                runs, next_seq = _put_chunks(batch, key, parts, next_seq)
                stored.append([start, end, _CHUNKED, runs])
            _delete_dropped(batch, key, head.named, stored)
            # a key the call left as it was (its rows in the batch all late, or a timer
            # of a session that grew since) keeps its header: packed as read, it is not
            # written (compared as bytes: a function may change an accumulator in place)
            if not stored:
                if head.raw is not None:
                    batch.delete(key)
                continue
            packed = pack_value([next_seq, stored])
            if packed != head.raw:
                batch.put(key, packed)
        self._backend.raw_db.write(batch)

    def read_ahead(self, accumulators: Sequence[Any]) -> None:
        """Read the stored chunks of the sessions among ``accumulators`` (those about to
        fire, a firing's: bounded by its pop of timers) with one multi-get, so that each
        then takes its own rows instead of reading them itself."""
        by_load: dict[int, tuple[Chunks, list[bytes]]] = {}
        for acc in accumulators:
            if isinstance(acc, StoredRows):
                by_load.setdefault(id(acc.chunks), (acc.chunks, []))[1].extend(acc.wanted())
        for chunks, wanted in by_load.values():
            chunks.read(wanted)

    def export(self) -> Iterator[tuple[int, list[tuple[Any, int, int, Any]]]]:
        """Each key group's open sessions as ``(key, start, end, accumulator)``, a
        ``ProcessWindowFunction``'s rows read from their chunks: one range scan per key
        group (a disk savepoint restored into a heap job, from a scratch database)."""
        decode = DiskKeyedStateBackend.decode_key
        for group, entries in self._backend.raw_state_entries(CHUNKS_NAME, CHUNKS_KIND):
            chunks = dict(entries)  # the group's headers and chunks, read once
            out = []
            for key, raw in entries:
                if not is_header(key):
                    continue  # a chunk, read through its header's runs
                for start, end, how, acc in unpack_value(raw)[1]:
                    if how == _CHUNKED:
                        acc = tuple(batch for first, n in zip(acc[::2], acc[1::2])
                                    for seq in range(first, first + n)
                                    for batch in ipc_batches(chunks[chunk_key(key, seq)]))
                    out.append((decode(key[KEYED_PREFIX.size:]), start, end, acc))
            yield group, out

    def move_in(self, entries: Entries, sessions: Sessions) -> None:
        """A heap checkpoint's sessions (restored into ``entries`` and ``sessions``) into
        RocksDB, emptying both."""
        kids = np.fromiter(sessions, dtype=np.int64, count=len(sessions))
        keys = self.entry_keys(kids)
        try:
            self._store(kids, keys, [Head()] * len(keys), entries, sessions)
        finally:
            entries.clear()
            sessions.clear()

    def _move_in_entries(self) -> None:
        """An older checkpoint's keys, one entry each holding ``[[start, end,
        accumulator], ...]`` with the rows inline: headers and chunks now."""
        import rocksdict

        backend = self._backend
        for _, found in backend.raw_state_entries(STATE_NAME, KIND):
            batch = rocksdict.WriteBatch(raw_mode=True)
            for old_key, raw in found:
                key = old_key[:2] + self._sid + old_key[4:]
                stored, next_seq = [], 0
                for start, end, acc in unpack_value(raw):
                    if self._rows:
                        runs, next_seq = _put_chunks(batch, key, acc, next_seq)
                        stored.append([start, end, _CHUNKED, runs])
                    else:
                        stored.append([start, end, _INLINE, acc])
                batch.put(key, pack_value([next_seq, stored]))
                batch.delete(old_key)
            backend.raw_db.write(batch)


def _put_chunks(batch: Any, key: bytes, parts: Sequence[range | pa.RecordBatch],
                next_seq: int) -> tuple[list[int], int]:
    """Put the record batches among a session's ``parts`` as new chunks (one per run of
    batches of one schema) into write batch ``batch``: the session's runs of seqs
    (``[first, count, ...]``, adjacent ones joined) and the next seq."""
    runs: list[int] = []
    pending: list[pa.RecordBatch] = []

    def named(seqs: range) -> None:
        if runs and runs[-2] + runs[-1] == seqs.start:
            runs[-1] += len(seqs)
        else:
            runs.extend((seqs.start, len(seqs)))

    def flush() -> None:
        nonlocal next_seq
        if pending:
            batch.put(chunk_key(key, next_seq), ipc_bytes(pending))
            named(range(next_seq, next_seq + 1))
            next_seq += 1
            pending.clear()

    for part in parts:
        if isinstance(part, range):
            flush()
            named(part)
            continue
        if pending and not part.schema.equals(pending[0].schema):
            flush()
        pending.append(part)
    flush()
    return runs, next_seq


def _delete_dropped(batch: Any, key: bytes, named: tuple[range, ...], stored: list[list]) -> None:
    """Delete the chunks the loaded sessions named (``named``) that the ones ``stored``
    no longer do: those of sessions fired and cleared. A loaded run is never split (a
    session keeps or drops its rows whole), so it is found within one stored run or in
    none."""
    runs = sorted((first, first + n) for _, _, how, acc in stored if how == _CHUNKED
                  for first, n in zip(acc[::2], acc[1::2]))
    firsts = [first for first, _ in runs]
    for seqs in named:
        at = bisect.bisect_right(firsts, seqs.start) - 1
        if at < 0 or runs[at][1] < seqs.stop:
            for seq in seqs:
                batch.delete(chunk_key(key, seq))
