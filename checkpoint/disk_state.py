"""Disk keyed state backend: keyed state in an embedded RocksDB per operator instance.

Flink's ``EmbeddedRocksDBStateBackend``, in Python: selected per job with
``rs.CheckpointConfig(state_backend="disk")`` (or ``state_backend=DiskStateOptions(...)``
to set its memory budget), it keeps the keyed state of every built-in keyed
operator off the Python heap, so state may outgrow memory: process functions and
reduce through its state handles; time windows, count windows and joins in
layouts of their own through :meth:`DiskKeyedStateBackend.raw_db`
(:mod:`raystream.engine.windows.disk_panes`, :mod:`raystream.engine.windows.disk_count`,
:mod:`raystream.engine.operators.disk_join`).

This module holds the backend: its current key, its states, snapshots and restores.
The database and its options are :mod:`raystream.checkpoint.disk_db`; the state handles
(with their TTL semantics) :mod:`raystream.checkpoint.disk_handles`; the asynchronous part
of a snapshot and the section format :mod:`raystream.checkpoint.disk_snapshot`.

Every entry's key is (:mod:`raystream.checkpoint.disk_layout`, where every layout in
the database is defined)::

    key group (uint16, big-endian) | state id (uint16) | len(key) (uint32) | key | namespace

so all state of a key group is one contiguous key range (a snapshot and a
rescale move key groups with range scans), and all namespaces of one key are
adjacent. The namespace part is empty for the None namespace (all state
outside windows). State ids are local to one backend; sections carry names.
Keys are encoded canonically (numpy scalars as their Python value), so equal
keys give equal bytes.

    >>> backend = DiskKeyedStateBackend(max_parallelism=128, key_groups=range(128))
    >>> count = backend.value_state("count", default=0)
    >>> for user in ["alice", "bob", "alice"]:
    ...     backend.set_current_key(user)
    ...     count.update(count.value() + 1)
    >>> write = backend.snapshot()        # synchronous part: a point-in-time iterator
    >>> count.update(100)                 # processing goes on ("alice" is current)
    >>> sections = write()                # asynchronous part (normally on another thread)
    >>> other = DiskKeyedStateBackend(max_parallelism=128, key_groups=range(64))
    >>> other.restore(sections)           # keeps only key groups 0..63
    >>> c = other.value_state("count", default=0)
    >>> sorted(other.keys("count")) == sorted(
    ...     u for u in ["alice", "bob"] if key_group_of(u, 128) < 64)
    True
    >>> backend.close(); other.close()
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import weakref
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, cast

import numpy as np

from raystream.checkpoint.disk_db import (DiskStateOptions, dispose_db, open_db,
                                          raw_read_options, remove_stale, return_freed_memory)
from raystream.checkpoint.disk_handles import (DiskAggregatingState, DiskListState,
                                               DiskMapState, DiskReducingState,
                                               DiskTtlAggregatingState, DiskTtlListState,
                                               DiskTtlMapState, DiskTtlReducingState,
                                               DiskTtlValueState, DiskValueState, TtlCleanup)
from raystream.checkpoint.disk_layout import (KEY_GROUP, KEYED_HEAD, KEYED_PREFIX,
                                             PLAIN_KEY_TYPES, STATE_ID, encode_key,
                                             group_bound, pack_value, state_id_of, state_prefix,
                                             unpack_value, value_packer)
from raystream.checkpoint.disk_sections import (SECTION_LENGTH, from_heap_value, parse_body,
                                               ttl_base, unexpired)
from raystream.checkpoint.disk_incremental import IncrementalSnapshot, RestoredDb, UploadTracker
from raystream.checkpoint.disk_snapshot import DiskStateSnapshot
from raystream.checkpoint.entry_keys import EntryKeys
from raystream.checkpoint.envelope import KEYED_STATE, SectionKind, is_keyed_state, read
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.checkpoint.state import key_and_namespace
from raystream.checkpoint.keygroups import check_key_group_range, key_group_of
from raystream.checkpoint.ttl import (StateTtlConfig, TtlTimeProvider, check_state_kind, ttl_kind,
                                      wall_clock_ms)

# DiskStateOptions is public API (rs.DiskStateOptions): its path here stays importable
__all__ = ["NATIVE_METRICS", "DiskKeyedStateBackend", "DiskStateOptions"]

_MAX_KEY_GROUPS = 1 << 15  # key group + 1 must fit the uint16 prefix (upper scan bound)
_CLEANUP_EVERY = 16  # accesses per incremental cleanup run (one RocksDB iterator each)

_VALUE, _LIST, _MAP, _REDUCING, _AGGREGATING = "value", "list", "map", "reducing", "aggregating"

# RocksDB properties each operator on the disk backend reports in its subtask's metrics
# (Flink's state.backend.rocksdb.metrics.*): counters RocksDB keeps anyway, so reading
# them costs nothing while nobody asks (statistics would cost every read and write)
NATIVE_METRICS = (
    "estimate-num-keys", "num-files-at-level0", "cur-size-all-mem-tables",
    "block-cache-usage", "block-cache-pinned-usage", "live-sst-files-size",
    "estimate-pending-compaction-bytes", "num-running-compactions", "num-running-flushes",
    "actual-delayed-write-rate", "is-write-stopped", "background-errors")


# ---------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------

class DiskKeyedStateBackend:
    """Keyed state of one operator instance in RocksDB, for the key groups ``key_groups``.

    Same protocol as :class:`~raystream.checkpoint.heap_backend.HeapKeyedStateBackend`
    (see the module docstring for the key layout, :mod:`raystream.checkpoint.disk_handles`
    for serialization and :mod:`raystream.checkpoint.disk_snapshot` for snapshots).
    Threading: all state access, ``snapshot`` and ``restore`` happen on the
    subtask's processing thread; only a :class:`DiskStateSnapshot` runs elsewhere.

    >>> b = DiskKeyedStateBackend(max_parallelism=128, key_groups=range(128))
    >>> seen = b.list_state("seen")
    >>> b.set_current_key(("alice", 1))
    >>> seen.add("x"); seen.add(2.5)
    >>> seen.get()
    ['x', 2.5]
    >>> b.close()
    """

    def __init__(self, *, max_parallelism: int, key_groups: range,
                 options: DiskStateOptions | None = None,
                 ttl_time_provider: TtlTimeProvider = wall_clock_ms) -> None:
        check_key_group_range(key_groups, max_parallelism)
        if max_parallelism > _MAX_KEY_GROUPS:
            raise ValueError(f"disk state backend: max_parallelism must be <= {_MAX_KEY_GROUPS}, "
                             f"got {max_parallelism}")
        self.options = options or DiskStateOptions()
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        parent = self.options.local_dir or tempfile.gettempdir()
        os.makedirs(parent, exist_ok=True)
        remove_stale(parent)
        self.path = os.path.join(parent, f"raystream-state-{os.getpid()}-{uuid.uuid4().hex}")
        import rocksdict

        # one block cache for this backend's database, the adopted one of a restore too
        self._cache = rocksdict.Cache(self.options.block_cache_bytes)
        self._db = open_db(self.path, self.options, self._cache)
        self._finalizer = weakref.finalize(self, dispose_db, self._db, self.path)
        self._states: dict[str, tuple[bytes, str]] = {}  # name -> (state id bytes, kind)
        self._ttl_now = ttl_time_provider  # the processing-time clock of state TTLs
        self._ttls: dict[str, TtlCleanup] = {}  # states declared with a TTL
        self._restored: set[int] = set()
        self._uploads = UploadTracker()  # incremental checkpoints: what is uploaded already
        self._key: Any = None
        self._kg: int | None = None
        self._ns: Any = None
        self._ns_bytes = b""
        self._key_bytes = b""
        self._kg_bytes: bytes | None = None
        self._suffix = b""
        get = getattr(self._db, "get", None)
        self._get = get if get is not None else self._get_or_none

    # keyed state of either backend: it restores the heap backend's too
    owns_section = staticmethod(is_keyed_state)

    def close(self) -> None:
        """Close the database and remove its directory (idempotent)."""
        self._finalizer()

    def release_memory(self) -> None:
        """Empty the block cache and keep it empty: the subtask's attempt ended. The
        database stays open for an asynchronous checkpoint part still reading it (it
        closes once nothing references this backend), but a new attempt in the same
        process opens its own next to it, and two full caches would hold twice the
        budget."""
        self._cache.set_capacity(0)
        return_freed_memory()

    def native_metrics(self) -> dict[str, float]:
        """RocksDB's own figures (:data:`NATIVE_METRICS`, its properties), named
        ``rocksdb.<property>``: read from any thread (RocksDB's properties are), none once
        the database is closed."""
        db, out = self._db, {}
        try:
            for name in NATIVE_METRICS:
                value = db.property_int_value(f"rocksdb.{name}")
                if value is not None:
                    out[f"rocksdb.{name}"] = float(value)
        except Exception:  # closed meanwhile (an attempt ending): nothing to report
            return {}
        return out

    # -- raw access ----------------------------------------------------------
    def _get_or_none(self, key: bytes) -> bytes | None:
        try:
            return self._db[key]
        except KeyError:
            return None

    def _multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        # a list of keys is a multi-get (rocksdict's stub takes no list[bytes], nor a list back)
        return list(self._db[keys])  # pyright: ignore[reportArgumentType]

    def _multi_get_ordered(self, keys: EntryKeys) -> list[bytes | None]:
        """The values at ``keys`` in the caller's order, read in RocksDB's."""
        return keys.in_caller_order(self._multi_get(keys.ordered))

    def _write_ordered(self, keys: EntryKeys, values: Sequence[bytes]) -> None:
        """Write ``values`` (in the caller's order) at ``keys``, in key order."""
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for k, i in zip(keys.ordered, keys.order):
            batch.put(k, values[i])
        self._db.write(batch)

    def _write(self, pairs: list[tuple[bytes, bytes]]) -> None:
        import rocksdict

        # in key order: each insert's walk down the memtable's skiplist then finds most
        # of its path in the CPU cache from the one before (hashed keys arrive at random);
        # a stable sort on the keys alone, so of a key written twice the later put wins
        pairs.sort(key=itemgetter(0))
        batch = rocksdict.WriteBatch(raw_mode=True)
        for k, v in pairs:
            batch.put(k, v)
        self._db.write(batch)

    def _delete_all(self, keys: list[bytes]) -> None:
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for k in keys:
            batch.delete(k)
        self._db.write(batch)

    def entry_keys(self, sid: bytes, keys: list[Any], groups: Sequence[int] | np.ndarray
                   ) -> list[bytes]:
        """The stored keys (``kg | sid | len(key) | key``, namespace-less) of state id
        ``sid`` for ``keys`` in key groups ``groups``: a batch's keys encoded once, for a
        multi-get and a write batch; a key group outside this backend's fails naming its
        key."""
        groups = self._own_groups(keys, groups)
        pack, state = KEYED_PREFIX.pack, state_id_of(sid)
        return [pack(g, state, len(c)) + c for c, g in zip(self._codes(keys), groups.tolist())]

    def ordered_entry_keys(self, sid: bytes, keys: list[Any],
                           groups: Sequence[int] | np.ndarray) -> EntryKeys:
        """:meth:`entry_keys` in RocksDB's order, as :class:`EntryKeys`."""
        groups = self._own_groups(keys, groups)
        codes = self._codes(keys)
        heads = np.empty(len(codes), dtype=KEYED_HEAD)
        heads["group"] = groups
        heads["state"] = state_id_of(sid)
        heads["length"] = np.fromiter(map(len, codes), dtype=np.int64, count=len(codes))
        return EntryKeys.build(heads, codes)

    def _own_groups(self, keys: list[Any], groups: Sequence[int] | np.ndarray) -> np.ndarray:
        """``groups`` as an array, all of them this backend's (else fails naming the key)."""
        span = self.key_groups
        groups = np.asarray(groups, dtype=np.int64)
        outside = np.flatnonzero((groups < span.start) | (groups >= span.stop))
        if len(outside):
            i = int(outside[0])
            raise ValueError(f"key {keys[i]!r} is in key group {int(groups[i])}, outside this "
                             f"backend's key groups {span.start}..{span.stop - 1}")
        return groups

    @staticmethod
    def _codes(keys: list[Any]) -> list[bytes]:
        """The encoded ``keys`` (:func:`encode_key`)."""
        if set(map(type, keys)) <= PLAIN_KEY_TYPES:  # nothing to canonicalize: pack as is
            packer = value_packer()
            return [packer.pack(k) for k in keys]
        return [encode_key(k) for k in keys]

    def _entry_key(self, sid: bytes, key: Any, key_group: int, namespace: Any = None) -> bytes:
        kb = encode_key(key)
        if namespace is None:
            return KEYED_PREFIX.pack(key_group, state_id_of(sid), len(kb)) + kb
        return KEYED_PREFIX.pack(key_group, state_id_of(sid), len(kb)) + kb + pack_value(namespace)

    # -- current key and namespace ----------------------------------------
    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Scope subsequent state accesses to ``key``, whose key group (computed
        with ``key_group_of`` unless given) must belong to this backend."""
        if key_group is None:
            key_group = key_group_of(key, self.max_parallelism)
        if key_group not in self.key_groups:
            raise ValueError(
                f"key {key!r} is in key group {key_group}, outside this backend's key "
                f"groups {self.key_groups.start}..{self.key_groups.stop - 1}")
        kb = encode_key(key)
        self._key = key
        self._kg = key_group
        self._kg_bytes = group_bound(key_group)
        self._key_bytes = SECTION_LENGTH.pack(len(kb)) + kb
        self._suffix = self._key_bytes + self._ns_bytes

    @property
    def current_key(self) -> Any:
        return self._key

    @property
    def current_key_group(self) -> int | None:
        return self._kg

    def set_namespace(self, namespace: Any) -> None:
        """Scope subsequent state accesses to ``namespace`` (None by default)."""
        self._ns = namespace
        self._ns_bytes = b"" if namespace is None else pack_value(namespace)
        self._suffix = self._key_bytes + self._ns_bytes

    @property
    def current_namespace(self) -> Any:
        return self._ns

    # -- state handles -------------------------------------------------------
    def _sid(self, name: str, kind: str) -> bytes:
        entry = self._states.get(name)
        if entry is None:
            if len(self._states) >= 1 << 16:
                raise ValueError("disk state backend: more than 65536 state names")
            entry = self._states[name] = (STATE_ID.pack(len(self._states)), kind)
        else:
            check_state_kind(name, entry[1], kind)
        return entry[0]

    def _declare(self, name: str, kind: str, ttl: StateTtlConfig | None
                 ) -> tuple[bytes, TtlCleanup | None]:
        """The state id of ``name`` and, for a state with a TTL, its cleanup record."""
        sid = self._sid(name, ttl_kind(kind, name, ttl))
        if ttl is None:
            return sid, None
        t = self._ttls.get(name)
        if t is None:
            t = self._ttls[name] = TtlCleanup(ttl, kind, sid, self.key_groups.start)
        elif t.cfg != ttl:
            raise ValueError(f"state {name!r} is declared with two TTLs: {t.cfg} and {ttl}")
        return sid, t

    def value_state(self, name: str, default: Any = None, *,
                    ttl: StateTtlConfig | None = None) -> DiskValueState:
        """``ttl``: expire values (see :class:`~raystream.StateTtlConfig`); likewise below."""
        sid, t = self._declare(name, _VALUE, ttl)
        if t is None:
            return DiskValueState(self, sid, name, default)
        return DiskTtlValueState(self, sid, name, default, t)

    def list_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> DiskListState:
        sid, t = self._declare(name, _LIST, ttl)
        return DiskListState(self, sid, name) if t is None else DiskTtlListState(self, sid, name, t)

    def map_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> DiskMapState:
        sid, t = self._declare(name, _MAP, ttl)
        return DiskMapState(self, sid, name) if t is None else DiskTtlMapState(self, sid, name, t)

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any], *,
                       ttl: StateTtlConfig | None = None) -> DiskReducingState:
        sid, t = self._declare(name, _REDUCING, ttl)
        if t is None:
            return DiskReducingState(self, sid, name, reduce)
        return DiskTtlReducingState(self, sid, name, reduce, t)

    def aggregating_state(self, name: str, aggregate: Any, *,
                          ttl: StateTtlConfig | None = None) -> DiskAggregatingState:
        sid, t = self._declare(name, _AGGREGATING, ttl)
        if t is None:
            return DiskAggregatingState(self, sid, name, aggregate)
        return DiskTtlAggregatingState(self, sid, name, aggregate, t)

    def _cleanup_step(self, t: TtlCleanup, now: int) -> None:
        """The incremental TTL cleanup (Flink's, which its RocksDB backend lacks): check
        ``cleanup_per_access`` stored values of ``t``'s state per access, in key order
        through its range of each key group in turn, wrapping around (a key group
        moved past counts as one), deleting what has expired. It runs every
        ``_CLEANUP_EVERY`` accesses for that many accesses' worth: a RocksDB iterator
        costs several microseconds to create, more than checking a few values."""
        n = t.cfg.cleanup_per_access
        if not n:
            return
        t.accesses += 1
        if t.accesses < _CLEANUP_EVERY:
            return
        n *= t.accesses
        t.accesses = 0
        base, ttl_ms, sid = t.base, t.cfg.ttl_ms, t.sid
        prefix = group_bound(t.kg) + sid
        it = self._db.iter()
        it.seek(t.seek)
        for _ in range(n):
            k = it.key() if it.valid() else None
            if k is None or k[:4] != prefix:  # past the state's range in this key group
                kg = t.kg + 1
                t.kg = self.key_groups.start if kg >= self.key_groups.stop else kg
                prefix = t.seek = group_bound(t.kg) + sid
                it.seek(prefix)
                continue
            v = it.value()
            live = unexpired(base, v, ttl_ms, now)
            if live is None:
                del self._db[k]
            elif live is not v:
                self._db[k] = live
            t.seek = k + b"\x00"  # the next key after k
            it.next()

    def state_names(self) -> list[str]:
        return list(self._states)

    def keys(self, name: str) -> Iterator[Any]:
        """Keys with state under ``name`` in any namespace, each once, by key group,
        as of the call (state may change, and the current key move, while iterating)."""
        entry = self._states.get(name)
        if entry is None:
            return iter(())
        read = self._bounded()
        # a raw-mode database's keys are bytes (rocksdict's stub types any key)
        keys = cast(Iterator[bytes], self._db.keys(from_key=group_bound(self.key_groups.start),
                                                   read_opt=read))
        return self._iter_keys(entry[0], keys, read)

    def _bounded(self):
        """Read options bounded to this backend's key groups. Keep them referenced as
        long as an iterator made with them (rocksdict 0.3.29 does not, and an
        iterator whose options were freed loses its bound)."""
        read = raw_read_options()
        read.set_iterate_upper_bound(group_bound(self.key_groups.stop))
        return read

    @staticmethod
    def _iter_keys(sid: bytes, keys: Iterator[bytes], _read: Any) -> Iterator[Any]:
        last = None
        for k in keys:
            if k[2:4] != sid:
                continue
            (n,) = SECTION_LENGTH.unpack_from(k, 4)
            kb = k[:2] + k[8:8 + n]  # namespaces of one key are adjacent within its group
            if kb != last:
                last = kb
                yield unpack_value(kb[2:])

    # -- snapshot and restore ---------------------------------------------------
    def snapshot(self) -> DiskStateSnapshot | IncrementalSnapshot:
        """Synchronous part: a RocksDB iterator over this backend's key groups (a
        point-in-time view, no copying); returns the asynchronous part. With
        ``incremental`` options also a local RocksDB checkpoint (a flush, then hard
        links), which the asynchronous part uploads as an incremental checkpoint."""
        directory = self._directory()
        read = self._bounded()
        # a raw-mode database's keys and values are bytes (rocksdict's stub types any)
        entries = cast(Iterator[tuple[bytes, bytes]],
                       self._db.items(from_key=group_bound(self.key_groups.start), read_opt=read))
        now = self._ttl_now()  # expired values are left out, as of now (the synchronous part)
        expiry = {t.sid: (t.base, t.cfg.ttl_ms, now) for t in self._ttls.values()}
        full = DiskStateSnapshot(self, entries, read, directory, expiry)
        if not self.options.incremental:
            return full
        import rocksdict

        local = f"{self.path}.chk{uuid.uuid4().hex}"  # a sibling: stale ones go with the DB's
        self._db.flush(True)  # no WAL: the memtable must be in SST files to be checkpointed
        rocksdict.Checkpoint(self._db).create_checkpoint(local)
        return IncrementalSnapshot(local_dir=local, full=full, release_full=full.release,
                                   tracker=self._uploads, max_parallelism=self.max_parallelism,
                                   key_groups=self.key_groups, states=directory)

    def _directory(self) -> list[list]:
        return [[state_id_of(sid), name, kind] for name, (sid, kind) in self._states.items()]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: later incremental checkpoints reuse
        the files it uploaded."""
        self._uploads.complete(checkpoint_id)

    def restore_db(self, dbs: Iterable[RestoredDb]) -> None:
        """Restore the databases of an incremental checkpoint, keeping this backend's
        key groups (Flink's approach): the one sharing the most key groups with this
        backend becomes its database (files downloaded, nothing rewritten; key groups
        of other backends deleted by range), and the entries of this backend's key
        groups in every other one (a rescale) are copied over in write batches."""
        overlaps = [(self._overlap(d), d) for d in dbs]
        overlaps = [(o, d) for o, d in overlaps if o]
        for _, d in overlaps:
            if d.manifest.max_parallelism != self.max_parallelism:
                raise ValueError(f"a keyed-state database of max_parallelism "
                                 f"{d.manifest.max_parallelism} cannot restore into one of "
                                 f"{self.max_parallelism}")
        rest = [d for _, d in overlaps]
        if overlaps and not self._states and not self._restored:  # an empty backend
            first = max(overlaps, key=lambda od: len(od[0]))[1]
            self._adopt(first)
            rest.remove(first)
        for d in rest:
            self._copy_from(d)
        for groups, _ in overlaps:
            self._restored.update(groups)

    def _overlap(self, db: RestoredDb) -> range:
        theirs = db.manifest.key_groups
        return range(max(theirs.start, self.key_groups.start),
                     min(theirs.stop, self.key_groups.stop))

    def _adopt(self, db: RestoredDb) -> None:
        """Replace this (empty) backend's database by the one of ``db``, without the
        key groups that are not this backend's."""
        self._finalizer()  # close and remove the empty database
        os.makedirs(self.path)
        try:
            db.download(self.path)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        self._db = open_db(self.path, self.options, self._cache)
        self._finalizer = weakref.finalize(self, dispose_db, self._db, self.path)
        get = getattr(self._db, "get", None)
        self._get = get if get is not None else self._get_or_none
        self._states = {name: (STATE_ID.pack(sid), kind) for sid, name, kind in db.manifest.states}
        theirs = db.manifest.key_groups
        if theirs.start < self.key_groups.start:
            self._db.delete_range(group_bound(theirs.start), group_bound(self.key_groups.start))
        if theirs.stop > self.key_groups.stop:
            self._db.delete_range(group_bound(self.key_groups.stop), group_bound(theirs.stop))
        if db.reusable and theirs == self.key_groups:  # the job's own files, all ours
            self._uploads.restored(db.shared_files())

    def _copy_from(self, db: RestoredDb, batch_bytes: int = 4 << 20) -> None:
        """Copy the entries of this backend's key groups from ``db`` (state ids renamed
        to this backend's)."""
        import rocksdict

        sids = {group_bound(sid): self._sid(name, kind) for sid, name, kind in db.manifest.states}
        temp = f"{self.path}.restore{uuid.uuid4().hex}"
        try:
            db.download(temp)
            other = open_db(temp, DiskStateOptions(memory_mb=8))
            try:
                read = raw_read_options()
                read.set_iterate_upper_bound(group_bound(min(self.key_groups.stop,
                                                           db.manifest.key_groups.stop)))
                start = max(self.key_groups.start, db.manifest.key_groups.start)
                items = cast(Iterator[tuple[bytes, bytes]],
                             other.items(from_key=group_bound(start), read_opt=read))
                batch, size = rocksdict.WriteBatch(raw_mode=True), 0
                for k, v in items:
                    batch.put(k[:2] + sids[k[2:4]] + k[4:], v)
                    size += len(k) + len(v)
                    if size >= batch_bytes:
                        self._db.write(batch)
                        batch, size = rocksdict.WriteBatch(raw_mode=True), 0
                self._db.write(batch)
                del items
            finally:
                other.close()
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def restore(self, sections: Iterable[tuple[int, bytes]] | Mapping[int, bytes]) -> None:
        """Load snapshot sections, keeping only key groups in ``self.key_groups``
        (one write batch per section). A key group must not be given twice."""
        if isinstance(sections, Mapping):  # the Mapping[int, bytes] of the union
            sections = cast(Mapping[int, bytes], sections).items()
        for kg, data in sections:
            if kg in self.key_groups:
                self._restore_section(kg, data)

    def _restore_section(self, kg: int, data: bytes) -> None:
        envelope, body = read(data, key_group=kg, max_parallelism=self.max_parallelism,
                              kinds=KEYED_STATE)
        if envelope.kind is SectionKind.HEAP_CHANGES:
            raise ValueError(
                f"key group {kg}: the checkpoint holds the heap state backend's incremental "
                f"checkpoint (changes since an earlier one), which only that backend restores; "
                f"restore with CheckpointConfig(state_backend='heap'), or from a savepoint "
                f"(always full)")
        if kg in self._restored:
            raise ValueError(f"key group {kg} restored twice")
        if envelope.kind is SectionKind.HEAP_STATE:  # a job switching backends
            self._restore_heap_section(kg, data)
        else:
            directory, entries = parse_body(kg, body)
            sids = {sid: self._sid(name, kind) for sid, (name, kind) in directory.items()}
            kgb = group_bound(kg)
            self._write([(kgb + sids[sid] + suffix, value) for sid, suffix, value in entries])
        self._restored.add(kg)

    def _restore_heap_section(self, kg: int, section: bytes) -> None:
        """A section the heap backend wrote (a job switching backends through a savepoint)."""
        heap = HeapKeyedStateBackend(max_parallelism=self.max_parallelism,
                                     key_groups=range(kg, kg + 1))
        heap.restore([(kg, section)])
        kgb = group_bound(kg)
        pairs = []
        for name, table in heap._tables.items():
            sid = self._sid(name, table.kind)
            base = ttl_base(table.kind)  # a state with a TTL: (value, timestamp)s
            for kk, value in table.kgs[0].m.items():
                key, ns = key_and_namespace(kk)
                kb = encode_key(key)
                pairs.append((kgb + sid + SECTION_LENGTH.pack(len(kb)) + kb
                              + (b"" if ns is None else pack_value(ns)),
                              pack_value(value) if base is None else from_heap_value(base, value)))
        self._write(pairs)

    def __repr__(self) -> str:
        return (f"DiskKeyedStateBackend(max_parallelism={self.max_parallelism}, "
                f"key_groups={self.key_groups!r}, states={list(self._states)})")

    # -- raw entries of another layout (the window operator's dense panes) ----------------
    @property
    def raw_db(self) -> Any:
        """The raw-bytes RocksDB, for a layout that writes entries of its own under a state
        id of its own kind (:meth:`raw_state_id`), each key starting with its key group and
        that id, so snapshots, incremental checkpoints and rescaling carry them as they
        are. Read it anew after a restore (``restore_db`` may replace the database)."""
        return self._db

    def raw_state_id(self, name: str, kind: str) -> bytes:
        """The state id (two bytes) of raw state ``name`` of ``kind``, allocated if new."""
        return self._sid(name, kind)

    def raw_state_entries(self, name: str, kind: str
                          ) -> Iterator[tuple[int, list[tuple[bytes, bytes]]]]:
        """Each key group's entries of raw state ``name`` of ``kind``, ``(group, [(key,
        value), ...])`` for the groups that hold any: a layout moving an older layout's
        entries into its own (read a group whole before writing into it)."""
        sid = KEY_GROUP.unpack(self.raw_state_id(name, kind))[0]
        for group in self.key_groups:
            read_options = self.read_options(state_prefix(group, sid + 1))
            entries = cast(list[tuple[bytes, bytes]], list(  # raw mode: bytes
                self._db.items(from_key=state_prefix(group, sid), read_opt=read_options)))
            if entries:
                yield group, entries

    def state_kind(self, name: str) -> str | None:
        """The kind of state ``name`` (None if this backend has none by that name)."""
        entry = self._states.get(name)
        return None if entry is None else entry[1]

    @staticmethod
    def read_options(upper_bound: bytes) -> Any:
        """Read options whose iterators stop before ``upper_bound``; keep them referenced
        as long as such an iterator (see :meth:`_bounded`)."""
        read = raw_read_options()
        read.set_iterate_upper_bound(upper_bound)
        return read

    @staticmethod
    def decode_key(data: bytes) -> Any:
        """The key :func:`encode_key` encoded as ``data``."""
        return unpack_value(data)
