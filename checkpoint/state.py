"""Heap keyed state backend: state per (key, namespace), partitioned by key group.

Flink's ``HeapKeyedStateBackend`` + ``CopyOnWriteStateMap``, in Python. A
subtask owns a contiguous range of key groups; every state name has one plain
``dict`` per key group, mapping the entry key (the plain key in the None
namespace, ``_Namespaced(key, namespace)`` otherwise) directly to the value
(no per-entry wrapper objects: fewer allocations, less work for the cyclic GC,
and a key group's section is pickled straight from its dicts, in C).
Snapshots are taken per key group, so a job restores at another parallelism
by handing every subtask the sections of its range.

Snapshots and versioned copy-on-write
-------------------------------------
:meth:`HeapKeyedStateBackend.snapshot` is the *synchronous* part of a checkpoint.
It costs O(state names x key groups) reference copies, independent of the
number of keys: it records the backend's current *version* ``s``, bumps it to
``s + 1`` and keeps references to the per-key-group dicts. It returns a
:class:`StateSnapshot`, the *asynchronous* part: a callable that pickles those
dicts, one section per non-empty key group, typically on a background thread
while records keep flowing. While any snapshot is in progress the processing
thread never mutates an object a snapshot can reach:

* Every per-key-group dict (a *map*) is stamped with the version it was
  created at. Snapshot ``s`` captures exactly the maps current at that moment,
  all stamped ``<= s``. The first change (insert, delete, replace) to a map
  stamped ``<=`` the newest in-progress snapshot ``ma`` first replaces it by a
  shallow copy stamped with the current version: at most one O(keys in that
  key group) copy per key group, state and snapshot, on the processing thread.
* Values are copied on first *access* (read or write) while a snapshot may
  reach them, like Flink's entry versions: such a value is replaced by a deep
  copy (``copy.deepcopy``; lists, sets and dicts of immutable scalars are
  copied shallowly, which is equivalent) before it is returned or changed. So
  user code may mutate a value returned by :meth:`ValueState.value` in place
  without tearing a snapshot. Immutable values (numbers, strings, bytes, None,
  dates, tuples/frozensets of those) are never copied.
* Instead of a version per entry, a map records which keys were given a new
  object since the map was copied (``fresh``) and a *floor*: the lowest
  snapshot version that may still reach its other (inherited) objects. A value
  is reachable by a snapshot iff the map itself is stamped ``<= ma``, or
  ``floor <= ma`` and its key is not in ``fresh``. On a copy the floor becomes
  the old map's stamp, or the old floor if that may still be reached; any new
  snapshot captures the map (stamp ``<= s``), forcing another copy before the
  next change. This is exactly as safe as per-entry versions, just
  conservative when snapshots overlap.

When the asynchronous part finishes (or fails, or :meth:`StateSnapshot.release`
is called, or the :class:`StateSnapshot` is garbage-collected unrun), the
snapshot is released; with none in progress, state is changed in place with
no copying at all. Any number of snapshots may be in progress at once.

Threading contract: all state access, :meth:`~HeapKeyedStateBackend.snapshot` and
:meth:`~HeapKeyedStateBackend.restore` happen on one thread (the subtask's
processing thread); only a :class:`StateSnapshot` may run on another thread,
concurrently with processing. The processing thread never waits for
serialization (it may wait, GIL-wise, for the pickling of one chunk of a key
group, a single C call). :meth:`~HeapKeyedStateBackend.restore` pauses the cyclic
GC while it runs (unpickling many containers otherwise triggers repeated full
collections).

Ownership contract (as in Flink's heap backend): a value handed to state
(``update``, ``add``, ``put``...) is owned by the state from then on, and a
mutable value read from state is the live state value, valid for the current
record: mutating it in place changes the state. Do not keep such references
across records (a snapshot may be taken in between) and do not mutate an
object after handing it to state except through a fresh read.

State TTL
---------
A state created with ``ttl=StateTtlConfig(...)`` (see :mod:`raystream.checkpoint.ttl`)
stores ``(value, timestamp)`` per value, per list element and per map entry,
stamped by the backend's ``ttl_time_provider`` (the wall clock in ms unless
injected). Its handles hide and remove expired values on access and check a few
more stored entries of the state per access (an incremental cleanup cursor over
all its key groups); a snapshot leaves out what has expired at its synchronous
part (filtered in the asynchronous part, over maps no one changes any more). Its
kind in the section directory carries a ``+ttl`` suffix.

Section format
--------------
The envelope of :mod:`raystream.checkpoint.envelope` (magic ``b"RSKS"``, format
version, key-group hash version, max_parallelism, key group); then consecutive
pickles (protocol 5): a directory ``[(state name, kind, number of chunks),
...]``, then every state's ``{entry key: value}`` in chunks of at most
:data:`CHUNK_ENTRIES` entries (each pickled in one C call holding the GIL, so
chunks bound how long the serializer can stall the processing thread,
however large a key group). Restore checks the envelope, and also takes the
disk backend's sections (see :mod:`raystream.checkpoint.disk_state`), so a job
may switch backends through a savepoint. The bytes are only ever read back by
the same job's restore.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import fractions
import gc
import io
import itertools
import pickle
import threading
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, cast

import numpy as np

from raystream.checkpoint.disk_sections import section_entries
from raystream.checkpoint.envelope import KEYED_STATE, Envelope, SectionKind, is_keyed_state, read
from raystream.checkpoint.heap_changelog import (Chain, ChainTracker, ChangeLog, Changes,
                                                 HeapIncrementalSnapshot, HeapStateOptions)
from raystream.checkpoint.keygroups import check_key_group_range, key_group_of
from raystream.checkpoint.ttl import TTL_KIND_SUFFIX as _TTL_SUFFIX
from raystream.checkpoint.ttl import (StateTtlConfig, TtlAggregatingOps, TtlHandle, TtlMapReads,
                                      TtlReducingOps, TtlSingle, TtlTimeProvider, TtlValueOps,
                                      check_state_kind, is_expired, live_elements, live_entries,
                                      read_elements, read_entries, read_entry, ttl_kind,
                                      wall_clock_ms)

__all__ = [
    "CHUNK_ENTRIES",
    "AggregateFunction",
    "AggregatingState",
    "HeapKeyedStateBackend",
    "ListState",
    "MapState",
    "ReducingState",
    "StateSnapshot",
    "ValueState",
]

CHUNK_ENTRIES = 8192

_VALUE, _LIST, _MAP, _REDUCING, _AGGREGATING = "value", "list", "map", "reducing", "aggregating"

# Types whose instances cannot be mutated in place: never copied.
_ATOMIC = frozenset({
    int, float, complex, bool, str, bytes, type(None), range,
    decimal.Decimal, fractions.Fraction, uuid.UUID,
    datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone,
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.datetime64, np.timedelta64,
})

_MISSING: Any = object()
_NEVER = float("inf")  # floor of a map that inherited no objects


class _Removed:
    """The change recorded for an entry removed since the last snapshot."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<removed>"


_REMOVED = _Removed()


class _Untracked(dict):
    """The changes of a map while incremental checkpoints are off: records nothing."""

    __slots__ = ()

    def __setitem__(self, _key: Any, _value: Any) -> None:
        pass


_UNTRACKED: dict = _Untracked()


@dataclass(frozen=True, slots=True)
class _Namespaced:  # its name is in every heap checkpoint that pickled one: never rename it
    """Entry key of a value under a namespace other than None (a window, say).

    Entries of the None namespace -- all state outside windows -- are keyed by
    the plain key: a snapshot then pickles millions of plain keys instead of
    ``(key, None)`` tuples, about ten times faster. This class never equals a
    user's key (not even a tuple), so the two kinds cannot collide.
    """

    key: Any
    namespace: Any


def _entry_key(key: Any, namespace: Any) -> Any:
    return key if namespace is None else _Namespaced(key, namespace)


def _key_of(entry_key: Any) -> Any:
    return entry_key.key if type(entry_key) is _Namespaced else entry_key


def key_and_namespace(entry_key: Any) -> tuple[Any, Any]:
    """The key and the namespace of an entry of the heap backend's maps."""
    if type(entry_key) is _Namespaced:
        return entry_key.key, entry_key.namespace
    return entry_key, None


def _immutable(v: Any) -> bool:
    t = type(v)
    if t in _ATOMIC:
        return True
    if t is tuple or t is frozenset:
        return all(map(_immutable, v))
    return False


def _all_immutable(values: Iterable[Any]) -> bool:
    return _ATOMIC.issuperset(map(type, values)) or all(map(_immutable, values))


def _cow_copy(v: Any) -> Any:
    """A copy of ``v`` sharing no mutable object with it (``copy.deepcopy``,
    with a shallow fast path for lists/sets/dicts of immutable values)."""
    t = type(v)
    if t in _ATOMIC:
        return v
    if t is list or t is set:
        if _all_immutable(v):
            return v.copy()
    elif t is dict:
        if _all_immutable(v.values()) and _all_immutable(v):
            return v.copy()
    return copy.deepcopy(v)


class AggregateFunction(Protocol):
    """Flink's ``AggregateFunction``: ``add`` and ``merge`` may mutate and return
    the accumulator they are given."""

    def create_accumulator(self) -> Any: ...

    def add(self, value: Any, accumulator: Any) -> Any: ...

    def get_result(self, accumulator: Any) -> Any: ...

    def merge(self, a: Any, b: Any) -> Any: ...


# ---------------------------------------------------------------------------
# One key group of one state: a dict with copy-on-write against snapshots
# ---------------------------------------------------------------------------

class _KGMap:
    """``m``: ``entry key -> value`` of one state in one key group.

    ``version``: the backend version ``m`` was created at; ``floor`` and
    ``fresh``: see the module docstring (objects inherited from an earlier map
    may be reachable by in-progress snapshots with version >= ``floor``;
    ``fresh`` holds the keys given a new object since ``m`` was created).
    ``changed``: the entries written, removed or handed out mutable since the last
    snapshot, for incremental checkpoints (:mod:`raystream.checkpoint.heap_changelog`;
    a dict that records nothing when they are off). It maps each key to the value last
    written (``_REMOVED`` once removed), so that a snapshot of immutable values takes
    them from here instead of looking every key up again in the map; a mutable value
    is read from the snapshot's map, which holds it as of the snapshot."""

    __slots__ = ("b", "m", "version", "floor", "fresh", "changed")

    def __init__(self, backend: "HeapKeyedStateBackend") -> None:
        self.b = backend
        self.m: dict = {}
        self.version: int = backend._version
        self.floor: float = _NEVER
        self.fresh: set = set()
        self.changed: dict = {} if backend._options is not None else _UNTRACKED

    def take_changes(self) -> dict:
        """The entries changed since the last snapshot; record into a new dict from now."""
        changed, self.changed = self.changed, {}
        return changed

    def writable(self) -> dict:
        """``m``, first replaced by a copy if a snapshot in progress holds it."""
        b = self.b
        ma = b._max_active
        if self.version <= ma:
            if self.floor > ma:
                self.floor = self.version
            self.m = self.m.copy()
            self.version = b._version
            self.fresh = set()
        return self.m

    def put(self, kk: tuple, value: Any) -> None:
        """Store a new object (one no snapshot can reach) at ``kk``."""
        self.writable()[kk] = value
        self.changed[kk] = value
        if self.floor <= self.b._max_active:
            self.fresh.add(kk)

    def shared(self, kk: tuple) -> bool:
        """May an in-progress snapshot reach the object at ``kk``?"""
        ma = self.b._max_active
        return ma >= 0 and (self.version <= ma or (self.floor <= ma and kk not in self.fresh))

    def owned(self, kk: tuple) -> Any:
        """The value at ``kk`` (``_MISSING`` if absent), safe to mutate in place."""
        v = self.m.get(kk, _MISSING)
        if v is _MISSING or type(v) in _ATOMIC or _immutable(v):
            return v
        if not self.shared(kk):
            self.changed[kk] = v  # the caller may change it in place
            return v
        v = _cow_copy(v)
        self.put(kk, v)
        return v

    def remove(self, kk: tuple) -> None:
        if kk in self.m:
            del self.writable()[kk]
            self.changed[kk] = _REMOVED

    def take(self, kk: tuple) -> Any:
        """Remove the value at ``kk`` and return it, owned by the caller."""
        v = self.m.get(kk, _MISSING)
        if v is _MISSING:
            return v
        if self.shared(kk):
            v = _cow_copy(v)
        del self.writable()[kk]
        self.changed[kk] = _REMOVED
        return v


class _StateTable:
    """All key groups of one state name: ``kgs[i]`` is key group ``key_groups[i]``.

    A state with a TTL also has its :class:`StateTtlConfig` (None until a handle
    declares it, e.g. right after a restore) and the position of its incremental
    cleanup: key group ``cursor_kg``, its keys as of when the cleanup reached it
    (``cursor_keys``) and the next one to check (``cursor_pos``)."""

    __slots__ = ("name", "kind", "kgs", "ttl", "cursor_kg", "cursor_keys", "cursor_pos")

    def __init__(self, backend: "HeapKeyedStateBackend", name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.kgs = [_KGMap(backend) for _ in range(len(backend.key_groups))]
        self.ttl: StateTtlConfig | None = None
        self.cursor_kg = -1
        self.cursor_keys: list = []
        self.cursor_pos = 0


def _no_current_key() -> RuntimeError:
    return RuntimeError("no current key: call HeapKeyedStateBackend.set_current_key() first")


# ---------------------------------------------------------------------------
# State primitives (handles; cheap, scoped to the backend's current key and namespace)
# ---------------------------------------------------------------------------

class _State:
    __slots__ = ("_b", "_t", "_kgs")

    def __init__(self, backend: "HeapKeyedStateBackend", table: _StateTable) -> None:
        self._b = backend
        self._t = table
        self._kgs = table.kgs

    def _kg(self) -> _KGMap:
        i = self._b._kg_idx
        if i is None:
            raise _no_current_key()
        return self._kgs[i]

    @property
    def name(self) -> str:
        return self._t.name

    def clear(self) -> None:
        """Remove the value of the current key and namespace."""
        self._kg().remove(self._b._kk)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._t.name!r})"


class ValueState(_State):
    """One value per key and namespace. ``value()`` returns the live value
    (mutating it in place mutates state), or ``default`` when unset; a list,
    dict, set or bytearray default is copied for every call, so keys never
    share it, and is not stored (call ``update``)."""

    __slots__ = ("_default", "_copy_default")

    def __init__(self, backend: "HeapKeyedStateBackend", table: _StateTable, default: Any) -> None:
        super().__init__(backend, table)
        self._default = default
        self._copy_default = type(default) in (list, dict, set, bytearray)

    def _default_value(self) -> Any:
        """The value read when there is none (a fresh copy of a mutable default)."""
        return copy.deepcopy(self._default) if self._copy_default else self._default

    def value(self) -> Any:
        b = self._b
        i = b._kg_idx
        if i is None:
            raise _no_current_key()
        kg = self._kgs[i]
        v = kg.m.get(b._kk, _MISSING)
        if v is _MISSING:
            return self._default_value()
        if type(v) in _ATOMIC:  # fast path: nothing to copy, nothing the caller can change
            return v
        return kg.owned(b._kk)

    def update(self, value: Any) -> None:
        b = self._b
        i = b._kg_idx
        if i is None:
            raise _no_current_key()
        kg = self._kgs[i]
        if b._max_active < 0:  # fast path: no snapshot in progress
            kg.m[b._kk] = value
            kg.changed[b._kk] = value
        else:
            kg.put(b._kk, value)


class _MergingState(_State):
    __slots__ = ()

    def _combine(self, a: Any, b: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None:
        """Merge the values of the current key under ``sources`` into ``target``
        and clear the sources (Flink ``InternalMergingState.mergeNamespaces``;
        used when session windows merge). The current namespace is unchanged."""
        kg = self._kg()
        key = self._b._key
        merged = _MISSING
        for ns in sources:
            if ns == target:
                continue
            v = kg.take(_entry_key(key, ns))
            if v is not _MISSING:
                merged = v if merged is _MISSING else self._combine(merged, v)
        if merged is _MISSING:
            return
        kk = _entry_key(key, target)
        cur = kg.owned(kk)
        kg.put(kk, merged if cur is _MISSING else self._combine(cur, merged))


class ListState(_MergingState):
    """A list per key and namespace.

    ``get()`` returns a *new* list (a shallow copy): adding to or removing
    from it does not change state (call ``update``); its elements are the
    stored objects, so mutating an element in place does (see the module's
    ownership contract). An empty list is never stored: ``update([])`` clears.
    """

    __slots__ = ()

    def get(self) -> list:
        kg = self._kg()
        kk = self._b._kk
        v = kg.m.get(kk)
        if v is None:
            return []
        if _ATOMIC.issuperset(map(type, v)):  # no element the caller can change
            return v.copy()
        return kg.owned(kk).copy()

    def add(self, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        lst = kg.owned(kk)
        if lst is _MISSING:
            kg.put(kk, [value])
        else:
            lst.append(value)

    def add_all(self, values: Iterable[Any]) -> None:
        values = list(values)
        if not values:
            return
        kg = self._kg()
        kk = self._b._kk
        lst = kg.owned(kk)
        if lst is _MISSING:
            kg.put(kk, values)
        else:
            lst.extend(values)

    def update(self, values: Iterable[Any]) -> None:
        values = list(values)
        kg = self._kg()
        if values:
            kg.put(self._b._kk, values)
        else:
            kg.remove(self._b._kk)

    def _combine(self, a: list, b: list) -> list:
        a.extend(b)
        return a


class MapState(_State):
    """A dict per key and namespace. ``keys()``, ``values()`` and ``items()``
    return lists (materialized), so state may be changed while iterating them.
    Values read are live (see the module's ownership contract). An empty map is
    never stored: removing the last entry clears the state."""

    __slots__ = ()

    def _map(self) -> dict | None:
        return self._kg().m.get(self._b._kk)

    def get(self, key: Any, default: Any = None) -> Any:
        kg = self._kg()
        kk = self._b._kk
        d = kg.m.get(kk)
        if d is None:
            return default
        v = d.get(key, _MISSING)
        if v is _MISSING:
            return default
        if type(v) in _ATOMIC or _immutable(v):
            return v
        return kg.owned(kk)[key]

    def put(self, key: Any, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        d = kg.owned(kk)
        if d is _MISSING:
            kg.put(kk, {key: value})
        else:
            d[key] = value

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        mapping = dict(mapping)
        if not mapping:
            return
        kg = self._kg()
        kk = self._b._kk
        d = kg.owned(kk)
        if d is _MISSING:
            kg.put(kk, mapping)
        else:
            d.update(mapping)

    def remove(self, key: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        d = kg.m.get(kk)
        if d is None or key not in d:
            return
        d = kg.owned(kk)
        del d[key]
        if not d:
            kg.remove(kk)

    def contains(self, key: Any) -> bool:
        d = self._map()
        return d is not None and key in d

    def keys(self) -> list:
        d = self._map()
        return [] if d is None else list(d)

    def values(self) -> list:
        d = self._kg().owned(self._b._kk)
        return [] if d is _MISSING else list(d.values())

    def items(self) -> list:
        d = self._kg().owned(self._b._kk)
        return [] if d is _MISSING else list(d.items())

    def is_empty(self) -> bool:
        return not self._map()


class ReducingState(_MergingState):
    """One value per key and namespace, combined with ``reduce(old, new)`` on
    ``add`` (``reduce`` may mutate and return ``old``). ``get()`` returns None
    when unset."""

    __slots__ = ("_reduce",)

    def __init__(self, backend: "HeapKeyedStateBackend", table: _StateTable,
                 reduce: Callable[[Any, Any], Any]) -> None:
        super().__init__(backend, table)
        self._reduce = reduce

    def get(self) -> Any:
        v = self._kg().owned(self._b._kk)
        return None if v is _MISSING else v

    def add(self, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        cur = kg.owned(kk)
        kg.put(kk, value if cur is _MISSING else self._reduce(cur, value))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._reduce(a, b)


class AggregatingState(_MergingState):
    """An accumulator per key and namespace (Flink ``AggregatingState``).
    ``get()`` returns ``get_result(accumulator)``, or None when unset."""

    __slots__ = ("_agg",)

    def __init__(self, backend: "HeapKeyedStateBackend", table: _StateTable,
                 aggregate: AggregateFunction) -> None:
        super().__init__(backend, table)
        self._agg = aggregate

    def get(self) -> Any:
        acc = self._kg().owned(self._b._kk)
        return None if acc is _MISSING else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        acc = kg.owned(kk)
        if acc is _MISSING:
            acc = self._agg.create_accumulator()
        kg.put(kk, self._agg.add(value, acc))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._agg.merge(a, b)


# ---------------------------------------------------------------------------
# State with a time-to-live (see raystream.checkpoint.ttl)
# ---------------------------------------------------------------------------
# A TTL state stores ``(value, timestamp)`` per value (per element of a list, per
# entry of a map): the processing time of its last renewal. Its table kind is the
# plain kind plus ``_TTL_SUFFIX``, so a checkpoint records that its values are wrapped.


class _TtlState(TtlHandle):
    """Mixin of the TTL handles: the heap's side of :class:`TtlHandle`."""

    __slots__ = ()
    _b: "HeapKeyedStateBackend"
    _t: _StateTable

    def _check_key(self) -> None:
        if self._b._kg_idx is None:
            raise _no_current_key()

    def _ttl_name(self) -> str:
        return self._t.name

    def _ttl_cfg(self) -> StateTtlConfig:
        return self._t.ttl  # type: ignore[return-value]


class _TtlSingleState(_TtlState, TtlSingle):
    """Value, reducing and aggregating state: one ``(value, timestamp)`` per key."""

    __slots__ = ()

    def _ttl_load(self) -> Any:
        e = self._kg().owned(self._b._kk)  # type: ignore[attr-defined]
        return None if e is _MISSING else e

    def _ttl_stamp(self, entry: Any) -> int:
        return entry[1]

    def _ttl_value(self, entry: Any) -> Any:
        return entry[0]

    def _ttl_drop(self) -> None:
        self._kg().remove(self._b._kk)  # type: ignore[attr-defined]

    def _ttl_renew(self, entry: Any, now: int) -> None:
        self._ttl_write(entry[0], now)

    def _ttl_write(self, value: Any, now: int) -> None:
        self._kg().put(self._b._kk, (value, now))  # type: ignore[attr-defined]


class _TtlValueState(TtlValueOps, _TtlSingleState, ValueState):
    __slots__ = ()


class _TtlReducingState(TtlReducingOps, _TtlSingleState, ReducingState):
    __slots__ = ()


class _TtlAggregatingState(TtlAggregatingOps, _TtlSingleState, AggregatingState):
    __slots__ = ()


class _TtlListState(_TtlState, ListState):
    """A list of ``(element, timestamp)``: every element expires on its own (as Flink)."""

    __slots__ = ()

    def get(self) -> list:
        now = self._tick()
        kg, kk = self._kg(), self._b._kk
        lst = kg.owned(kk)
        if lst is _MISSING:
            return []
        out, stored = read_elements(lst, self._ttl_cfg(), now)
        if stored is not None:
            _store_list(kg, kk, stored)
        return out

    def add(self, value: Any) -> None:
        self.add_all([value])

    def add_all(self, values: Iterable[Any]) -> None:
        now = self._tick()
        entries = [(v, now) for v in values]
        if not entries:
            return
        kg, kk = self._kg(), self._b._kk
        lst = kg.owned(kk)
        if lst is _MISSING:
            kg.put(kk, entries)
        else:
            lst.extend(entries)

    def update(self, values: Iterable[Any]) -> None:
        now = self._tick()
        entries = [(v, now) for v in values]
        if entries:
            self._kg().put(self._b._kk, entries)
        else:
            self._kg().remove(self._b._kk)


class _TtlMapState(TtlMapReads, _TtlState, MapState):
    """A dict of ``user key -> (value, timestamp)``: every entry expires on its own."""

    __slots__ = ()

    def _owned_map(self) -> dict | None:
        d = self._kg().owned(self._b._kk)
        return None if d is _MISSING else d

    def _drop_if_empty(self, d: dict) -> None:
        if not d:
            self._kg().remove(self._b._kk)

    def get(self, key: Any, default: Any = None) -> Any:
        now = self._tick()
        d = self._owned_map()
        if d is None:
            return default
        v, changed = read_entry(d, key, self._ttl_cfg(), now, default)
        if changed:
            self._drop_if_empty(d)
        return v

    def put(self, key: Any, value: Any) -> None:
        self.put_all({key: value})

    def put_all(self, mapping: Mapping[Any, Any]) -> None:
        now = self._tick()
        entries = {k: (v, now) for k, v in dict(mapping).items()}
        if not entries:
            return
        d = self._owned_map()
        if d is None:
            self._kg().put(self._b._kk, entries)
        else:
            d.update(entries)

    def remove(self, key: Any) -> None:
        self._tick()
        d = self._owned_map()
        if d is not None and key in d:
            del d[key]
            self._drop_if_empty(d)

    def contains(self, key: Any) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def _entries(self) -> list[tuple[Any, Any]]:
        """``(user key, value)`` of the entries a read sees; removes expired ones and
        renews the others when reads renew."""
        now = self._tick()
        d = self._owned_map()
        if d is None:
            return []
        out, _ = read_entries(d, self._ttl_cfg(), now)
        self._drop_if_empty(d)
        return out


def _store_list(kgm: _KGMap, kk: Any, live: list) -> None:
    """Store ``live`` (a new list of owned elements) as the list of a TTL list state,
    or remove the entry when it is empty (an empty list is never stored)."""
    if live:
        kgm.put(kk, live)
    else:
        kgm.remove(kk)


def _unexpired(kind: str, m: dict, ttl_ms: int, now: int) -> dict:
    """The entries of one key group's map of a TTL state that are live at ``now``
    (a new dict; ``m`` is not changed)."""
    base = kind[:-len(_TTL_SUFFIX)]
    if base == _LIST:
        live = {kk: live_elements(lst, ttl_ms, now) for kk, lst in m.items()}
    elif base == _MAP:
        live = {kk: live_entries(d, ttl_ms, now) for kk, d in m.items()}
    else:
        return live_entries(m, ttl_ms, now)
    return {kk: v for kk, v in live.items() if v}


# ---------------------------------------------------------------------------
# Snapshots
# ---------------------------------------------------------------------------

class StateSnapshot:
    """The asynchronous part of a keyed-state snapshot.

    Call it (once, on any thread) to get ``{key_group: section_bytes}`` for
    every non-empty key group, exactly as of :meth:`HeapKeyedStateBackend.snapshot`.
    It releases the snapshot when it returns or raises. If it will never be
    called (checkpoint aborted), call :meth:`release`; an unrun snapshot is
    also released when garbage-collected. A released snapshot cannot run.
    """

    __slots__ = ("version", "_captured", "_expiry", "_key_groups", "_max_parallelism",
                 "_finalizer", "_lock", "_running", "__weakref__")

    def __init__(self, backend: "HeapKeyedStateBackend", version: int,
                 captured: list[tuple[str, str, list[dict]]],
                 expiry: dict[str, tuple[int, int]] | None = None) -> None:
        self.version = version
        self._captured = captured
        self._expiry = expiry or {}  # state name -> (ttl_ms, now) of states with a TTL
        self._key_groups = backend.key_groups
        self._max_parallelism = backend.max_parallelism
        self._finalizer = weakref.finalize(self, backend._release, version)
        self._lock = threading.Lock()
        self._running = False

    @property
    def released(self) -> bool:
        return not self._finalizer.alive

    def release(self) -> None:
        """Give up this snapshot without serializing it (idempotent). If it is
        running on another thread, it is released when that run ends (releasing
        earlier would let processing mutate what it is reading)."""
        with self._lock:
            if self._running:
                return
            self._captured = None
        self._finalizer()

    def __call__(self) -> dict[int, bytes]:
        """Every non-empty key group's section, in full."""
        return self._run(None)[0]

    def changed(self, changes: Changes) -> tuple[dict[int, bytes], int]:
        """Instead of the full sections: sections of the changes of the entries whose keys
        are in ``changes`` (their values as of this snapshot; those no longer there,
        removed), and how many entries they hold."""
        return self._run(changes)

    def _run(self, changes: Changes | None) -> tuple[dict[int, bytes], int]:
        with self._lock:
            captured = self._captured
            if captured is None or not self._finalizer.alive:
                raise RuntimeError(f"snapshot {self.version} was already run or released")
            self._captured = None
            self._running = True
        try:
            out: dict[int, bytes] = {}
            written = 0
            for i, kg in enumerate(self._key_groups):
                if changes is None:
                    states = self._live(
                        [(name, kind, maps[i]) for name, kind, maps in captured if maps[i]])
                    removed = None
                else:
                    states, removed = self._changes_of(captured, changes, i)
                if states:
                    out[kg] = self._section(kg, states, removed)
                    written += sum(len(m) for _, _, m in states) + sum(map(len, removed or ()))
            return out, written
        finally:
            self._finalizer()

    def _live(self, states: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
        """``states`` without what has expired (of states with a TTL)."""
        expiry = self._expiry
        if not expiry:
            return states
        # captured maps are never changed in place: safe to read here
        states = [(name, kind, _unexpired(kind, m, *expiry[name]) if name in expiry else m)
                  for name, kind, m in states]
        return [s for s in states if s[2]]

    def _changes_of(self, captured: list[tuple[str, str, list[dict]]], changes: Changes,
                    i: int) -> tuple[list[tuple[str, str, dict]], list[list]]:
        """Key group ``i``'s changed entries per state (expired ones count as removed),
        and per state the changed keys no longer there."""
        states, removed = [], []
        for name, kind, maps in captured:
            keys = changes.get(name)
            if keys is None or i >= len(keys) or not keys[i]:
                continue
            written = keys[i]
            if name not in self._expiry and _ATOMIC.issuperset(map(type, written.values())):
                # immutable values, none removed: what was last written is what the map
                # held at the snapshot (a dict no one changes once logged)
                states.append((name, kind, written))
                removed.append([])
                continue
            m = maps[i]
            live = {kk: m[kk] for kk in written if kk in m}
            if name in self._expiry:
                live = _unexpired(kind, live, *self._expiry[name])
            states.append((name, kind, live))
            removed.append([kk for kk in written if kk not in live])
        return states, removed

    def _section(self, kg: int, states: list[tuple[str, str, dict]],
                 removed: list[list] | None) -> bytes:
        try:
            return self._pickled_section(kg, states, removed, fast=True)
        except KeyError:  # CPython's pickler without a memo fails so on frozensets
            return self._pickled_section(kg, states, removed, fast=False)

    def _pickled_section(self, kg: int, states: list[tuple[str, str, dict]],
                         removed: list[list] | None, *, fast: bool) -> bytes:
        """A full section, or (``removed`` given: per state, the keys removed) the
        changes one: after each state's chunks, the list of its removed keys."""
        buf = io.BytesIO()
        kind = SectionKind.HEAP_STATE if removed is None else SectionKind.HEAP_CHANGES
        buf.write(Envelope.current(kind, max_parallelism=self._max_parallelism,
                                   key_group=kg).pack())
        pickler = pickle.Pickler(buf, protocol=5)
        # No memo (fast): state values are written independently (as Flink serializes
        # each value), which halves the time for millions of small entries; a
        # value that refers to itself fails the write and so declines the checkpoint.
        pickler.fast = fast
        pickler.dump([(name, kind, -(-len(m) // CHUNK_ENTRIES)) for name, kind, m in states])
        for j, (name, _kind, m) in enumerate(states):
            try:
                if len(m) <= CHUNK_ENTRIES:
                    pickler.dump(m)
                else:
                    items = iter(m.items())
                    for _ in range(0, len(m), CHUNK_ENTRIES):
                        pickler.dump(dict(itertools.islice(items, CHUNK_ENTRIES)))
                if removed is not None:
                    pickler.dump(removed[j])
            except (TypeError, AttributeError, pickle.PicklingError) as exc:
                raise _unpicklable(name, m, exc) from exc
        return buf.getvalue()

    def __repr__(self) -> str:
        state = "released" if self.released else "pending"
        return f"StateSnapshot(version={self.version}, {state})"


def _load_entries(unpickler: pickle.Unpickler, n_chunks: int) -> dict:
    """One state's entries of a section: its chunks (always at least one pickle)."""
    values = unpickler.load()
    for _ in range(n_chunks - 1):
        values.update(unpickler.load())
    return values


def _unpicklable(name: str, entries: dict, exc: Exception) -> TypeError:
    """The error of a state whose snapshot failed, naming the state and the first of its
    keys whose value cannot be pickled (found again only on this error path)."""
    for key, value in entries.items():
        try:
            pickle.dumps(value, protocol=5)
        except Exception:
            return TypeError(f"state '{name}' of key {key!r} holds a value that cannot be "
                             f"pickled ({type(exc).__name__}: {exc}): a heap state value is "
                             f"made of picklable objects")
    return TypeError(f"state '{name}' cannot be pickled: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------

class HeapKeyedStateBackend:
    """Keyed state of one operator instance, for the key groups ``key_groups``.

    Example (count per user; snapshot; keep processing; restore at parallelism 2):

    >>> from raystream.checkpoint.keygroups import key_group_of, key_group_range
    >>> backend = HeapKeyedStateBackend(max_parallelism=128, key_groups=range(128))
    >>> count = backend.value_state("count", default=0)
    >>> for user in ["alice", "bob", "alice"]:
    ...     backend.set_current_key(user)
    ...     count.update(count.value() + 1)
    >>> write = backend.snapshot()        # synchronous part: cheap, consistent
    >>> count.update(100)                 # processing continues ("alice" is current)
    >>> sections = write()                # asynchronous part (normally on another thread)
    >>> sorted(sections) == sorted({key_group_of("alice"), key_group_of("bob")})
    True
    >>> restored = {}
    >>> for subtask in range(2):
    ...     b = HeapKeyedStateBackend(max_parallelism=128, key_groups=key_group_range(subtask, 2, 128))
    ...     b.restore(sections.items())   # keeps only the key groups of its range
    ...     c = b.value_state("count", default=0)
    ...     for user in b.keys("count"):
    ...         b.set_current_key(user)
    ...         restored[user] = c.value()
    >>> restored == {"alice": 2, "bob": 1}
    True

    State handles (``value_state`` ...) are cheap views scoped to the current
    key (:meth:`set_current_key`) and namespace (:meth:`set_namespace`,
    default None); create them once (e.g. in ``open``) and reuse them. A name
    is bound to one kind of state. See the module docstring for the
    copy-on-write snapshot scheme and the threading and ownership contracts.
    """

    def __init__(self, *, max_parallelism: int, key_groups: range,
                 ttl_time_provider: TtlTimeProvider = wall_clock_ms,
                 options: HeapStateOptions | None = None) -> None:
        """``options``: with ``incremental``, :meth:`snapshot` returns a
        :class:`~raystream.checkpoint.heap_changelog.HeapIncrementalSnapshot` (give them
        only where checkpoints are taken: the changes are kept until one completes)."""
        check_key_group_range(key_groups, max_parallelism)
        self._options = options if options is not None and options.incremental else None
        self._changes = ChangeLog()
        self._chains = ChainTracker()
        self._ttl_now = ttl_time_provider  # the processing-time clock of state TTLs
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        self._kg_start = key_groups.start
        self._kg_len = len(key_groups)
        self._tables: dict[str, _StateTable] = {}
        # A snapshot takes version s = _version and bumps _version; maps are
        # stamped with _version when created.
        self._version = 0
        self._max_active = -1  # newest in-progress snapshot version, -1 if none
        self._active: set[int] = set()
        self._lock = threading.Lock()  # guards _active/_max_active (release runs elsewhere)
        self._restored: set[int] = set()
        self._key: Any = None
        self._ns: Any = None
        self._kg_idx: int | None = None
        self._kk: Any = None  # _entry_key(current key, current namespace)

    # keyed state of either backend: it restores the disk backend's too
    owns_section = staticmethod(is_keyed_state)

    # -- current key and namespace ----------------------------------------
    def set_current_key(self, key: Any, key_group: int | None = None) -> None:
        """Scope subsequent state accesses to ``key``, whose key group (computed
        with ``key_group_of`` unless given) must belong to this backend."""
        if key_group is None:
            key_group = key_group_of(key, self.max_parallelism)
        i = key_group - self._kg_start
        if not 0 <= i < self._kg_len:
            raise ValueError(
                f"key {key!r} is in key group {key_group}, outside this backend's key "
                f"groups {self.key_groups.start}..{self.key_groups.stop - 1}")
        self._key = key
        self._kg_idx = i
        self._kk = _entry_key(key, self._ns)

    @property
    def current_key(self) -> Any:
        return self._key

    @property
    def current_key_group(self) -> int | None:
        return None if self._kg_idx is None else self._kg_start + self._kg_idx

    def set_namespace(self, namespace: Any) -> None:
        """Scope subsequent state accesses to ``namespace`` (hashable; None by default)."""
        self._ns = namespace
        self._kk = _entry_key(self._key, namespace)

    @property
    def current_namespace(self) -> Any:
        return self._ns

    # -- state handles -------------------------------------------------------
    def _table(self, name: str, kind: str, ttl: StateTtlConfig | None = None) -> _StateTable:
        kind = ttl_kind(kind, name, ttl)
        t = self._tables.get(name)
        if t is None:
            t = self._tables[name] = _StateTable(self, name, kind)
        else:
            check_state_kind(name, t.kind, kind)
        if ttl is not None:
            if t.ttl is not None and t.ttl != ttl:
                raise ValueError(f"state {name!r} is declared with two TTLs: {t.ttl} and {ttl}")
            t.ttl = ttl
        return t

    def value_state(self, name: str, default: Any = None, *,
                    ttl: StateTtlConfig | None = None) -> ValueState:
        """``ttl``: expire values (see :class:`~raystream.StateTtlConfig`); likewise below."""
        cls = ValueState if ttl is None else _TtlValueState
        return cls(self, self._table(name, _VALUE, ttl), default)

    def list_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> ListState:
        cls = ListState if ttl is None else _TtlListState
        return cls(self, self._table(name, _LIST, ttl))

    def map_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> MapState:
        cls = MapState if ttl is None else _TtlMapState
        return cls(self, self._table(name, _MAP, ttl))

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any], *,
                       ttl: StateTtlConfig | None = None) -> ReducingState:
        cls = ReducingState if ttl is None else _TtlReducingState
        return cls(self, self._table(name, _REDUCING, ttl), reduce)

    def aggregating_state(self, name: str, aggregate: AggregateFunction, *,
                          ttl: StateTtlConfig | None = None) -> AggregatingState:
        cls = AggregatingState if ttl is None else _TtlAggregatingState
        return cls(self, self._table(name, _AGGREGATING, ttl), aggregate)

    def _cleanup_step(self, t: _StateTable, now: int) -> None:
        """Flink's incremental TTL cleanup: check the next ``cleanup_per_access``
        stored values of ``t`` (a key group moved past counts as one), removing
        the expired ones, so state no key reads again is still reclaimed."""
        ttl = t.ttl
        if ttl is None or not ttl.cleanup_per_access:
            return
        expires, base, kgs = ttl.ttl_ms, t.kind[:-len(_TTL_SUFFIX)], t.kgs
        for _ in range(ttl.cleanup_per_access):
            if t.cursor_pos >= len(t.cursor_keys):
                t.cursor_kg = (t.cursor_kg + 1) % len(kgs)
                t.cursor_keys, t.cursor_pos = list(kgs[t.cursor_kg].m), 0
                continue
            kk = t.cursor_keys[t.cursor_pos]
            t.cursor_pos += 1
            kgm = kgs[t.cursor_kg]
            e = kgm.m.get(kk, _MISSING)
            if e is _MISSING:
                continue
            if base == _LIST:
                if any(is_expired(x[1], expires, now) for x in e):
                    _store_list(kgm, kk, live_elements(kgm.owned(kk), expires, now))
            elif base == _MAP:
                dead = [k for k, x in e.items() if is_expired(x[1], expires, now)]
                if dead:
                    d = kgm.owned(kk)
                    for k in dead:
                        del d[k]
                    if not d:
                        kgm.remove(kk)
            elif is_expired(e[1], expires, now):
                kgm.remove(kk)

    def state_names(self) -> list[str]:
        return list(self._tables)

    def keys(self, name: str) -> Iterator[Any]:
        """Keys with state under ``name`` in any namespace, each once, by key
        group. State may be changed (and the current key moved) while iterating."""
        t = self._tables.get(name)
        if t is None:
            return iter(())
        return self._iter_keys(t)

    @staticmethod
    def _iter_keys(t: _StateTable) -> Iterator[Any]:
        for kg in t.kgs:
            if kg.m:
                yield from dict.fromkeys([_key_of(kk) for kk in kg.m])

    # -- snapshot and restore ---------------------------------------------------
    def snapshot(self) -> StateSnapshot | HeapIncrementalSnapshot:
        """Synchronous part of a snapshot: O(state names x key groups), no copying
        of state. Returns the asynchronous part (see :class:`StateSnapshot`; with
        incremental checkpoints, a :class:`HeapIncrementalSnapshot` around it)."""
        with self._lock:
            version = self._version
            self._version = version + 1
            self._active.add(version)
            self._max_active = version
        tables = self._tables.values()
        captured = [(t.name, t.kind, [kg.m for kg in t.kgs]) for t in tables]
        # expired values are left out, as of now (the synchronous part)
        expiry = {t.name: (t.ttl.ttl_ms, self._ttl_now()) for t in tables if t.ttl is not None}
        full = StateSnapshot(self, version, captured, expiry)
        options = self._options
        if options is None:
            return full
        log = self._changes
        log.add(version, {t.name: [kg.take_changes() for kg in t.kgs] for t in tables})
        base = self._chains.base()
        if base is not None and log.size_since(base.version) > base.room(options.max_changes_ratio):
            base = None  # the chain would read too much: start a new one
        if base is None:  # a full snapshot: no change before it is needed again
            log.clear()
            self._chains.forget(version)
        return HeapIncrementalSnapshot(
            full=full, changed=full.changed, base=base,
            logged=[] if base is None else log.since(base.version), version=version,
            entries=sum(len(kg.m) for t in tables for kg in t.kgs), tracker=self._chains,
            key_groups=self.key_groups)

    def extend_restored(self, chain: Chain) -> None:
        """The backend restored ``chain`` and nothing else: the next checkpoint may write
        only what changed since (heap_changelog.restored_chain says when it may)."""
        if self._options is not None:
            self._chains.restored(chain)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: the next incremental one may extend it."""
        chain = self._chains.complete(checkpoint_id)
        if chain is not None:
            self._changes.drop_upto(chain.version)

    def _release(self, version: int) -> None:
        with self._lock:
            self._active.discard(version)
            self._max_active = max(self._active, default=-1)

    @property
    def snapshots_in_progress(self) -> int:
        return len(self._active)

    def restore(self, sections: Iterable[tuple[int, bytes | memoryview]] | Mapping[int, bytes],
                *, skip_kinds: tuple[str, ...] = ()) -> None:
        """Load snapshot sections, keeping only key groups in ``self.key_groups``.
        May be called several times (e.g. with the sections of several old
        subtasks); a key group's section must not be given twice. A disk backend's
        section's states of ``skip_kinds`` (prefixes) are left to the operator."""
        if isinstance(sections, Mapping):  # the Mapping[int, bytes] of the union
            sections = cast(Mapping[int, bytes], sections).items()
        # Unpickling allocates many containers at once; with the cyclic GC on,
        # that triggers repeated full collections over the whole heap (several
        # times slower for container values). Pause cycle detection meanwhile.
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            self._restore(sections, skip_kinds)
        finally:
            if gc_enabled:
                gc.enable()

    def _restore(self, sections: Iterable[tuple[int, bytes | memoryview]],
                 skip_kinds: tuple[str, ...]) -> None:
        for kg, data in sections:
            if kg not in self.key_groups:
                continue
            envelope, body = read(data, key_group=kg, max_parallelism=self.max_parallelism,
                                  kinds=KEYED_STATE)
            if envelope.kind is SectionKind.HEAP_CHANGES:  # after its chain's full section
                self._apply_changes_section(kg, body)
                continue
            if kg in self._restored:
                raise ValueError(f"key group {kg} restored twice")
            if envelope.kind is SectionKind.DISK_STATE:  # a job switching backends
                self._restore_disk_section(kg, body, skip_kinds)
            else:
                self._restore_heap_section(kg, body)
            self._restored.add(kg)

    def _restore_heap_section(self, kg: int, body: memoryview) -> None:
        unpickler = pickle.Unpickler(io.BytesIO(body))
        directory = unpickler.load()
        i = kg - self._kg_start
        for name, kind, n_chunks in directory:
            values = _load_entries(unpickler, n_chunks)
            kgm = self._table(name, kind).kgs[i]
            if kgm.m:  # merge into existing state (copy-on-write aware)
                for kk, v in values.items():
                    kgm.put(kk, v)
            else:  # adopt the freshly unpickled dict: no snapshot can reach it
                kgm.m = values
                kgm.version = self._version
                kgm.floor = _NEVER
                kgm.fresh = set()

    def _apply_changes_section(self, kg: int, body: memoryview) -> None:
        unpickler = pickle.Unpickler(io.BytesIO(body))
        i = kg - self._kg_start
        for name, kind, n_chunks in unpickler.load():
            values = _load_entries(unpickler, n_chunks)
            removed = unpickler.load()
            m = self._table(name, kind).kgs[i].writable()
            m.update(values)
            for kk in removed:
                m.pop(kk, None)

    def _restore_disk_section(self, kg: int, body: memoryview,
                              skip_kinds: tuple[str, ...]) -> None:
        i = kg - self._kg_start
        for name, kind, key, namespace, value in section_entries(kg, body, skip_kinds):
            self._table(name, kind).kgs[i].put(_entry_key(key, namespace), value)

    def __repr__(self) -> str:
        return (f"HeapKeyedStateBackend(max_parallelism={self.max_parallelism}, "
                f"key_groups={self.key_groups!r}, states={list(self._tables)})")
