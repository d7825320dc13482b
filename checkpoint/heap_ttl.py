"""The heap backend's state handles of states with a time-to-live.

A state created with ``ttl=StateTtlConfig(...)`` (see :mod:`raystream.checkpoint.ttl`)
stores ``(value, timestamp)`` per value, per list element and per map entry,
stamped by the backend's ``ttl_time_provider`` (the wall clock in ms unless
injected). Its handles (here, subclasses of those of :mod:`raystream.checkpoint.state`)
hide and remove expired values on access and check a few more stored entries of the
state per access (an incremental cleanup cursor over all its key groups, the backend's
``_cleanup_step``); a snapshot leaves out what has expired at its synchronous part
(:mod:`raystream.checkpoint.heap_backend`). Its kind in the section directory carries a
``+ttl`` suffix, so a checkpoint records that its values are wrapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterable

from raystream.checkpoint.state import (MISSING, AggregatingState, KeyGroupMap, ListState,
                                        MapState, ReducingState, StateTable, ValueState,
                                        no_current_key)
from raystream.checkpoint.ttl import (StateTtlConfig, TtlAggregatingOps, TtlHandle, TtlMapReads,
                                      TtlReducingOps, TtlSingle, TtlValueOps, read_elements,
                                      read_entries, read_entry)

if TYPE_CHECKING:  # (the backend creates these handles)
    from raystream.checkpoint.heap_backend import HeapKeyedStateBackend

__all__ = ["TtlAggregatingState", "TtlListState", "TtlMapState", "TtlReducingState",
           "TtlValueState", "store_list"]


class _TtlState(TtlHandle):
    """Mixin of the TTL handles: the heap's side of :class:`TtlHandle`."""

    __slots__ = ()
    _b: "HeapKeyedStateBackend"
    _t: StateTable

    def _check_key(self) -> None:
        if self._b._kg_idx is None:
            raise no_current_key()

    def _ttl_name(self) -> str:
        return self._t.name

    def _ttl_cfg(self) -> StateTtlConfig:
        return self._t.ttl  # type: ignore[return-value]


class _TtlSingleState(_TtlState, TtlSingle):
    """Value, reducing and aggregating state: one ``(value, timestamp)`` per key."""

    __slots__ = ()

    def _ttl_load(self) -> Any:
        e = self._kg().owned(self._b._kk)  # type: ignore[attr-defined]
        return None if e is MISSING else e

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


class TtlValueState(TtlValueOps, _TtlSingleState, ValueState):
    """A :class:`~raystream.checkpoint.state.ValueState` with a TTL."""

    __slots__ = ()


class TtlReducingState(TtlReducingOps, _TtlSingleState, ReducingState):
    """A :class:`~raystream.checkpoint.state.ReducingState` with a TTL."""

    __slots__ = ()


class TtlAggregatingState(TtlAggregatingOps, _TtlSingleState, AggregatingState):
    """An :class:`~raystream.checkpoint.state.AggregatingState` with a TTL."""

    __slots__ = ()


class TtlListState(_TtlState, ListState):
    """A list of ``(element, timestamp)``: every element expires on its own (as Flink)."""

    __slots__ = ()

    def get(self) -> list:
        now = self._tick()
        kg, kk = self._kg(), self._b._kk
        lst = kg.owned(kk)
        if lst is MISSING:
            return []
        out, stored = read_elements(lst, self._ttl_cfg(), now)
        if stored is not None:
            store_list(kg, kk, stored)
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
        if lst is MISSING:
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


class TtlMapState(TtlMapReads, _TtlState, MapState):
    """A dict of ``user key -> (value, timestamp)``: every entry expires on its own."""

    __slots__ = ()

    def _owned_map(self) -> dict | None:
        d = self._kg().owned(self._b._kk)
        return None if d is MISSING else d

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
        return self.get(key, MISSING) is not MISSING

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


def store_list(kgm: KeyGroupMap, kk: Any, live: list) -> None:
    """Store ``live`` (a new list of owned elements) as the list of a TTL list state,
    or remove the entry when it is empty (an empty list is never stored)."""
    if live:
        kgm.put(kk, live)
    else:
        kgm.remove(kk)

