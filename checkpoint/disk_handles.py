"""The disk keyed state backend's state handles: value, list, map, reducing and
aggregating state, and their variants with a TTL.

A handle reads, modifies and writes one serialized value per key and namespace in the
backend's RocksDB (:mod:`raystream.checkpoint.disk_state`, which creates the handles
and keeps the current key). Values are MessagePack (:mod:`raystream.checkpoint.disk_layout`:
ints, floats, strings, bytes, booleans, None, lists and dicts of those, tuples through an
extension type); only an opaque user object (a ``datetime``, a dataclass, a numpy
scalar...) is pickled, inside an extension type, and such bytes are only ever read back
from this job's own local database or checkpoint storage.

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
turn, wrapping around, :class:`TtlCleanup`; the backend runs it every 16 accesses for
their share, as creating a RocksDB iterator costs more than checking a few values; the
batch reads and writes of keyed reduce, ``values_at`` and ``update_at``, count as one
access and check their batch's headers with numpy); full snapshots and savepoints
leave expired values out (as of their synchronous part,
:mod:`raystream.checkpoint.disk_snapshot`).

Flink drops expired values while RocksDB compacts, through a C++ compaction
filter (``FlinkCompactionFilter``); ``rocksdict`` has none. Here TTL goes
through compaction the other way round: expired values are deleted by the
reads and the cleanup above, and the database is opened with a
compact-on-deletion collector (:mod:`raystream.checkpoint.disk_db`), so SST files that
fill with those tombstones are compacted and the space is reclaimed. An incremental
checkpoint uploads SST files as they are, so it may hold values that had expired but
were not deleted yet: a restored job hides them on read (their timestamps came with
them) and the cleanup deletes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from raystream.checkpoint.disk_layout import (KEYED_PREFIX, group_bound, pack_value,
                                             unpack_value, unpack_values, value_packer)
from raystream.checkpoint.disk_sections import (NEVER_EXPIRES, TTL_HEADER, encode_ttl_list,
                                               encode_ttl_map, oldest_live)
from raystream.checkpoint.entry_keys import EntryKeys
from raystream.checkpoint.ttl import (StateTtlConfig, TtlAggregatingOps, TtlHandle, TtlMapReads,
                                      TtlReducingOps, TtlSingle, TtlValueOps, is_expired,
                                      read_elements, read_entries, read_entry)

if TYPE_CHECKING:  # (the backend creates these handles)
    from raystream.checkpoint.disk_state import DiskKeyedStateBackend

__all__ = ["DiskAggregatingState", "DiskListState", "DiskMapState", "DiskReducingState",
           "DiskTtlAggregatingState", "DiskTtlListState", "DiskTtlMapState",
           "DiskTtlReducingState", "DiskTtlValueState", "DiskValueState", "TtlCleanup"]

_NO_EXPIRY = TTL_HEADER.pack(NEVER_EXPIRES)  # the header values_at reads for an unset key
_MISSING: Any = object()


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
# semantics over the layout of the module docstring
# ---------------------------------------------------------------------------

class TtlCleanup:
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
    _t: TtlCleanup
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
                 ttl: TtlCleanup) -> None:
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
                 reduce: Callable[[Any, Any], Any], ttl: TtlCleanup) -> None:
        super().__init__(backend, sid, name, reduce)
        self._t = ttl


class DiskTtlAggregatingState(TtlAggregatingOps, _DiskTtlSingle, DiskAggregatingState):
    """A :class:`DiskAggregatingState` with a TTL: an expired accumulator counts as unset."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 aggregate: Any, ttl: TtlCleanup) -> None:
        super().__init__(backend, sid, name, aggregate)
        self._t = ttl


class DiskTtlListState(_DiskTtlState, DiskListState):
    """A :class:`DiskListState` with a TTL: ``min ts | [[element, ts], ...]``, every
    element expires on its own."""

    __slots__ = ("_t",)

    def __init__(self, backend: "DiskKeyedStateBackend", sid: bytes, name: str,
                 ttl: TtlCleanup) -> None:
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
                 ttl: TtlCleanup) -> None:
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
