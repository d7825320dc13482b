"""The interval join's buffered rows in the disk state backend (state larger than memory).

On the disk backend an :class:`~raystream.engine.operators.interval_join.IntervalJoinOperator`
keeps each side's rows in its instance's RocksDB (the backend's
:meth:`~raystream.checkpoint.disk_state.DiskKeyedStateBackend.raw_db`), in a layout of
its own under one state id per side::

    key group (u16) | state id (u16) | time bucket + 2**63 (u64) | key | seq (u64)

all big-endian, so byte order is numeric order. A bucket is ``ts // bucket_ms``; the
key is the backend's canonical encoding (MessagePack, self-delimiting, so one key's
bytes are never a prefix of another's); ``seq`` tells apart the batches (and, after
a rescale, the instances) that wrote rows of one key to one bucket. The value is the
Arrow IPC stream of those rows: one entry per (key, bucket) of a batch, written in
one write batch. Like Flink's ``MapState<Long, List<BufferEntry>>`` per key and side,
but bucketed, and ordered bucket before key so that cleanup is a range deletion.

* A batch probes the other side with one iterator: per distinct key of the batch and
  bucket its rows can match (``[min ts + lower, max ts + upper]`` of that key's rows,
  within the buckets the key group holds) one seek and a scan of that key's entries:
  the rows read are those of the batch's keys in the buckets that can match. They are
  matched exactly by the heap path's sorted index (``_SortedRows``).
* A watermark deletes, per key group holding expired buckets, everything below the
  first bucket an on-time row can still join: one ``delete_range`` per key group and
  side (rows of the straddling bucket stay until the next bucket passes: they can no
  longer match, so the output is the heap path's).
* Entries start with their key group, so the backend's full and incremental
  snapshots, restores and rescaling carry them as they are. The state's kind in the
  backend's directory (``"interval-join-rows {"bucket_ms": ...}"``) says the bucket
  width a restore must read them with; a heap job refuses them (:func:`holds_join_rows`).

``bucket_ms`` defaults to the interval's width, at least ``MIN_BUCKET_MS``: a key's
probe reads about two buckets, and cleanup keeps at most one bucket more than needed.
"""

from __future__ import annotations

import json
import operator
import os
import struct
from typing import Callable

import msgpack
import numpy as np
import pyarrow as pa

from raystream.checkpoint.disk_state import DiskKeyedStateBackend, encode_key
from raystream.checkpoint.envelope import KEYED_STATE, SectionKind, read
from raystream.engine.operators.keyed_rows import JoinSide, KeyedRows, concat_tables, ipc_bytes
from raystream.timers.service import TimerService

STATE_NAMES = ("__interval_join_left", "__interval_join_right")
KIND = "interval-join-rows"
MIN_BUCKET_MS = 1000
_HEAD = struct.Struct(">HHQ")  # key group, state id, bucket + 2**63
_SEQ = struct.Struct(">Q")
_SID = struct.Struct(">HH")
_U32 = struct.Struct(">I")
_SIGN = 1 << 63
_I64 = np.iinfo(np.int64)
_EMPTY_LOW, _EMPTY_HIGH = int(_I64.max), int(_I64.min)


def _kind_of(bucket_ms: int) -> str:
    return f"{KIND} {json.dumps({'bucket_ms': bucket_ms})}"


def holds_join_rows(group: int, section: bytes, max_parallelism: int) -> bool:
    """Does keyed-state ``section`` (of either backend) hold disk interval join rows?"""
    envelope, body = read(section, key_group=group, max_parallelism=max_parallelism,
                          kinds=KEYED_STATE)
    if envelope.kind is not SectionKind.DISK_STATE or len(body) < _U32.size:
        return False
    (n,) = _U32.unpack_from(body, 0)
    directory = msgpack.unpackb(bytes(body[_U32.size:_U32.size + n]), raw=False)
    return any(str(kind).startswith(KIND) for _, _, kind in directory)


def _clip(value: int) -> int:
    return min(max(value, int(_I64.min)), int(_I64.max))


class DiskJoinRows:
    """Both sides' buffered rows of one interval join instance, in its disk backend.

    ``timestamps(side, table)``: the int64 ms times of rows of ``side`` read back."""

    def __init__(self, backend: DiskKeyedStateBackend, timers: TimerService,
                 timestamps: Callable[[JoinSide, pa.Table], np.ndarray], *,
                 bucket_ms: int) -> None:
        self._backend = backend
        self._timers = timers
        self._timestamps = timestamps
        self._codes: list[bytes] = []  # the encoded key of each key id
        self._tag = int.from_bytes(os.urandom(4), "big") << 32  # this instance's seqs
        self._seq = 0
        kinds = {backend.state_kind(name) for name in STATE_NAMES} - {None}
        if len(kinds) > 1:
            raise ValueError(f"interval join rows restored with different kinds {kinds}")
        restored = bool(kinds)
        kind = kinds.pop() if restored else _kind_of(bucket_ms)
        self.bucket_ms = int(json.loads(kind[len(KIND) + 1:])["bucket_ms"])
        self._sids = tuple(struct.unpack(">H", backend.raw_state_id(name, kind))[0]
                           for name in STATE_NAMES)
        groups = backend.key_groups
        self._first = groups.start
        # per side and key group (from the first one), the lowest and highest bucket held
        self._low = [np.full(len(groups), _EMPTY_LOW, np.int64) for _ in JoinSide]
        self._high = [np.full(len(groups), _EMPTY_HIGH, np.int64) for _ in JoinSide]
        if restored:
            self._find_buckets()

    def _find_buckets(self) -> None:
        """After a restore: each key group's lowest and highest bucket per side (two
        seeks each)."""
        backend = self._backend
        read_options = backend.read_options(struct.pack(">H", backend.key_groups.stop))
        it = backend.raw_db.iter(read_options)
        for side in JoinSide:
            sid = self._sids[side]
            for group in backend.key_groups:
                head = _SID.pack(group, sid)
                it.seek(head)
                if not it.valid() or it.key()[:4] != head:
                    continue
                at = group - self._first
                self._low[side][at] = _HEAD.unpack_from(it.key())[2] - _SIGN
                it.seek_for_prev(_SID.pack(group, sid + 1))
                self._high[side][at] = _HEAD.unpack_from(it.key())[2] - _SIGN
        del it

    # -- key ids -> encoded keys -----------------------------------------------------------
    def _codes_of(self, kids: np.ndarray) -> list[bytes]:
        codes, n = self._codes, self._timers.num_keys
        if len(codes) < n:  # each key is encoded once, when it first appears
            codes.extend(encode_key(k) for k in self._timers.keys(np.arange(len(codes), n)))
        ids = kids.tolist()
        if len(ids) < 2:
            return [codes[i] for i in ids]
        return list(operator.itemgetter(*ids)(codes))

    # -- write, probe, clean -----------------------------------------------------------------
    def append(self, side: JoinSide, rows: KeyedRows) -> None:
        """Write ``rows`` of ``side``: one entry per (key, bucket), one write batch."""
        import rocksdict

        buckets = np.floor_divide(rows.ts, self.bucket_ms)
        groups = self._timers.key_groups_of(rows.kid)
        order = np.lexsort((rows.kid, buckets, groups))
        kid, bucket, group = rows.kid[order], buckets[order], groups[order]
        new = np.flatnonzero((kid[1:] != kid[:-1]) | (bucket[1:] != bucket[:-1])) + 1
        starts = np.concatenate([[0], new])
        ends = np.append(starts[1:], len(order))
        table = rows.table.take(pa.array(order, pa.int64()))
        seq = _SEQ.pack(self._tag | self._seq)
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        if not self._seq:  # 2**32 batches: a fresh tag keeps seqs unique
            self._tag = int.from_bytes(os.urandom(4), "big") << 32
        sid, pack = self._sids[side], _HEAD.pack
        batch = rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        for g, b, code, start, end in zip(group[starts].tolist(), bucket[starts].tolist(),
                                          self._codes_of(kid[starts]), starts.tolist(),
                                          ends.tolist()):
            put(pack(g, sid, b + _SIGN) + code + seq, ipc_bytes(table.slice(start, end - start)))
        self._backend.raw_db.write(batch)
        at = group[starts] - self._first  # widen each key group's bucket range
        np.minimum.at(self._low[side], at, bucket[starts])
        np.maximum.at(self._high[side], at, bucket[starts])

    def matches(self, side: JoinSide, kid: np.ndarray, ts: np.ndarray,
                offsets: tuple[int, int]) -> tuple[np.ndarray, KeyedRows | None]:
        """Like the heap buffer's ``matches``: pairs of a probe row and a stored row of
        ``side`` with equal key ids and ``ts + offsets[0] <= stored ts <= ts + offsets[1]``:
        the probe rows' positions and the stored rows they pair with (None: no pair)."""
        from raystream.engine.operators.interval_join import _SortedRows

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
        backend, sid, pack = self._backend, self._sids[side], _HEAD.pack
        read_options = backend.read_options(struct.pack(">H", backend.key_groups.stop))
        it = backend.raw_db.iter(read_options)
        values: list[bytes] = []
        counts: list[int] = []  # entries read per asked key
        groups = (at + self._first)[asked].tolist()
        for g, code, lo, hi in zip(groups, self._codes_of(kids[asked]), low[asked].tolist(),
                                   high[asked].tolist()):
            read = len(values)
            for b in range(lo, hi + 1):
                prefix = pack(g, sid, b + _SIGN) + code
                it.seek(prefix)
                while it.valid():
                    key = it.key()
                    if not key.startswith(prefix):
                        break
                    values.append(it.value())
                    it.next()
            counts.append(len(values) - read)
        del it
        if not values:
            return empty
        tables = [pa.ipc.open_stream(v).read_all() for v in values]
        sizes = np.fromiter((t.num_rows for t in tables), np.int64, len(tables))
        stored_kid = np.repeat(np.repeat(kids[asked], counts), sizes)
        table = concat_tables(tables).combine_chunks()
        stored = KeyedRows(table, self._timestamps(side, table), stored_kid)
        probe, found = _SortedRows.of(stored).matches(kid, ts, offsets)
        if not len(probe):
            return empty
        return probe, stored.take(found)

    def drop_before(self, side: JoinSide, ts: int) -> None:
        """Delete the buckets wholly below ``ts`` of ``side``: one range deletion per key
        group holding any."""
        limit = _clip(ts) // self.bucket_ms
        low, high = self._low[side], self._high[side]
        expired = np.flatnonzero(low < limit)
        if not len(expired):
            return
        db, sid, pack = self._backend.raw_db, self._sids[side], _HEAD.pack
        for at, lo, hi in zip(expired.tolist(), low[expired].tolist(), high[expired].tolist()):
            end = min(limit, hi + 1)
            db.delete_range(pack(at + self._first, sid, lo + _SIGN),
                            pack(at + self._first, sid, end + _SIGN))
        gone = expired[high[expired] < limit]
        low[expired] = limit
        low[gone], high[gone] = _EMPTY_LOW, _EMPTY_HIGH

    def stored_entries(self) -> int:
        """How many entries both sides hold (tests and metrics; a full scan)."""
        backend = self._backend
        read_options = backend.read_options(struct.pack(">H", backend.key_groups.stop))
        sids = {struct.pack(">H", s) for s in self._sids}
        return sum(1 for k in backend.raw_db.keys(from_key=struct.pack(
            ">H", backend.key_groups.start), read_opt=read_options) if k[2:4] in sids)
