"""Disk keyed state backend: keyed state in an embedded RocksDB per operator instance.

Flink's ``EmbeddedRocksDBStateBackend``, in Python: selected per job with
``rs.CheckpointConfig(state_backend="disk")`` (or ``state_backend=DiskStateOptions(...)``
to set its memory budget), it keeps keyed state of keyed process functions and
keyed reduce off the Python heap, so state may outgrow memory.

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

Every entry's key is::

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
``[[state id, name, kind], ...]``; then entries ``state id (uint16) | len
(uint32) | key suffix | len (uint32) | value``, the suffix and value exactly as
stored (no re-serialization).
Either backend restores the other's sections, so a job switches backends by
restoring a savepoint with the other ``state_backend``.

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
import pickle
import shutil
import struct
import tempfile
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, cast

import msgpack
import numpy as np

from raystream.checkpoint.disk_incremental import IncrementalSnapshot, RestoredDb, UploadTracker
from raystream.checkpoint.envelope import KEYED_STATE, Envelope, SectionKind, is_keyed_state, read
from raystream.checkpoint.keygroups import check_key_group_range, key_group_of

__all__ = ["DiskKeyedStateBackend", "DiskStateOptions", "DiskStateSnapshot", "section_entries"]

_U16 = struct.Struct(">H")
_PREFIX = struct.Struct(">HH")  # key group, state id
_U32 = struct.Struct(">I")
_PREFIX_LEN = struct.Struct(">HHI")  # key group, state id, key length
_MAX_KEY_GROUPS = 1 << 15  # key group + 1 must fit the uint16 prefix (upper scan bound)

_VALUE, _LIST, _MAP, _REDUCING, _AGGREGATING = "value", "list", "map", "reducing", "aggregating"

_EXT_TUPLE = 1
_EXT_PICKLE = 2


# ---------------------------------------------------------------------------
# Serialization: MessagePack, pickle only for opaque objects
# ---------------------------------------------------------------------------

def _default(obj: Any) -> msgpack.ExtType:
    if type(obj) is tuple:  # a fresh packer: this runs inside the thread's packer
        return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(
            list(obj), default=_default, strict_types=True, use_bin_type=True))
    return msgpack.ExtType(_EXT_PICKLE, pickle.dumps(obj, protocol=5))


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(_unpack(data))
    if code == _EXT_PICKLE:
        return pickle.loads(data)
    return msgpack.ExtType(code, data)


_local = threading.local()  # one reusable packer per thread (msgpack.packb builds one per call)


def _pack(obj: Any) -> bytes:
    try:
        packer = _local.packer
    except AttributeError:
        # strict_types: subclasses (IntEnum, OrderedDict, np.float64) are opaque, keep their type
        packer = _local.packer = msgpack.Packer(default=_default, strict_types=True,
                                                use_bin_type=True)
    return packer.pack(obj)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def _canonical_key(key: Any) -> Any:
    if isinstance(key, np.generic):
        return key.item()
    if type(key) is tuple:
        return tuple(_canonical_key(k) for k in key)
    return key


def encode_key(key: Any) -> bytes:
    """Canonical bytes of a key (equal keys, equal bytes).

    >>> import numpy as np
    >>> encode_key(7) == encode_key(np.int64(7))
    True
    """
    t = type(key)
    if t is int or t is str or t is bytes or t is float:  # the common keys: nothing to convert
        return _pack(key)
    return _pack(_canonical_key(key))


# ---------------------------------------------------------------------------
# Options and the database
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DiskStateOptions:
    """The disk backend with its settings, for ``CheckpointConfig(state_backend=...)``.

    Args:
        memory_mb: memory RocksDB may use per operator instance (subtask):
            two thirds block cache, one third write buffers (two memtables).
        local_dir: where each instance creates its database directory (the
            system temp dir if None); a local disk, not checkpoint storage.
        incremental: checkpoints upload only the RocksDB files that are new since
            the previous completed checkpoint (:mod:`raystream.checkpoint.disk_incremental`);
            savepoints stay full. Off by default: a restore then reads more files,
            and the job's storage holds files shared between checkpoints.

    >>> DiskStateOptions(memory_mb=128).block_cache_bytes
    89478485
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
        return self.memory_mb * (1 << 20) * 2 // 3

    @property
    def write_buffer_bytes(self) -> int:
        """Size of one memtable (two may exist at once)."""
        return self.memory_mb * (1 << 20) // 6


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


def _open_db(path: str, options: DiskStateOptions):
    import rocksdict

    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(rocksdict.Cache(options.block_cache_bytes))
    table.set_cache_index_and_filter_blocks(True)  # counted in the budget
    table.set_bloom_filter(10, False)  # point gets dominate
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_size(options.write_buffer_bytes)
    opts.set_max_write_buffer_number(2)
    opts.set_db_write_buffer_size(options.write_buffer_bytes * 2)
    opts.set_max_background_jobs(2)
    # Keys are hashed, so every flush (one per incremental checkpoint) is an L0 file over
    # the whole key range, and each L0->L1 compaction rewrites all of L1, which the next
    # checkpoint uploads again: gather 16 L0 files rather than RocksDB's 4 first (a third
    # of the bytes uploaded, bench/large_state.py; point gets stay cheap: bloom filters)
    opts.set_level_zero_file_num_compaction_trigger(16)
    opts.set_level_zero_slowdown_writes_trigger(32)
    opts.set_level_zero_stop_writes_trigger(48)
    db = rocksdict.Rdict(path, opts)
    # State is recovered from checkpoints, never from the local database: no WAL.
    write = rocksdict.WriteOptions()
    # a property (rocksdict's stub calls it a method)
    write.disable_wal = True  # pyright: ignore[reportAttributeAccessIssue]
    db.set_write_options(write)
    return db


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
        return None if raw is None else _unpack(raw)

    def _put(self, value: Any) -> None:
        self._b._db[self._key()] = _pack(value)

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

    def value(self) -> Any:
        raw = self._b._get(self._key())
        if raw is None:
            d = self._default
            return _unpack(_pack(d)) if type(d) in (list, dict, set, bytearray) else d
        return _unpack(raw)

    def update(self, value: Any) -> None:
        self._put(value)

    # -- vectorized access (keyed reduce over a batch) -------------------------
    def values_of(self, keys_and_groups: Iterable[tuple[Any, int]]) -> list[Any]:
        """The values of many keys (None where unset), with one multi-get."""
        b = self._b
        pairs = list(keys_and_groups)
        groups = b.key_groups
        for k, g in pairs:
            if g not in groups:
                raise ValueError(f"key {k!r} is in key group {g}, outside this backend's key "
                                 f"groups {groups.start}..{groups.stop - 1}")
        raws = b._multi_get([b._entry_key(self._sid, k, g) for k, g in pairs])
        return [None if raw is None else _unpack(raw) for raw in raws]

    def update_all(self, items: Iterable[tuple[tuple[Any, int], Any]]) -> None:
        """Set the values of many ``(key, key group)`` at once, in one write batch."""
        b = self._b
        b._write([(b._entry_key(self._sid, k, g), _pack(v)) for (k, g), v in items])


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
                v = _unpack(raw)
                merged, found = (self._combine(merged, v) if found else v), True
                del b._db[k]
        if not found:
            return
        k = b._entry_key(self._sid, b._key, b._kg, target)
        raw = b._get(k)
        b._db[k] = _pack(merged if raw is None else self._combine(_unpack(raw), merged))


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
                 read_options: Any, directory: list[list]) -> None:
        self._entries: Iterator[tuple[bytes, bytes]] | None = entries
        self._read_options = read_options  # must outlive the iterator (its bounds)
        self._directory = _pack(directory)  # packed here, on the processing thread
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
            kg = _U16.unpack(current)[0]
            out[kg] = b"".join([
                Envelope.current(SectionKind.DISK_STATE, max_parallelism=self._max_parallelism,
                                 key_group=kg).pack(),
                _U32.pack(len(directory)), directory, *parts])

        try:
            append = parts.append
            for k, v in entries:  # in key order: key group by key group
                group = k[:2]
                if group != current:
                    if parts:
                        close_section()
                        parts.clear()
                    current = group
                append(k[2:4])
                append(_U32.pack(len(k) - 4))
                append(k[4:])
                append(_U32.pack(len(v)))
                append(v)
            if parts:
                close_section()
        finally:
            del entries  # releases the iterator and what it pinned
        return out


def _parse_body(kg: int, body: memoryview
                ) -> tuple[dict[bytes, tuple[str, str]], list[tuple[bytes, bytes, bytes]]]:
    """Split the body of a disk section (after its envelope): ``{state id: (name, kind)}``
    and ``[(state id, key suffix, value), ...]``, all still serialized."""
    if len(body) < _U32.size:
        raise ValueError(f"key group {kg}: disk keyed-state section truncated before its "
                         f"directory")
    data = bytes(body)
    pos = 0
    (n,) = _U32.unpack_from(data, pos)
    pos += 4
    directory = {_U16.pack(sid): (name, kind) for sid, name, kind in _unpack(data[pos:pos + n])}
    pos += n
    entries = []
    end = len(data)
    while pos < end:
        sid = data[pos:pos + 2]
        (n,) = _U32.unpack_from(data, pos + 2)
        pos += 6
        suffix = data[pos:pos + n]
        pos += n
        (n,) = _U32.unpack_from(data, pos)
        pos += 4
        entries.append((sid, suffix, data[pos:pos + n]))
        pos += n
    return directory, entries


def section_entries(kg: int, body: memoryview) -> Iterator[tuple[str, str, Any, Any, Any]]:
    """``(state name, kind, key, namespace, value)`` of every entry of a disk section's
    body (after its envelope, which the caller checked), deserialized: how the heap
    backend restores a disk backend's savepoint."""
    directory, entries = _parse_body(kg, body)
    for sid, suffix, value in entries:
        name, kind = directory[sid]
        (n,) = _U32.unpack_from(suffix, 0)
        ns = suffix[4 + n:]
        yield name, kind, _unpack(suffix[4:4 + n]), (_unpack(ns) if ns else None), _unpack(value)


# ---------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------

class DiskKeyedStateBackend:
    """Keyed state of one operator instance in RocksDB, for the key groups ``key_groups``.

    Same protocol as :class:`~raystream.checkpoint.state.HeapKeyedStateBackend`
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
                 options: DiskStateOptions | None = None) -> None:
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
        self._db = _open_db(self.path, self.options)
        self._finalizer = weakref.finalize(self, _dispose, self._db, self.path)
        self._states: dict[str, tuple[bytes, str]] = {}  # name -> (state id bytes, kind)
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

    def _write(self, pairs: list[tuple[bytes, bytes]]) -> None:
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for k, v in pairs:
            batch.put(k, v)
        self._db.write(batch)

    def _entry_key(self, sid: bytes, key: Any, key_group: int, namespace: Any = None) -> bytes:
        kb = encode_key(key)
        if namespace is None:
            return _PREFIX_LEN.pack(key_group, _U16.unpack(sid)[0], len(kb)) + kb
        return _PREFIX_LEN.pack(key_group, _U16.unpack(sid)[0], len(kb)) + kb + _pack(namespace)

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
        self._kg_bytes = _U16.pack(key_group)
        self._key_bytes = _U32.pack(len(kb)) + kb
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
        self._ns_bytes = b"" if namespace is None else _pack(namespace)
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
            entry = self._states[name] = (_U16.pack(len(self._states)), kind)
        elif entry[1] != kind:
            raise ValueError(f"state {name!r} is {entry[1]} state, not {kind} state")
        return entry[0]

    @staticmethod
    def _no_ttl(name: str, ttl: Any) -> None:
        if ttl is not None:
            raise ValueError(
                f"state {name!r} has a TTL ({ttl}), which the disk state backend does not "
                f"support yet: run this job with CheckpointConfig(state_backend='heap'), or "
                f"create the state without ttl=")

    def value_state(self, name: str, default: Any = None, *, ttl: Any = None) -> DiskValueState:
        self._no_ttl(name, ttl)
        return DiskValueState(self, self._sid(name, _VALUE), name, default)

    def list_state(self, name: str, *, ttl: Any = None) -> DiskListState:
        self._no_ttl(name, ttl)
        return DiskListState(self, self._sid(name, _LIST), name)

    def map_state(self, name: str, *, ttl: Any = None) -> DiskMapState:
        self._no_ttl(name, ttl)
        return DiskMapState(self, self._sid(name, _MAP), name)

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any], *,
                       ttl: Any = None) -> DiskReducingState:
        self._no_ttl(name, ttl)
        return DiskReducingState(self, self._sid(name, _REDUCING), name, reduce)

    def aggregating_state(self, name: str, aggregate: Any, *,
                          ttl: Any = None) -> DiskAggregatingState:
        self._no_ttl(name, ttl)
        return DiskAggregatingState(self, self._sid(name, _AGGREGATING), name, aggregate)

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
        keys = cast(Iterator[bytes], self._db.keys(from_key=_U16.pack(self.key_groups.start),
                                                   read_opt=read))
        return self._iter_keys(entry[0], keys, read)

    def _bounded(self):
        """Read options bounded to this backend's key groups. Keep them referenced as
        long as an iterator made with them (rocksdict 0.3.29 does not, and an
        iterator whose options were freed loses its bound)."""
        read = _read_options()
        read.set_iterate_upper_bound(_U16.pack(self.key_groups.stop))
        return read

    @staticmethod
    def _iter_keys(sid: bytes, keys: Iterator[bytes], _read: Any) -> Iterator[Any]:
        last = None
        for k in keys:
            if k[2:4] != sid:
                continue
            (n,) = _U32.unpack_from(k, 4)
            kb = k[:2] + k[8:8 + n]  # namespaces of one key are adjacent within its group
            if kb != last:
                last = kb
                yield _unpack(kb[2:])

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
                       self._db.items(from_key=_U16.pack(self.key_groups.start), read_opt=read))
        full = DiskStateSnapshot(self, entries, read, directory)
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
        return [[_U16.unpack(sid)[0], name, kind] for name, (sid, kind) in self._states.items()]

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
        self._db = _open_db(self.path, self.options)
        self._finalizer = weakref.finalize(self, _dispose, self._db, self.path)
        get = getattr(self._db, "get", None)
        self._get = get if get is not None else self._get_or_none
        self._states = {name: (_U16.pack(sid), kind) for sid, name, kind in db.manifest.states}
        theirs = db.manifest.key_groups
        if theirs.start < self.key_groups.start:
            self._db.delete_range(_U16.pack(theirs.start), _U16.pack(self.key_groups.start))
        if theirs.stop > self.key_groups.stop:
            self._db.delete_range(_U16.pack(self.key_groups.stop), _U16.pack(theirs.stop))
        if db.reusable and theirs == self.key_groups:  # the job's own files, all ours
            self._uploads.restored(db.shared_files())

    def _copy_from(self, db: RestoredDb, batch_bytes: int = 4 << 20) -> None:
        """Copy the entries of this backend's key groups from ``db`` (state ids renamed
        to this backend's)."""
        import rocksdict

        sids = {_U16.pack(sid): self._sid(name, kind) for sid, name, kind in db.manifest.states}
        temp = f"{self.path}.restore{uuid.uuid4().hex}"
        try:
            db.download(temp)
            other = _open_db(temp, DiskStateOptions(memory_mb=8))
            try:
                read = _read_options()
                read.set_iterate_upper_bound(_U16.pack(min(self.key_groups.stop,
                                                           db.manifest.key_groups.stop)))
                start = max(self.key_groups.start, db.manifest.key_groups.start)
                items = cast(Iterator[tuple[bytes, bytes]],
                             other.items(from_key=_U16.pack(start), read_opt=read))
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
        if kg in self._restored:
            raise ValueError(f"key group {kg} restored twice")
        if envelope.kind is SectionKind.HEAP_STATE:  # a job switching backends
            self._restore_heap_section(kg, data)
        else:
            directory, entries = _parse_body(kg, body)
            sids = {sid: self._sid(name, kind) for sid, (name, kind) in directory.items()}
            kgb = _U16.pack(kg)
            self._write([(kgb + sids[sid] + suffix, value) for sid, suffix, value in entries])
        self._restored.add(kg)

    def _restore_heap_section(self, kg: int, section: bytes) -> None:
        """A section the heap backend wrote (a job switching backends through a savepoint)."""
        from raystream.checkpoint.state import HeapKeyedStateBackend, _Namespaced

        heap = HeapKeyedStateBackend(max_parallelism=self.max_parallelism,
                                     key_groups=range(kg, kg + 1))
        heap.restore([(kg, section)])
        kgb = _U16.pack(kg)
        pairs = []
        for name, table in heap._tables.items():
            sid = self._sid(name, table.kind)
            for kk, value in table.kgs[0].m.items():
                key, ns = (kk.key, kk.namespace) if type(kk) is _Namespaced else (kk, None)
                kb = encode_key(key)
                pairs.append((kgb + sid + _U32.pack(len(kb)) + kb
                              + (b"" if ns is None else _pack(ns)), _pack(value)))
        self._write(pairs)

    def __repr__(self) -> str:
        return (f"DiskKeyedStateBackend(max_parallelism={self.max_parallelism}, "
                f"key_groups={self.key_groups!r}, states={list(self._states)})")
