"""Join rows in the disk state backend (state larger than memory).

On the disk backend an interval join (:class:`DiskJoinRows`) and a window join over
tumbling or sliding windows (:class:`DiskWindowRows`) keep each side's buffered rows
in their instance's RocksDB (the backend's
:meth:`~raystream.checkpoint.disk_state.DiskKeyedStateBackend.raw_db`), in a layout
of their own under one state id per side::

    key group (u16) | state id (u16) | bucket + 2**63 (u64) | key | seq (u64)

all big-endian, so byte order is numeric order. The bucket is ``ts // bucket_ms``
(interval join) or the window start (window join); the key is the backend's
canonical encoding (MessagePack, self-delimiting, so one key's bytes are never a
prefix of another's); ``seq`` tells apart the batches (and, after a rescale, the
instances) that wrote rows of one key to one bucket. Like Flink's
``MapState<Long, List<BufferEntry>>`` per key and side, but ordered bucket before
key, so that cleanup is a range deletion per key group.

A value is an 8-byte format fingerprint, then the rows of one key in one bucket from
one batch: fixed-width numpy records when every column is a number or a boolean
without nulls (no Arrow call per entry), otherwise an Arrow IPC record batch
message. Formats are entries of their own, ``key group | state id | fingerprint`` ->
kind byte and Arrow IPC schema, written once per key group so they move with it.
Nothing is pickled. A batch is written with one write batch.

Interval join:

* A batch probes the other side with one iterator: one seek per (key group, bucket)
  its keys' rows can match (``[min ts + lower, max ts + upper]`` per key, within the
  buckets the key group holds), then a merge of the batch's keys of that key group
  (in byte order) with the stored entries, stepping over other keys' entries with
  ``next`` and seeking past runs of them: only the batch's keys' rows in the buckets
  that can match are read. They are matched exactly by the heap path's sorted index.
* A watermark deletes, per key group holding expired buckets, everything below the
  first bucket an on-time row can still join: one ``delete_range`` per key group and
  side (rows of the straddling bucket stay until the next bucket passes: they can no
  longer match, so the output is the heap path's).
* ``bucket_ms`` is the interval's width, at least ``MIN_BUCKET_MS``: a key's probe
  reads about two buckets, and cleanup keeps at most one bucket more than needed.
  The state's kind (``"interval-join-rows {"bucket_ms": ...}"``) keeps it, so a
  restore with other bounds reads the rows right.

Window join: a window fires with one range scan per key group and side holding it,
then one range deletion each.

Entries start with their key group, so the backend's full and incremental
snapshots, restores and rescaling carry them as they are; a heap job restoring them
reads them back with ``export`` (one range scan per key group and side) from a scratch
database (their state kinds are the join operators' ``disk_only_kinds``).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from raystream.checkpoint.disk_layout import (ORDERED, SEQUENCE, SIGN, STATE_ID, group_bound,
                                             state_id_of, state_prefix)
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.engine.operators.interval_index import SortedRows
from raystream.engine.operators.keyed_rows import JoinSide, KeyedRows, concat_tables
from raystream.timers.disk_service import DiskTimerService

STATE_NAMES = ("__interval_join_left", "__interval_join_right")
KIND = "interval-join-rows"
WINDOW_STATE_NAMES = ("__window_join_left", "__window_join_right")
WINDOW_KIND = "window-join-rows"
SCHEMAS, SCHEMA_KIND = "__join_row_formats", "join-row-formats"
_FP = 8  # bytes of a format's fingerprint
MIN_BUCKET_MS = 1000
_I64 = np.iinfo(np.int64)
_EMPTY_LOW, _EMPTY_HIGH = int(_I64.max), int(_I64.min)


def _kind_of(bucket_ms: int) -> str:
    return f"{KIND} {json.dumps({'bucket_ms': bucket_ms})}"


def _clip(value: int) -> int:
    return min(max(value, int(_I64.min)), int(_I64.max))


class RowFormat:
    """How the rows of one schema are stored: Arrow IPC record batch messages, or (all
    columns fixed-width numbers or booleans, no nulls) fixed-width numpy records, which
    cost no Arrow call per entry."""

    def __init__(self, schema: pa.Schema, fixed: bool) -> None:
        self.schema = schema
        self.record = (np.dtype([(f"f{i}", np.dtype(field.type.to_pandas_dtype()).newbyteorder("<"))
                                 for i, field in enumerate(schema)]) if fixed else None)

    @staticmethod
    def fits(batch: pa.RecordBatch) -> bool:
        return all((pa.types.is_integer(c.type) or pa.types.is_floating(c.type)
                    or pa.types.is_boolean(c.type)) and not c.null_count for c in batch.columns)

    def payloads(self, batch: pa.RecordBatch, starts: list[int], ends: list[int]) -> list[bytes]:
        """The stored bytes of rows ``start:end`` of ``batch`` for each pair."""
        record = self.record
        if record is None:
            return [batch.slice(s, e - s).serialize().to_pybytes() for s, e in zip(starts, ends)]
        rows = np.empty(batch.num_rows, dtype=record)
        for name, column in zip(record.names or (), batch.columns):
            rows[name] = column.to_numpy(zero_copy_only=False)
        data, width = rows.tobytes(), record.itemsize
        return [data[s * width:e * width] for s, e in zip(starts, ends)]

    def table(self, payloads: list[bytes]) -> tuple[pa.Table, np.ndarray]:
        """The rows of ``payloads`` as one table, and each payload's number of rows."""
        record, schema = self.record, self.schema
        if record is None:
            batches = [pa.ipc.read_record_batch(pa.py_buffer(p), schema) for p in payloads]
            return (pa.Table.from_batches(batches, schema),
                    np.fromiter((b.num_rows for b in batches), np.int64, len(batches)))
        rows = np.frombuffer(b"".join(payloads), dtype=record)
        sizes = np.fromiter((len(p) for p in payloads), np.int64, len(payloads)) // record.itemsize
        return pa.Table.from_arrays([pa.array(np.ascontiguousarray(rows[name]), type=field.type)
                                     for name, field in zip(record.names or (), schema)],
                                    schema=schema), sizes


class RowFormats:
    """The formats of the stored rows by fingerprint (8 bytes, each value's first), kept
    as entries ``key group | state id | fingerprint`` -> kind byte and Arrow IPC schema,
    once per key group (so they move with it)."""

    def __init__(self, backend: DiskKeyedStateBackend) -> None:
        self._backend = backend
        self._sid = backend.raw_state_id(SCHEMAS, SCHEMA_KIND)
        self._formats: dict[bytes, RowFormat] = {}
        self._fps: dict[bytes, bytes] = {}  # stored description -> fingerprint
        self._written: dict[bytes, np.ndarray] = {}  # fingerprint -> key groups holding it

    def of(self, batch: pa.RecordBatch, groups: np.ndarray, writes) -> tuple[bytes, RowFormat]:
        """``batch``'s format and its fingerprint; puts it into ``writes`` for the key
        groups (from the backend's first) that do not hold it yet."""
        fixed = RowFormat.fits(batch)
        # without metadata (pandas' may differ batch by batch): joins emit none of it
        schema = batch.schema.remove_metadata()
        data = (b"N" if fixed else b"A") + schema.serialize().to_pybytes()
        fp = self._fps.get(data)
        if fp is None:
            fp = self._fps[data] = hashlib.blake2b(data, digest_size=_FP).digest()
            self._formats[fp] = RowFormat(schema, fixed)
            self._written[fp] = np.zeros(len(self._backend.key_groups), dtype=bool)
        written = self._written[fp]
        new = np.unique(groups[~written[groups]])
        first = self._backend.key_groups.start
        for at in new.tolist():
            writes.put(group_bound(first + at) + self._sid + fp, data)
        written[new] = True
        return fp, self._formats[fp]

    def get(self, fp: bytes, group: int) -> RowFormat:
        found = self._formats.get(fp)
        if found is None:  # restored: written by another instance
            raw = self._backend.raw_db.get(group_bound(group) + self._sid + fp)
            if raw is None:
                raise RuntimeError(f"join rows of key group {group} without their format "
                                   f"{fp.hex()}")
            found = self._formats[fp] = RowFormat(pa.ipc.read_schema(pa.py_buffer(raw[1:])),
                                                raw[:1] == b"N")
        return found


class _DiskRows:
    """Both sides' rows of one join instance in its disk backend, under state ids
    ``names`` (left, right) of ``kind``: writes one entry per (key, bucket) of a batch."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService,
                 names: tuple[str, str], kind: str) -> None:
        self._backend = backend
        self._timers = timers
        self._tag = int.from_bytes(os.urandom(4), "big") << 32  # this instance's seqs
        self._seq = 0
        self._sids = tuple(state_id_of(backend.raw_state_id(name, kind))
                           for name in names)
        self._formats = RowFormats(backend)
        self._first = backend.key_groups.start

    def _iter(self) -> tuple[Any, Any]:
        """An iterator bounded to the backend's key groups, and its read options (keep
        them referenced while it is used)."""
        backend = self._backend
        read_options = backend.read_options(group_bound(backend.key_groups.stop))
        return backend.raw_db.iter(read_options), read_options

    # -- write and read -------------------------------------------------------------------
    def _write(self, side: JoinSide, rows: KeyedRows, buckets: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Write ``rows`` of ``side`` in their ``buckets``: one entry per (key, bucket),
        one write batch. Returns the (key group - first, bucket) of the entries."""
        import rocksdict

        groups = self._timers.key_groups_of(rows.kid)
        order = np.lexsort((rows.kid, buckets, groups))
        kid, bucket, group = rows.kid[order], buckets[order], groups[order]
        new = np.flatnonzero((kid[1:] != kid[:-1]) | (bucket[1:] != bucket[:-1])) + 1
        starts = np.concatenate([[0], new])
        ends = np.append(starts[1:], len(order))
        table = rows.table.take(pa.array(order, pa.int64())).combine_chunks().to_batches()[0]
        seq = SEQUENCE.pack(self._tag | self._seq)
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        if not self._seq:  # 2**32 batches: a fresh tag keeps seqs unique
            self._tag = int.from_bytes(os.urandom(4), "big") << 32
        sid, pack = self._sids[side], ORDERED.pack
        writes = rocksdict.WriteBatch(raw_mode=True)
        at = group[starts] - self._first
        fp, fmt = self._formats.of(table, at, writes)
        put = writes.put
        for g, b, code, payload in zip(group[starts].tolist(), bucket[starts].tolist(),
                                       self._timers.codes(kid[starts]),
                                       fmt.payloads(table, starts.tolist(), ends.tolist())):
            put(pack(g, sid, b + SIGN) + code + seq, fp + payload)
        self._backend.raw_db.write(writes)
        return at, bucket[starts]

    def _tables(self, found: dict[bytes, tuple[list[bytes], list[int], int]]
                ) -> tuple[pa.Table, np.ndarray]:
        """The rows of the entries read (per format: payloads, an int per entry, a key
        group holding the format) as one table, and each row's entry's int."""
        tables, stored_kids = [], []
        for fp, (payloads, kid_of, group) in found.items():
            table, sizes = self._formats.get(fp, group).table(payloads)
            tables.append(table)
            stored_kids.append(np.repeat(np.array(kid_of, dtype=np.int64), sizes))
        table = concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]
        return table, np.concatenate(stored_kids)

    def _side_rows(self, side: JoinSide) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """Each key group's rows of ``side`` with each row's bucket: one range scan per
        key group (a disk savepoint read back for a heap job)."""
        backend, sid = self._backend, self._sids[side]
        for group in backend.key_groups:
            read_options = backend.read_options(state_prefix(group, sid + 1))
            found: dict[bytes, tuple[list[bytes], list[int], int]] = {}
            buckets: list[int] = []
            for key, value in backend.raw_db.items(from_key=state_prefix(group, sid),
                                                   read_opt=read_options):
                entry = found.setdefault(value[:_FP], ([], [], group))
                entry[0].append(value[_FP:])
                entry[1].append(len(buckets))
                buckets.append(ORDERED.unpack_from(key)[2] - SIGN)
            if found:
                table, entry_of_row = self._tables(found)
                yield table, np.asarray(buckets, np.int64)[entry_of_row]

    def stored_entries(self) -> int:
        """How many entries both sides hold (tests; a full scan)."""
        backend = self._backend
        read_options = backend.read_options(group_bound(backend.key_groups.stop))
        sids = {STATE_ID.pack(s) for s in self._sids}
        return sum(1 for k in backend.raw_db.keys(from_key=group_bound(
            backend.key_groups.start), read_opt=read_options) if k[2:4] in sids)


class DiskJoinRows(_DiskRows):
    """Both sides' buffered rows of one interval join instance, in its disk backend.

    ``timestamps(side, table)``: the int64 ms times of rows of ``side`` read back."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService,
                 timestamps: Callable[[JoinSide, pa.Table], np.ndarray], *,
                 bucket_ms: int) -> None:
        kinds = {k for k in (backend.state_kind(name) for name in STATE_NAMES) if k is not None}
        if len(kinds) > 1:
            raise ValueError(f"interval join rows restored with different kinds {kinds}")
        restored = bool(kinds)
        kind = kinds.pop() if restored else _kind_of(bucket_ms)
        super().__init__(backend, timers, STATE_NAMES, kind)
        self._timestamps = timestamps
        self.bucket_ms = int(json.loads(kind[len(KIND) + 1:])["bucket_ms"])
        groups = backend.key_groups
        # per side and key group (from the first one), the lowest and highest bucket held
        self._low = [np.full(len(groups), _EMPTY_LOW, np.int64) for _ in JoinSide]
        self._high = [np.full(len(groups), _EMPTY_HIGH, np.int64) for _ in JoinSide]
        if restored:
            self._find_buckets()

    def export(self) -> Iterator[tuple[JoinSide, pa.Table, np.ndarray]]:
        """Both sides' rows with their times, key group by key group (a disk savepoint
        restored into a heap job)."""
        for side in JoinSide:
            for table, _ in self._side_rows(side):
                yield side, table, self._timestamps(side, table)

    def _find_buckets(self) -> None:
        """After a restore: each key group's lowest and highest bucket per side (two
        seeks each)."""
        it, _read = self._iter()
        for side in JoinSide:
            sid = self._sids[side]
            for group in self._backend.key_groups:
                head = state_prefix(group, sid)
                it.seek(head)
                if not it.valid() or it.key()[:4] != head:
                    continue
                at = group - self._first
                self._low[side][at] = ORDERED.unpack_from(it.key())[2] - SIGN
                it.seek_for_prev(state_prefix(group, sid + 1))
                self._high[side][at] = ORDERED.unpack_from(it.key())[2] - SIGN
        del it

    def append(self, side: JoinSide, rows: KeyedRows) -> None:
        """Write ``rows`` of ``side``: one entry per (key, bucket), one write batch."""
        at, buckets = self._write(side, rows, np.floor_divide(rows.ts, self.bucket_ms))
        np.minimum.at(self._low[side], at, buckets)  # widen each key group's bucket range
        np.maximum.at(self._high[side], at, buckets)

    def matches(self, side: JoinSide, kid: np.ndarray, ts: np.ndarray,
                offsets: tuple[int, int]) -> tuple[np.ndarray, KeyedRows | None]:
        """Like the heap buffer's ``matches``: pairs of a probe row and a stored row of
        ``side`` with equal key ids and ``ts + offsets[0] <= stored ts <= ts + offsets[1]``:
        the probe rows' positions and the stored rows they pair with (None: no pair)."""
        empty = np.empty(0, np.int64), None
        order = np.argsort(kid, kind="stable")
        kids, first = np.unique(kid[order], return_index=True)
        low_ts = np.minimum.reduceat(ts[order], first) + offsets[0]
        high_ts = np.maximum.reduceat(ts[order], first) + offsets[1]
        at = self._timers.key_groups_of(kids) - self._first
        low = np.maximum(np.floor_divide(low_ts, self.bucket_ms), self._low[side][at])
        high = np.minimum(np.floor_divide(high_ts, self.bucket_ms), self._high[side][at])
        asked = np.flatnonzero(low <= high)
        if not len(asked):
            return empty
        codes = self._timers.codes(kids[asked])
        # per (key group, bucket), the asked keys in byte order (RocksDB's): one scan each
        asked_kg = at[asked] + self._first
        spans = (high - low)[asked] + 1
        pair_kg = np.repeat(asked_kg, spans)
        pair_key = np.repeat(np.arange(len(asked)), spans)
        pair_bucket = (np.repeat(low[asked], spans) + np.arange(int(spans.sum()))
                       - np.repeat(np.cumsum(spans) - spans, spans))
        rank = np.empty(len(asked), np.int64)
        rank[sorted(range(len(asked)), key=codes.__getitem__)] = np.arange(len(asked))
        pair_order = np.lexsort((rank[pair_key], pair_bucket, pair_kg))
        found: dict[bytes, tuple[list[bytes], list[int], int]] = {}  # fp: payloads, key ids
        it, _read = self._iter()
        self._scan(it, side, pair_kg[pair_order], pair_bucket[pair_order],
                   pair_key[pair_order], codes, kids[asked].tolist(), found)
        del it
        if not found:
            return empty
        table, stored_kids = self._tables(found)
        stored = KeyedRows(table, self._timestamps(side, table), stored_kids)
        probe, taken = SortedRows.of(stored).matches(kid, ts, offsets)
        if not len(probe):
            return empty
        return probe, stored.take(taken)

    def _scan(self, it, side: JoinSide, kgs: np.ndarray, buckets: np.ndarray,
              keys: np.ndarray, codes: list[bytes], kids: list[int],
              found: dict[bytes, tuple[list[bytes], list[int], int]]) -> None:
        """Read the entries of (key group, bucket, key) triples, sorted as stored: a
        merge of each (key group, bucket)'s asked keys with its entries, stepping over
        an unasked key's entries with ``next`` and seeking past longer runs of them."""
        sid, pack, size, seq_size = self._sids[side], ORDERED.pack, ORDERED.size, SEQUENCE.size
        head, skipped = b"", 0
        for g, b, k in zip(kgs.tolist(), buckets.tolist(), keys.tolist()):
            want = codes[k]
            new_head = pack(g, sid, b + SIGN)
            if new_head != head:  # a new (key group, bucket): seek
                head = new_head
                it.seek(head + want)
            skipped = 0
            while it.valid():
                key = it.key()
                if key[:size] != head:
                    break
                rest = key[size:]
                if rest[:-seq_size] == want:
                    value = it.value()
                    fp = value[:_FP]
                    entry = found.get(fp)
                    if entry is None:
                        entry = found[fp] = ([], [], g)
                    entry[0].append(value[_FP:])
                    entry[1].append(kids[k])
                elif rest > want:  # past the asked key
                    break
                else:
                    skipped += 1
                    if skipped > 4:  # a long run of unasked keys: seek instead
                        it.seek(head + want)
                        skipped = 0
                        continue
                it.next()

    def drop_before(self, side: JoinSide, ts: int) -> None:
        """Delete the buckets wholly below ``ts`` of ``side``: one range deletion per key
        group holding any."""
        limit = _clip(ts) // self.bucket_ms
        low, high = self._low[side], self._high[side]
        expired = np.flatnonzero(low < limit)
        if not len(expired):
            return
        db, sid, pack = self._backend.raw_db, self._sids[side], ORDERED.pack
        for at, lo, hi in zip(expired.tolist(), low[expired].tolist(), high[expired].tolist()):
            end = min(limit, hi + 1)
            db.delete_range(pack(at + self._first, sid, lo + SIGN),
                            pack(at + self._first, sid, end + SIGN))
        gone = expired[high[expired] < limit]
        low[expired] = limit
        low[gone], high[gone] = _EMPTY_LOW, _EMPTY_HIGH


class DiskWindowRows(_DiskRows):
    """Both sides' buffered rows of one window join instance (tumbling or sliding
    windows), in its disk backend: the bucket of an entry is its window's start."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: DiskTimerService) -> None:
        restored = any(backend.state_kind(name) is not None for name in WINDOW_STATE_NAMES)
        super().__init__(backend, timers, WINDOW_STATE_NAMES, WINDOW_KIND)
        # window start -> the key groups (from the first one) holding rows of it
        self.windows: dict[int, np.ndarray] = {}
        if restored:
            self._find_windows()

    def export(self) -> Iterator[tuple[JoinSide, pa.Table, np.ndarray]]:
        """Both sides' rows with their windows' starts, key group by key group (a disk
        savepoint restored into a heap job)."""
        for side in JoinSide:
            for table, starts in self._side_rows(side):
                yield side, table, starts

    def _held(self, start: int) -> np.ndarray:
        held = self.windows.get(start)
        if held is None:
            held = self.windows[start] = np.zeros(len(self._backend.key_groups), dtype=bool)
        return held

    def _find_windows(self) -> None:
        """After a restore: the windows each key group holds, one seek per window."""
        it, _read = self._iter()
        for side in JoinSide:
            sid = self._sids[side]
            for group in self._backend.key_groups:
                head = state_prefix(group, sid)
                it.seek(head)
                while it.valid():
                    key = it.key()
                    if key[:4] != head:
                        break
                    bucket = ORDERED.unpack_from(key)[2]
                    self._held(bucket - SIGN)[group - self._first] = True
                    if bucket == 2 * SIGN - 1:  # the largest int64
                        break
                    it.seek(ORDERED.pack(group, sid, bucket + 1))
        del it

    def append(self, side: JoinSide, rows: KeyedRows) -> None:
        """Write ``rows`` of ``side`` (``rows.ts``: their window starts)."""
        at, starts = self._write(side, rows, rows.ts)
        for start in np.unique(starts).tolist():
            self._held(start)[at[starts == start]] = True

    def take(self, starts: list[int]) -> tuple[KeyedRows | None, KeyedRows | None]:
        """Read and delete the rows of windows ``starts``, per side (``ts``: the window
        start): one range scan and one range deletion per key group, window and side."""
        taken: list[KeyedRows | None] = []
        size = ORDERED.size
        for side in JoinSide:
            sid, pack = self._sids[side], ORDERED.pack
            found: dict[bytes, tuple[list[bytes], list[int], int]] = {}
            codes: list[bytes] = []
            groups: list[int] = []
            entry_starts: list[int] = []
            it, _read = self._iter()
            for start in starts:
                for at in np.flatnonzero(self.windows.get(start, ())).tolist():
                    group = at + self._first
                    head = pack(group, sid, start + SIGN)
                    it.seek(head)
                    while it.valid():
                        key = it.key()
                        if key[:size] != head:
                            break
                        value = it.value()
                        fp = value[:_FP]
                        entry = found.get(fp)
                        if entry is None:
                            entry = found[fp] = ([], [], group)
                        entry[0].append(value[_FP:])
                        entry[1].append(len(codes))
                        codes.append(key[size:-SEQUENCE.size])
                        groups.append(group)
                        entry_starts.append(start)
                        it.next()
            del it
            if not found:
                taken.append(None)
                continue
            table, entry = self._tables(found)
            kids = self._timers.key_ids_of_codes(codes, np.asarray(groups, np.int64))
            taken.append(KeyedRows(table, np.array(entry_starts, np.int64)[entry], kids[entry]))
        db = self._backend.raw_db
        for start in starts:
            held = self.windows.pop(start, None)
            if held is None:
                continue
            for at in np.flatnonzero(held).tolist():
                for sid in self._sids:
                    db.delete_range(ORDERED.pack(at + self._first, sid, start + SIGN),
                                    ORDERED.pack(at + self._first, sid, start + SIGN + 1))
        return taken[0], taken[1]
