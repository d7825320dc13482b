"""Heap keyed state: the entries, their copy-on-write maps and the state handles.

Flink's ``CopyOnWriteStateMap`` and heap state handles, in Python; the backend that
owns them, its snapshots and its restore are in :mod:`raystream.checkpoint.heap_backend`
(and the handles of states with a TTL in :mod:`raystream.checkpoint.heap_ttl`). Every
state name has one plain ``dict`` per key group, mapping the entry key (the plain key in
the None namespace, ``_Namespaced(key, namespace)`` otherwise) directly to the value
(no per-entry wrapper objects: fewer allocations, less work for the cyclic GC,
and a key group's section is pickled straight from its dicts, in C).

Snapshots and versioned copy-on-write
-------------------------------------
:meth:`~raystream.checkpoint.heap_backend.HeapKeyedStateBackend.snapshot` is the
*synchronous* part of a checkpoint. It costs O(state names x key groups) reference
copies, independent of the number of keys: it records the backend's current *version*
``s``, bumps it to ``s + 1`` and keeps references to the per-key-group dicts. It returns
a :class:`~raystream.checkpoint.heap_backend.StateSnapshot`, the *asynchronous* part: a
callable that pickles those dicts, one section per non-empty key group, typically on a
background thread while records keep flowing. While any snapshot is in progress the
processing thread never mutates an object a snapshot can reach:

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

When the asynchronous part finishes (or fails, or its ``release`` is called, or it is
garbage-collected unrun), the snapshot is released; with none in progress, state is
changed in place with no copying at all. Any number of snapshots may be in progress at
once.

Threading contract: all state access, ``snapshot`` and ``restore`` happen on one thread
(the subtask's processing thread); only a ``StateSnapshot`` may run on another thread,
concurrently with processing.

Ownership contract (as in Flink's heap backend): a value handed to state
(``update``, ``add``, ``put``...) is owned by the state from then on, and a
mutable value read from state is the live state value, valid for the current
record: mutating it in place changes the state. Do not keep such references
across records (a snapshot may be taken in between) and do not mutate an
object after handing it to state except through a fresh read.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import fractions
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

import numpy as np

from raystream.checkpoint.ttl import StateTtlConfig

if TYPE_CHECKING:  # (the backend creates the maps and the handles of this module)
    from raystream.checkpoint.heap_backend import HeapKeyedStateBackend

__all__ = [
    "ATOMIC",
    "MISSING",
    "AggregateFunction",
    "AggregatingState",
    "KeyGroupMap",
    "ListState",
    "MapState",
    "ReducingState",
    "StateTable",
    "ValueState",
    "entry_key",
    "key_and_namespace",
    "key_of",
    "no_current_key",
]

# Types whose instances cannot be mutated in place: never copied (nor looked at again by
# a snapshot of changes).
ATOMIC = frozenset({
    int, float, complex, bool, str, bytes, type(None), range,
    decimal.Decimal, fractions.Fraction, uuid.UUID,
    datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone,
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.datetime64, np.timedelta64,
})

MISSING: Any = object()  # what a read gives for a key a map does not hold
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


def entry_key(key: Any, namespace: Any) -> Any:
    return key if namespace is None else _Namespaced(key, namespace)


def key_of(entry_key: Any) -> Any:
    return entry_key.key if type(entry_key) is _Namespaced else entry_key


def key_and_namespace(entry_key: Any) -> tuple[Any, Any]:
    """The key and the namespace of an entry of the heap backend's maps."""
    if type(entry_key) is _Namespaced:
        return entry_key.key, entry_key.namespace
    return entry_key, None


def _immutable(v: Any) -> bool:
    t = type(v)
    if t in ATOMIC:
        return True
    if t is tuple or t is frozenset:
        return all(map(_immutable, v))
    return False


def _all_immutable(values: Iterable[Any]) -> bool:
    return ATOMIC.issuperset(map(type, values)) or all(map(_immutable, values))


def _cow_copy(v: Any) -> Any:
    """A copy of ``v`` sharing no mutable object with it (``copy.deepcopy``,
    with a shallow fast path for lists/sets/dicts of immutable values)."""
    t = type(v)
    if t in ATOMIC:
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

class KeyGroupMap:
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
        """The value at ``kk`` (``MISSING`` if absent), safe to mutate in place."""
        v = self.m.get(kk, MISSING)
        if v is MISSING or type(v) in ATOMIC or _immutable(v):
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
        v = self.m.get(kk, MISSING)
        if v is MISSING:
            return v
        if self.shared(kk):
            v = _cow_copy(v)
        del self.writable()[kk]
        self.changed[kk] = _REMOVED
        return v

    def adopt(self, values: dict) -> None:
        """Make ``values``, a freshly unpickled dict no snapshot can reach, ``m``."""
        self.m = values
        self.version = self.b._version
        self.floor = _NEVER
        self.fresh = set()


class StateTable:
    """All key groups of one state name: ``kgs[i]`` is key group ``key_groups[i]``.

    A state with a TTL also has its :class:`StateTtlConfig` (None until a handle
    declares it, e.g. right after a restore) and the position of its incremental
    cleanup: key group ``cursor_kg``, its keys as of when the cleanup reached it
    (``cursor_keys``) and the next one to check (``cursor_pos``)."""

    __slots__ = ("name", "kind", "kgs", "ttl", "cursor_kg", "cursor_keys", "cursor_pos")

    def __init__(self, backend: "HeapKeyedStateBackend", name: str, kind: str) -> None:
        self.name = name
        self.kind = kind
        self.kgs = [KeyGroupMap(backend) for _ in range(len(backend.key_groups))]
        self.ttl: StateTtlConfig | None = None
        self.cursor_kg = -1
        self.cursor_keys: list = []
        self.cursor_pos = 0


def no_current_key() -> RuntimeError:
    return RuntimeError("no current key: call HeapKeyedStateBackend.set_current_key() first")


# ---------------------------------------------------------------------------
# State primitives (handles; cheap, scoped to the backend's current key and namespace)
# ---------------------------------------------------------------------------

class _State:
    __slots__ = ("_b", "_t", "_kgs")

    def __init__(self, backend: "HeapKeyedStateBackend", table: StateTable) -> None:
        self._b = backend
        self._t = table
        self._kgs = table.kgs

    def _kg(self) -> KeyGroupMap:
        i = self._b._kg_idx
        if i is None:
            raise no_current_key()
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

    def __init__(self, backend: "HeapKeyedStateBackend", table: StateTable, default: Any) -> None:
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
            raise no_current_key()
        kg = self._kgs[i]
        v = kg.m.get(b._kk, MISSING)
        if v is MISSING:
            return self._default_value()
        if type(v) in ATOMIC:  # fast path: nothing to copy, nothing the caller can change
            return v
        return kg.owned(b._kk)

    def update(self, value: Any) -> None:
        b = self._b
        i = b._kg_idx
        if i is None:
            raise no_current_key()
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
        merged = MISSING
        for ns in sources:
            if ns == target:
                continue
            v = kg.take(entry_key(key, ns))
            if v is not MISSING:
                merged = v if merged is MISSING else self._combine(merged, v)
        if merged is MISSING:
            return
        kk = entry_key(key, target)
        cur = kg.owned(kk)
        kg.put(kk, merged if cur is MISSING else self._combine(cur, merged))


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
        if ATOMIC.issuperset(map(type, v)):  # no element the caller can change
            return v.copy()
        return kg.owned(kk).copy()

    def add(self, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        lst = kg.owned(kk)
        if lst is MISSING:
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
        if lst is MISSING:
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
        v = d.get(key, MISSING)
        if v is MISSING:
            return default
        if type(v) in ATOMIC or _immutable(v):
            return v
        return kg.owned(kk)[key]

    def put(self, key: Any, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        d = kg.owned(kk)
        if d is MISSING:
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
        if d is MISSING:
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
        return [] if d is MISSING else list(d.values())

    def items(self) -> list:
        d = self._kg().owned(self._b._kk)
        return [] if d is MISSING else list(d.items())

    def is_empty(self) -> bool:
        return not self._map()


class ReducingState(_MergingState):
    """One value per key and namespace, combined with ``reduce(old, new)`` on
    ``add`` (``reduce`` may mutate and return ``old``). ``get()`` returns None
    when unset."""

    __slots__ = ("_reduce",)

    def __init__(self, backend: "HeapKeyedStateBackend", table: StateTable,
                 reduce: Callable[[Any, Any], Any]) -> None:
        super().__init__(backend, table)
        self._reduce = reduce

    def get(self) -> Any:
        v = self._kg().owned(self._b._kk)
        return None if v is MISSING else v

    def add(self, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        cur = kg.owned(kk)
        kg.put(kk, value if cur is MISSING else self._reduce(cur, value))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._reduce(a, b)


class AggregatingState(_MergingState):
    """An accumulator per key and namespace (Flink ``AggregatingState``).
    ``get()`` returns ``get_result(accumulator)``, or None when unset."""

    __slots__ = ("_agg",)

    def __init__(self, backend: "HeapKeyedStateBackend", table: StateTable,
                 aggregate: AggregateFunction) -> None:
        super().__init__(backend, table)
        self._agg = aggregate

    def get(self) -> Any:
        acc = self._kg().owned(self._b._kk)
        return None if acc is MISSING else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        kg = self._kg()
        kk = self._b._kk
        acc = kg.owned(kk)
        if acc is MISSING:
            acc = self._agg.create_accumulator()
        kg.put(kk, self._agg.add(value, acc))

    def _combine(self, a: Any, b: Any) -> Any:
        return self._agg.merge(a, b)
