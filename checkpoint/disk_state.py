"""Disk keyed state backend: keyed state in an embedded RocksDB per operator instance.

Flink's ``EmbeddedRocksDBStateBackend``, in Python: selected per job with
``rs.CheckpointConfig(state_backend="disk")`` (or ``state_backend=DiskStateOptions(...)``
to set its memory budget), it keeps the keyed state of every built-in keyed
operator off the Python heap, so state may outgrow memory: process functions and
reduce through its state handles; time windows, count windows and joins in
layouts of their own through :meth:`DiskKeyedStateBackend.raw_db`
(:mod:`raystream.engine.windows.disk_panes`, :mod:`raystream.engine.windows.disk_count`,
:mod:`raystream.engine.operators.disk_join`).

Why rocksdict
-------------
``rocksdict`` binds RocksDB through Rust (``rust-rocksdb``) and ships wheels
that bundle RocksDB itself: no system library, no compiler on the workers, the
same engine on every machine. It exposes what this backend needs and nothing
in Python per entry: raw-bytes mode, point and multi gets, write batches,
point-in-time range iterators with bounds, block cache and write-buffer
sizing.

Layout
------
One RocksDB per operator instance, in a fresh directory under
:attr:`DiskStateOptions.local_dir` (the system temp dir by default), removed
when the backend is closed or garbage-collected; directories of dead processes
(a killed subtask) are removed by the next backend that opens in the same
directory. The local database is never recovered from: after a failure state
comes from the job's checkpoint, so the write-ahead log is off.

Every entry's key is (:mod:`raystream.checkpoint.disk_layout`, where every layout in
the database is defined)::

    key group (uint16, big-endian) | state id (uint16) | len(key) (uint32) | key | namespace

so all state of a key group is one contiguous key range (a snapshot and a
rescale move key groups with range scans), and all namespaces of one key are
adjacent. The namespace part is empty for the None namespace (all state
outside windows). State ids are local to one backend; sections carry names.

Serialization is fixed: keys and values are MessagePack (ints, floats,
strings, bytes, booleans, None, lists and dicts of those, tuples through an
extension type); only an opaque user object (a ``datetime``, a dataclass, a
numpy scalar...) is pickled, inside an extension type, and such bytes are only
ever read back from this job's own local database or checkpoint storage.
Keys are encoded canonically (numpy scalars as their Python value), so equal
keys give equal bytes.

Semantics differ from the heap backend in one way, as in Flink: a value read
from state is a copy, so mutating it in place changes nothing until it is
written back (``update``, ``put``, ``add``).

State TTL
---------
A state created with ``ttl=StateTtlConfig(...)`` (:mod:`raystream.checkpoint.ttl`)
behaves exactly as on the heap backend, with the same injectable clock
(``ttl_time_provider``). Its stored values start with a fixed 8-byte header, a
big-endian int64 timestamp in ms, before the MessagePack bytes: the time of the
last renewal for value, reducing and aggregating state; for a list state
(``[[element, ts], ...]``) and a map state (``{user key: [value, ts]}``), where
every element or entry expires on its own, the oldest of their timestamps. So
whether anything of a value has expired is one look at its first 8 bytes. A
read hides and deletes what has expired; every access also checks the next
``cleanup_per_access`` stored values of the state and deletes or rewrites the
expired ones (a cursor per state through its key range of each key group in
turn, wrapping around; it runs every 16 accesses for their share, as creating
a RocksDB iterator costs more than checking a few values; the batch reads and
writes of keyed reduce, ``values_at`` and ``update_at``, count as one access
and check their batch's headers with numpy); full snapshots and savepoints
leave expired values out (as of their synchronous part).

Flink drops expired values while RocksDB compacts, through a C++ compaction
filter (``FlinkCompactionFilter``); ``rocksdict`` has none. Here TTL goes
through compaction the other way round: expired values are deleted by the
reads and the cleanup above, and the database is opened with a
compact-on-deletion collector, so SST files that fill with those tombstones
are compacted and the space is reclaimed. An incremental checkpoint uploads
SST files as they are, so it may hold values that had expired but were not
deleted yet: a restored job hides them on read (their timestamps came with
them) and the cleanup deletes them.

In a snapshot's directory the kind of a state with a TTL carries the heap
backend's ``+ttl`` suffix (``"value+ttl"``...), so a restore declaring the
state without a TTL (or a state without one with a TTL) is refused, as in
Flink, and a section moves between backends with its timestamps: the heap
backend stores ``(value, ts)`` (per element, per entry) and converts.

Snapshots
---------
:meth:`DiskKeyedStateBackend.snapshot` is the synchronous part of a checkpoint:
it creates a RocksDB iterator over the backend's key range (O(1), no copying; a
RocksDB iterator reads the database as of its creation, like a snapshot) and
returns the asynchronous part, a callable that runs that iterator on the
checkpointing thread while processing goes on, giving one section per non-empty
key group: a full snapshot, every checkpoint writes all state. With
``DiskStateOptions(incremental=True)`` the synchronous part also flushes the
memtable and makes a local RocksDB checkpoint (hard links), and a checkpoint
uploads only the SST files no completed checkpoint has uploaded before,
referencing the others again (:mod:`raystream.checkpoint.disk_incremental`;
:meth:`DiskKeyedStateBackend.restore_db` reads such a checkpoint back, at any
parallelism). A savepoint is always full, in the section format below.

Section format: the envelope of :mod:`raystream.checkpoint.envelope` (magic
``b"RSKD"``, format version, key-group hash version, max_parallelism, key
group); a big-endian ``uint32`` length and a MessagePack directory
``[[state id, name, kind], ...]`` (kind ``"+ttl"``-suffixed for a state with a
TTL); then entries ``state id (uint16) | len (uint32) | key suffix | len
(uint32) | value``, the suffix and value exactly as stored (no
re-serialization; only a TTL list or map with expired parts is rewritten
without them).
Either backend restores the other's sections, so a job switches backends by
restoring a savepoint with the other ``state_backend``. The timers of a disk
job are entries of kind :data:`TIMERS_KIND` in the same database
(:mod:`raystream.timers.disk_service`), so sections carry them too:
:func:`section_entries` leaves them out and :func:`section_timer_entries`
gives them to a heap job's timer service.

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

import json
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, cast

import numpy as np

from raystream.checkpoint.disk_layout import (KEY_GROUP, KEYED_HEAD, KEYED_PREFIX,
                                             PLAIN_KEY_TYPES, STATE_ID, encode_key,
                                             group_bound, pack_value, state_id_of, state_prefix,
                                             unpack_value, unpack_values, value_packer)
from raystream.checkpoint.disk_sections import (NEVER_EXPIRES, SECTION_LENGTH, TTL_HEADER, encode_ttl_list, encode_ttl_map,
                                               from_heap_value, oldest_live, parse_body,
                                               ttl_base, unexpired)
from raystream.checkpoint.disk_incremental import IncrementalSnapshot, RestoredDb, UploadTracker
from raystream.checkpoint.entry_keys import EntryKeys
from raystream.checkpoint.envelope import KEYED_STATE, Envelope, SectionKind, is_keyed_state, read
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.checkpoint.state import key_and_namespace
from raystream.checkpoint.keygroups import check_key_group_range, key_group_of
from raystream.checkpoint.ttl import (StateTtlConfig, TtlAggregatingOps,
                                      TtlHandle, TtlMapReads, TtlReducingOps, TtlSingle,
                                      TtlTimeProvider, TtlValueOps, check_state_kind, is_expired,
                                      read_elements, read_entries,
                                      read_entry, ttl_kind, wall_clock_ms)

__all__ = ["DiskKeyedStateBackend", "DiskStateOptions", "DiskStateSnapshot"]

_MAX_KEY_GROUPS = 1 << 15  # key group + 1 must fit the uint16 prefix (upper scan bound)
_NO_EXPIRY = TTL_HEADER.pack(NEVER_EXPIRES)  # the header values_at reads for an unset key
_MISSING: Any = object()

_VALUE, _LIST, _MAP, _REDUCING, _AGGREGATING = "value", "list", "map", "reducing", "aggregating"

_MEMTABLE_BLOOM_RATIO = 0.1
# A memtable is a skiplist: a get or a put walks it with a cache miss a level, so a
# big one is slow, and an incremental checkpoint flushes it every interval anyway.
# RocksDB's default size; the budget beyond goes to the block cache (keyed reduce
# batches updating 2M keys, a flush every 1.17M rows, sorted writes below too, on a
# loaded machine: 172-174k rows per CPU second against 157-170k with a sixth of 2 GB)
_MAX_MEMTABLE_BYTES = 64 << 20

# RocksDB properties each operator on the disk backend reports in its subtask's metrics
# (Flink's state.backend.rocksdb.metrics.*): counters RocksDB keeps anyway, so reading
# them costs nothing while nobody asks (statistics would cost every read and write)
NATIVE_METRICS = (
    "estimate-num-keys", "num-files-at-level0", "cur-size-all-mem-tables",
    "block-cache-usage", "block-cache-pinned-usage", "live-sst-files-size",
    "estimate-pending-compaction-bytes", "num-running-compactions", "num-running-flushes",
    "actual-delayed-write-rate", "is-write-stopped", "background-errors")

# ---------------------------------------------------------------------------
# Options and the database
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DiskStateOptions:
    """The disk backend with its settings, for ``CheckpointConfig(state_backend=...)``.

    Args:
        memory_mb: memory RocksDB may use per operator instance (subtask): two
            memtables of a sixth of it each, at most 64 MB, and the rest block cache.
        local_dir: where each instance creates its database directory (the
            system temp dir if None); a local disk, not checkpoint storage.
        incremental: checkpoints upload only the RocksDB files that are new since
            the previous completed checkpoint (:mod:`raystream.checkpoint.disk_incremental`);
            savepoints stay full. Off by default: a restore then reads more files,
            and the job's storage holds files shared between checkpoints.

    >>> DiskStateOptions(memory_mb=128).block_cache_bytes
    89478487
    >>> DiskStateOptions(memory_mb=2048).block_cache_bytes >> 20
    1907
    >>> DiskStateOptions(memory_mb=4)
    Traceback (most recent call last):
    ...
    ValueError: disk state backend: memory_mb must be >= 8, got 4
    """

    memory_mb: int = 64
    local_dir: str | None = None
    incremental: bool = False

    def __post_init__(self) -> None:
        if self.memory_mb < 8:
            raise ValueError(f"disk state backend: memory_mb must be >= 8, got {self.memory_mb}")

    @property
    def kind(self) -> str:
        return "disk"

    @property
    def block_cache_bytes(self) -> int:
        """What the two memtables and their bloom filters leave of the budget."""
        return self.memory_mb * (1 << 20) - int(2 * self.write_buffer_bytes
                                                * (1 + _MEMTABLE_BLOOM_RATIO))

    @property
    def write_buffer_bytes(self) -> int:
        """Size of one memtable: with its bloom filter a sixth of the budget, at most
        :data:`_MAX_MEMTABLE_BYTES` (two may exist at once)."""
        return min(int(self.memory_mb * (1 << 20) / 6 / (1 + _MEMTABLE_BLOOM_RATIO)),
                   _MAX_MEMTABLE_BYTES)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(parent: str) -> None:
    """Remove database directories left by processes that are gone (a killed subtask)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) == 4 and parts[:2] == ["raystream", "state"] and parts[2].isdigit():
            if not _pid_alive(int(parts[2])):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _open_db(path: str, options: DiskStateOptions, cache: Any = None):
    """Open (or create) the database at ``path``; ``cache``, a ``rocksdict.Cache``, is
    its block cache (a new one of the options' size if None)."""
    import rocksdict

    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(cache if cache is not None else rocksdict.Cache(options.block_cache_bytes))
    table.set_cache_index_and_filter_blocks(True)  # counted in the budget
    table.set_bloom_filter(10, False)  # point gets dominate
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_size(options.write_buffer_bytes)
    opts.set_max_write_buffer_number(2)
    opts.set_db_write_buffer_size(options.write_buffer_bytes * 2)
    # A bloom filter over each memtable's whole keys (a tenth of its size): a get of a key
    # the memtable lacks, most gets between two flushes, skips the skiplist walk, a cache
    # miss per level (a batch of keyed reduce, 1M keys: 20% more rows/s)
    opts.set_memtable_prefix_bloom_ratio(_MEMTABLE_BLOOM_RATIO)
    opts.set_memtable_whole_key_filtering(True)
    opts.set_max_background_jobs(2)
    # Every SST file is uploaded by an incremental checkpoint, and gets hit the block
    # cache's uncompressed blocks, so file size matters more than decompression speed:
    # ZSTD at level 1 (window bits, level, strategy, dictionary bytes), not RocksDB's
    # Snappy (keyed rows {key, value, i}: 16.2 SST bytes an entry against 22.0, for 14%
    # more CPU writing and compacting them)
    opts.set_compression_type(rocksdict.DBCompressionType.zstd())
    opts.set_compression_options(-14, 1, 0, 0)
    # TTL through compaction: deleting expired entries leaves tombstones; an SST with
    # many (64 in any 128 consecutive entries, or half of it) is compacted, so the
    # space is reclaimed (rocksdict has no compaction filter to drop expired values)
    opts.add_compact_on_deletion_collector_factory(128, 64, 0.5)
    # Keys are hashed, so every flush (one per incremental checkpoint) is an L0 file over
    # the whole key range, and each L0->L1 compaction rewrites all of L1, which the next
    # checkpoint uploads again: gather 16 L0 files rather than RocksDB's 4 first (a third
    # of the bytes uploaded, bench/large_state.py; point gets stay cheap: bloom filters)
    opts.set_level_zero_file_num_compaction_trigger(16)
    opts.set_level_zero_slowdown_writes_trigger(32)
    opts.set_level_zero_stop_writes_trigger(48)
    # An existing database (a restore adopts a checkpoint's) is opened with the options
    # its OPTIONS file lists unless a column family's are given: those lack the block
    # cache and the bloom filter (an 8 MB cache, no filters: a restored subtask ran a
    # keyed reduce at a quarter of its rate before the failure)
    db = rocksdict.Rdict(path, opts, column_families={"default": opts})
    # State is recovered from checkpoints, never from the local database: no WAL.
    write = rocksdict.WriteOptions()
    # a property (rocksdict's stub calls it a method)
    write.disable_wal = True  # pyright: ignore[reportAttributeAccessIssue]
    db.set_write_options(write)
    return db


def _return_freed_memory() -> None:
    """Hand memory the C heap freed back to the operating system (glibc's
    ``malloc_trim``; nothing elsewhere). glibc keeps freed blocks for reuse: an emptied
    block cache of 500 MB left the resident size where it was until trimmed (795 MB,
    then 245 MB)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass


def _read_options():
    """Read options for a raw-mode database (0.3.29 takes no ``raw_mode`` argument:
    its iterator bounds are raw bytes; newer releases may ask for it)."""
    import rocksdict

    try:
        return rocksdict.ReadOptions(raw_mode=True)  # pyright: ignore[reportCallIssue]
    except TypeError:
        return rocksdict.ReadOptions()


def _dispose(db: Any, path: str) -> None:
    try:
        db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _no_current_key() -> RuntimeError:
    return RuntimeError("no current key: call DiskKeyedStateBackend.set_current_key() first")


# ---------------------------------------------------------------------------
# State handles: read-modify-write of one serialized value per key and namespace
# ---------------------------------------------------------------------------

class _DiskState:
    __slots__ = ("_b", "_sid", "_name")

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str) -> None:
        self._b = backend
        self._sid = sid
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def _key(self) -> bytes:
        b = self._b
        if b._kg_bytes is None:
            raise _no_current_key()
        return b._kg_bytes + self._sid + b._suffix

    def _get(self) -> Any:
        raw = self._b._get(self._key())
        return None if raw is None else unpack_value(raw)

    def _put(self, value: Any) -> None:
        try:
            raw = pack_value(value)
        except TypeError as exc:  # name the state and the key
            raise TypeError(f"state '{self._name}' of key {self._b.current_key!r}: {exc}") \
                from exc
        self._b._db[self._key()] = raw

    def clear(self) -> None:
        """Remove the value of the current key and namespace."""
        del self._b._db[self._key()]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._name!r})"


class DiskValueState(_DiskState):
    """One value per key and namespace; ``value()`` returns a copy (or ``default``)."""

    __slots__ = ("_default",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 default: Any) -> None:
        super().__init__(backend, sid, name)
        self._default = default

    def _default_value(self) -> Any:
        """The value read when there is none (a fresh copy of a mutable default)."""
        d = self._default
        return unpack_value(pack_value(d)) if type(d) in (list, dict, set, bytearray) else d

    def value(self) -> Any:
        raw = self._b._get(self._key())
        return self._default_value() if raw is None else unpack_value(raw)

    def update(self, value: Any) -> None:
        self._put(value)

    # -- vectorized access (keyed reduce over a batch) -------------------------
    # A batch's keys are encoded once (entry_keys), in RocksDB's order, and then read and
    # written with them.
    def entry_keys(self, keys: list[Any], groups: Sequence[int] | np.ndarray) -> EntryKeys:
        """The stored keys of ``keys`` in key groups ``groups``, for :meth:`values_at` and
        :meth:`update_at`; a key group outside this backend's fails naming the key."""
        return self._b.ordered_entry_keys(self._sid, keys, groups)

    def values_at(self, keys: EntryKeys) -> list[Any]:
        """The values stored at ``keys`` (None where unset), in the caller's order, with
        one multi-get."""
        return unpack_values(self._b._multi_get_ordered(keys))

    def update_at(self, keys: EntryKeys, values: Iterable[Any]) -> None:
        """Store ``values`` (in the caller's order) at ``keys``, in one write batch."""
        self._b._write_ordered(keys, self._pack_all(keys, values))

    def _pack_all(self, keys: EntryKeys, values: Iterable[Any], head: bytes = b"") -> list[bytes]:
        """``head`` and the packed value, of each of ``values``; a value that cannot be
        packed fails naming the state and its key, as :meth:`_put` does."""
        pack, values = value_packer().pack, list(values)
        try:
            return [head + pack(v) for v in values]
        except TypeError:
            pass
        for i, value in enumerate(values):  # only on failure: find which value
            try:
                pack(value)
            except TypeError as exc:
                key = unpack_value(keys.key(i)[KEYED_PREFIX.size:])
                raise TypeError(f"state '{self._name}' of key {key!r}: {exc}") from exc
        raise AssertionError("a value failed to pack once and then packed")


class _DiskMergingState(_DiskState):
    __slots__ = ()

    def _combine(self, a: Any, b: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the values of the current key under ``sources`` into ``target``
        and clear the sources; the current namespace is unchanged."""
        b = self._b
        if b._kg_bytes is None or b._kg is None:  # (both are set with the current key)
            raise _no_current_key()
        merged, found = None, False
        for ns in sources:
            if ns == target:
                continue
            k = b._entry_key(self._sid, b._key, b._kg, ns)
            raw = b._get(k)
            if raw is not None:
                v = unpack_value(raw)
                merged, found = (self._combine(merged, v) if found else v), True
                del b._db[k]
        if not found:
            return
        k = b._entry_key(self._sid, b._key, b._kg, target)
        raw = b._get(k)
        b._db[k] = pack_value(merged if raw is None else self._combine(unpack_value(raw), merged))


class DiskListState(_DiskMergingState):
    """A list per key and namespace; ``get()`` returns a new list."""

    __slots__ = ()

    def get(self) -> list:
        v = self._get()
        return [] if v is None else v

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        values = list(values)
        if values:
            self._put(self.get() + values)

    def update(self, values: Iterable[Any]) -> None:
        values = list(values)
        if values:
            self._put(values)
        else:
            self.clear()

    def _combine(self, a: list, b: list) -> list:
        return a + b


class DiskMapState(_DiskState):
    """A dict per key and namespace, stored as one value (read-modify-write).
    An empty map is never stored."""

    __slots__ = ()

    def _map(self) -> dict:
        v = self._get()
        return {} if v is None else v

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        d = self._map()
        d[key] = value
        self._put(d)

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        if mapping:
            d = self._map()
            d.update(mapping)
            self._put(d)

    def remove(self, key: Any) -> None:
        d = self._map()
        if key in d:
            del d[key]
            self._put(d) if d else self.clear()

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def keys(self) -> list:
        return list(self._map())

    def values(self) -> list:
        return list(self._map().values())

    def items(self) -> list:
        return list(self._map().items())

    def is_empty(self) -> bool:
        return self._b._get(self._key()) is None


class DiskReducingState(_DiskMergingState):
    """One value per key and namespace combined with ``reduce(old, new)``."""

    __slots__ = ("_reduce",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 reduce: Callable[[Any, Any], Any]) -> None:
        super().__init__(backend, sid, name)
        self._reduce = reduce

    def get(self) -> Any:
        return self._get()

    def add(self, value: Any) -> None:
        cur = self._get()
        self._put(value if cur is None else self._reduce(cur, value))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._reduce(a, b)


class DiskAggregatingState(_DiskMergingState):
    """An accumulator per key and namespace driven by an ``AggregateFunction``."""

    __slots__ = ("_agg",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 aggregate: Any) -> None:
        super().__init__(backend, sid, name)
        self._agg = aggregate

    def get(self) -> Any:
        acc = self._get()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        acc = self._get()
        if acc is None:
            acc = self._agg.create_accumulator()
        self._put(self._agg.add(value, acc))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._agg.merge(a, b)


# ---------------------------------------------------------------------------
# State with a time-to-live (see raystream.checkpoint.ttl): the heap backend's
# semantics over the layout described above _ttl_base
# ---------------------------------------------------------------------------

_CLEANUP_EVERY = 16  # accesses per incremental cleanup run (one RocksDB iterator each)


class _TtlCleanup:
    """A state's TTL and the position of its incremental cleanup: the next stored key
    to check (``seek``) in the state's range of key group ``kg``, and how many
    accesses since the cleanup last ran (``accesses``)."""

    __slots__ = ("cfg", "base", "sid", "kg", "seek", "accesses")

    def __init__(self, cfg: StateTtlConfig, base: str, sid: bytes, kg: int) -> None:
        self.cfg = cfg
        self.base = base
        self.sid = sid
        self.kg = kg
        self.seek = group_bound(kg) + sid
        self.accesses = 0


class _DiskTtlState(TtlHandle):
    """Mixin of the TTL handles: the disk's side of :class:`TtlHandle`."""

    __slots__ = ()
    _b: "DiskKeyedStateBackend"
    _t: _TtlCleanup
    _name: str
    _key: Callable[[], bytes]  # the state class's

    def _check_key(self) -> None:
        if self._b._kg_bytes is None:
            raise _no_current_key()

    def _ttl_name(self) -> str:
        return self._name

    def _ttl_cfg(self) -> StateTtlConfig:
        return self._t.cfg


class _DiskTtlSingle(_DiskTtlState, TtlSingle):
    """Value, reducing and aggregating state: ``ts | value`` per key and namespace
    (the stored bytes are the entry; a value is unpacked only when read)."""

    __slots__ = ()

    def _ttl_load(self) -> bytes | None:
        return self._b._get(self._key())

    def _ttl_stamp(self, entry: bytes) -> int:
        return TTL_HEADER.unpack_from(entry)[0]

    def _ttl_value(self, entry: bytes) -> Any:
        return unpack_value(entry[8:])

    def _ttl_drop(self) -> None:
        del self._b._db[self._key()]

    def _ttl_renew(self, entry: bytes, now: int) -> None:
        self._b._db[self._key()] = TTL_HEADER.pack(now) + entry[8:]  # the header only

    def _ttl_write(self, value: Any, now: int) -> None:
        self._b._db[self._key()] = TTL_HEADER.pack(now) + pack_value(value)


class DiskTtlValueState(TtlValueOps, _DiskTtlSingle, DiskValueState):
    """A :class:`DiskValueState` with a TTL."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str, default: Any,
                 ttl: _TtlCleanup) -> None:
        super().__init__(backend, sid, name, default)
        self._t = ttl

    # -- vectorized access: one cleanup step per call, the batch checked with numpy ----
    def values_at(self, keys: EntryKeys) -> list[Any]:
        """The values stored at ``keys`` (None where unset or expired and hidden), with one
        multi-get; expired values are deleted (and renewed ones rewritten) in one batch."""
        b, cfg = self._b, self._t.cfg
        now = b._ttl_now()
        b._cleanup_step(self._t, now)
        raws = b._multi_get_ordered(keys)
        ts = np.frombuffer(b"".join([_NO_EXPIRY if r is None else r[:8] for r in raws]),
                           dtype=">i8")
        expired = is_expired(ts, cfg.ttl_ms, now)  # never an unset key (_NO_EXPIRY)
        if expired.any():
            b._delete_all([keys.key(i) for i in np.flatnonzero(expired).tolist()])
        shown = ts != NEVER_EXPIRES
        if not cfg.return_expired:
            shown &= ~expired
        if cfg.renew_on_read:
            head = TTL_HEADER.pack(now)
            b._write([(keys.key(i), head + raws[i][8:])  # type: ignore[index]
                      for i in np.flatnonzero(shown & ~expired).tolist()])
        return [unpack_value(r[8:]) if show else None  # type: ignore[index]
                for r, show in zip(raws, shown.tolist())]

    def update_at(self, keys: EntryKeys, values: Iterable[Any]) -> None:
        """Store ``values`` at ``keys``, stamped now, in one write batch."""
        b = self._b
        now = b._ttl_now()
        b._cleanup_step(self._t, now)
        b._write_ordered(keys, self._pack_all(keys, values, TTL_HEADER.pack(now)))


class DiskTtlReducingState(TtlReducingOps, _DiskTtlSingle, DiskReducingState):
    """A :class:`DiskReducingState` with a TTL: an expired value counts as unset."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 reduce: Callable[[Any, Any], Any], ttl: _TtlCleanup) -> None:
        super().__init__(backend, sid, name, reduce)
        self._t = ttl


class DiskTtlAggregatingState(TtlAggregatingOps, _DiskTtlSingle, DiskAggregatingState):
    """A :class:`DiskAggregatingState` with a TTL: an expired accumulator counts as unset."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 aggregate: Any, ttl: _TtlCleanup) -> None:
        super().__init__(backend, sid, name, aggregate)
        self._t = ttl


class DiskTtlListState(_DiskTtlState, DiskListState):
    """A :class:`DiskListState` with a TTL: ``min ts | [[element, ts], ...]``, every
    element expires on its own."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 ttl: _TtlCleanup) -> None:
        super().__init__(backend, sid, name)
        self._t = ttl

    def _store(self, entries: list) -> None:
        if entries:
            self._b._db[self._key()] = encode_ttl_list(entries)
        else:
            self.clear()

    def get(self) -> list:
        now = self._tick()
        raw = self._b._get(self._key())
        if raw is None:
            return []
        elements, cfg = unpack_value(raw[8:]), self._t.cfg
        if not cfg.renew_on_read and oldest_live(raw, cfg.ttl_ms, now):
            return [e[0] for e in elements]  # none expired, none to store
        out, stored = read_elements(elements, cfg, now)
        if stored is not None:
            self._store(stored)
        return out

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._tick()
        entries = [[v, now] for v in values]
        if not entries:
            return
        raw = self._b._get(self._key())
        if raw is not None:  # expired elements stay until a read or the cleanup
            entries = unpack_value(raw[8:]) + entries
        self._store(entries)

    def update(self, values: Iterable[Any]) -> None:
        now = self._tick()
        self._store([[v, now] for v in values])


class DiskTtlMapState(TtlMapReads, _DiskTtlState, DiskMapState):
    """A :class:`DiskMapState` with a TTL: ``min ts | {user key: [value, ts]}``, every
    entry expires on its own."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 ttl: _TtlCleanup) -> None:
        super().__init__(backend, sid, name)
        self._t = ttl

    def _stored(self) -> dict:
        raw = self._b._get(self._key())
        return {} if raw is None else unpack_value(raw[8:])

    def _store(self, entries: dict) -> None:
        if entries:
            self._b._db[self._key()] = encode_ttl_map(entries)
        else:
            self.clear()

    def get(self, key: Any, default: Any = None) -> Any:
        now = self._tick()
        d = self._stored()
        v, changed = read_entry(d, key, self._t.cfg, now, default)
        if changed:
            self._store(d)
        return v

    def put(self, key: Any, value: Any) -> None:
        self.put_all({key: value})

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        now = self._tick()
        entries = {k: [v, now] for k, v in dict(mapping).items()}
        if entries:
            d = self._stored()
            d.update(entries)
            self._store(d)

    def remove(self, key: Any) -> None:
        self._tick()
        d = self._stored()
        if key in d:
            del d[key]
            self._store(d)

    def contains(self, key: Any) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def _entries(self) -> list[tuple[Any, Any]]:
        """``(user key, value)`` of the entries a read sees; deletes expired ones and
        renews the others when reads renew."""
        now = self._tick()
        d = self._stored()
        out, changed = read_entries(d, self._t.cfg, now)
        if changed:
            self._store(d)
        return out


# ---------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------

class DiskStateSnapshot:
    """The asynchronous part of a disk keyed-state snapshot: call it once, on any
    thread, for ``{key_group: section}`` as of :meth:`DiskKeyedStateBackend.snapshot`.

    It holds a RocksDB iterator over the backend's key range, created in the
    synchronous part: a RocksDB iterator reads the database as of its creation
    (it pins that sequence number, memtables and SST files), so the scan here
    sees none of the writes processing makes meanwhile. (rocksdict 0.3.29's
    ``Snapshot`` objects apply the snapshot to point gets only, not to their
    iterators, so they are not used.) :meth:`release` drops the iterator
    without running."""

    def __init__(self, backend: "DiskKeyedStateBackend", entries: Iterator[tuple[bytes, bytes]],
                 read_options: Any, directory: list[list],
                 expiry: dict[bytes, tuple[str, int, int]] | None = None) -> None:
        self._entries: Iterator[tuple[bytes, bytes]] | None = entries
        # state id -> (plain kind, ttl_ms, now) of the states with a TTL: what has
        # expired at the synchronous part is left out
        self._expiry = expiry or {}
        self._read_options = read_options  # must outlive the iterator (its bounds)
        self._directory = pack_value(directory)  # packed here, on the processing thread
        self._max_parallelism = backend.max_parallelism
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._entries is None

    def release(self) -> None:
        with self._lock:
            self._entries = None

    def __call__(self) -> dict[int, bytes]:
        with self._lock:
            entries, self._entries = self._entries, None
        if entries is None:
            raise RuntimeError("disk state snapshot was already run or released")
        directory = self._directory
        out: dict[int, bytes] = {}
        parts: list[bytes] = []
        current = None  # key group prefix of ``parts``

        def close_section() -> None:
            if current is None:
                raise RuntimeError("no section of the disk state snapshot is open")
            kg = state_id_of(current)
            out[kg] = b"".join([
                Envelope.current(SectionKind.DISK_STATE, max_parallelism=self._max_parallelism,
                                 key_group=kg).pack(),
                SECTION_LENGTH.pack(len(directory)), directory, *parts])

        expiry = self._expiry
        try:
            append = parts.append
            for k, v in entries:  # in key order: key group by key group
                if expiry:
                    ttl = expiry.get(k[2:4])
                    if ttl is not None:
                        live = unexpired(ttl[0], v, ttl[1], ttl[2])
                        if live is None:
                            continue
                        v = live
                group = k[:2]
                if group != current:
                    if parts:
                        close_section()
                        parts.clear()
                    current = group
                append(k[2:4])
                append(SECTION_LENGTH.pack(len(k) - 4))
                append(k[4:])
                append(SECTION_LENGTH.pack(len(v)))
                append(v)
            if parts:
                close_section()
        finally:
            del entries  # releases the iterator and what it pinned
        return out


def record_kind(prefix: str, fields: Iterable[tuple[str, np.dtype]]) -> str:
    """A state kind that carries the fields of its values' fixed-width numpy records, so
    a restored job decodes them before any record arrives (:func:`record_fields`).

    >>> kind = record_kind("panes", [("n", np.dtype("<i8"))])
    >>> kind, record_fields("panes", kind)
    ('panes [["n", "<i8"]]', [('n', dtype('int64'))])
    """
    return f"{prefix} {json.dumps([[name, np.dtype(dtype).str] for name, dtype in fields])}"


def record_fields(prefix: str, kind: str) -> list[tuple[str, np.dtype]]:
    """The record fields a :func:`record_kind` carries."""
    return [(name, np.dtype(dtype)) for name, dtype in json.loads(kind[len(prefix) + 1:])]


def partials_record(prefix: str, partials: Mapping[str, Any], *, where: str,
                    first: Sequence[tuple[str, str]] = (), last: Sequence[tuple[str, str]] = ()
                    ) -> tuple[np.dtype, str]:
    """A window layout's value record, its fields ``first``, the partial columns of dtypes
    ``partials`` and its fields ``last``, all little-endian, and the :func:`record_kind`
    of ``prefix`` that carries it; ``where`` (the operator) names partials that are not
    fixed-width (objects).

    >>> import numpy as np
    >>> record, kind = partials_record("panes", {"n": np.dtype(">i4")}, where="w",
    ...                                last=[("__kid", "<i8")])
    >>> record.descr, kind
    ([('n', '<i4'), ('__kid', '<i8')], 'panes [["n", "<i4"], ["__kid", "<i8"]]')
    """
    record = np.dtype([*first, *((n, np.dtype(d).newbyteorder("<")) for n, d in partials.items()),
                       *last])
    if record.hasobject:
        raise ValueError(f"{where}: partials of type "
                         f"{', '.join(str(np.dtype(d)) for d in partials.values())} cannot be "
                         f"kept in the disk state backend (fixed-width numeric partials only); "
                         f"run this job with CheckpointConfig(state_backend='heap')")
    return record, record_kind(prefix, [(n, record[n]) for n in record.names or ()])


# ---------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------

class DiskKeyedStateBackend:
    """Keyed state of one operator instance in RocksDB, for the key groups ``key_groups``.

    Same protocol as :class:`~raystream.checkpoint.heap_backend.HeapKeyedStateBackend`
    (see the module docstring for the layout, serialization and snapshots).
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
        _remove_stale(parent)
        self.path = os.path.join(parent, f"raystream-state-{os.getpid()}-{uuid.uuid4().hex}")
        import rocksdict

        # one block cache for this backend's database, the adopted one of a restore too
        self._cache = rocksdict.Cache(self.options.block_cache_bytes)
        self._db = _open_db(self.path, self.options, self._cache)
        self._finalizer = weakref.finalize(self, _dispose, self._db, self.path)
        self._states: dict[str, tuple[bytes, str]] = {}  # name -> (state id bytes, kind)
        self._ttl_now = ttl_time_provider  # the processing-time clock of state TTLs
        self._ttls: dict[str, _TtlCleanup] = {}  # states declared with a TTL
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
        _return_freed_memory()

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
                 ) -> tuple[bytes, _TtlCleanup | None]:
        """The state id of ``name`` and, for a state with a TTL, its cleanup record."""
        sid = self._sid(name, ttl_kind(kind, name, ttl))
        if ttl is None:
            return sid, None
        t = self._ttls.get(name)
        if t is None:
            t = self._ttls[name] = _TtlCleanup(ttl, kind, sid, self.key_groups.start)
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

    def _cleanup_step(self, t: _TtlCleanup, now: int) -> None:
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
        read = _read_options()
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
        self._db = _open_db(self.path, self.options, self._cache)
        self._finalizer = weakref.finalize(self, _dispose, self._db, self.path)
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
            other = _open_db(temp, DiskStateOptions(memory_mb=8))
            try:
                read = _read_options()
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
        read = _read_options()
        read.set_iterate_upper_bound(upper_bound)
        return read

    @staticmethod
    def decode_key(data: bytes) -> Any:
        """The key :func:`encode_key` encoded as ``data``."""
        return unpack_value(data)
