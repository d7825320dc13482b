"""Heap keyed state backend: state per (key, namespace), partitioned by key group.

Flink's ``HeapKeyedStateBackend``, in Python. A subtask owns a contiguous range of key
groups; every state name has one plain ``dict`` per key group (the copy-on-write maps of
:mod:`raystream.checkpoint.state`, which also holds the state handles and the
copy-on-write scheme that lets a snapshot run beside processing). Snapshots are taken
per key group, so a job restores at another parallelism by handing every subtask the
sections of its range. This module holds the backend, its snapshots (the asynchronous
part, :class:`StateSnapshot`) and its restore.

Threading contract: all state access, :meth:`~HeapKeyedStateBackend.snapshot` and
:meth:`~HeapKeyedStateBackend.restore` happen on one thread (the subtask's
processing thread); only a :class:`StateSnapshot` may run on another thread,
concurrently with processing. The processing thread never waits for
serialization (it may wait, GIL-wise, for the pickling of one chunk of a key
group, a single C call). :meth:`~HeapKeyedStateBackend.restore` pauses the cyclic
GC while it runs (unpickling many containers otherwise triggers repeated full
collections).

A snapshot of a state with a TTL (:mod:`raystream.checkpoint.heap_ttl`) leaves out what
has expired at its synchronous part (filtered in the asynchronous part, over maps no one
changes any more).

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

import gc
import io
import itertools
import pickle
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator, cast

from raystream.checkpoint.disk_sections import section_entries
from raystream.checkpoint.envelope import KEYED_STATE, Envelope, SectionKind, is_keyed_state, read
from raystream.checkpoint.heap_changelog import (Chain, ChainTracker, ChangeLog, Changes,
                                                 HeapIncrementalSnapshot, HeapStateOptions)
from raystream.checkpoint.heap_ttl import (TtlAggregatingState, TtlListState, TtlMapState,
                                           TtlReducingState, TtlValueState, store_list)
from raystream.checkpoint.keygroups import check_key_group_range, key_group_of
from raystream.checkpoint.state import (ATOMIC, MISSING, AggregateFunction, AggregatingState,
                                        ListState, MapState, ReducingState, StateTable,
                                        ValueState, entry_key, key_of)
from raystream.checkpoint.ttl import TTL_KIND_SUFFIX as _TTL_SUFFIX
from raystream.checkpoint.ttl import (StateTtlConfig, TtlTimeProvider, check_state_kind,
                                      is_expired, live_elements, live_entries, ttl_kind,
                                      wall_clock_ms)

__all__ = ["CHUNK_ENTRIES", "HeapKeyedStateBackend", "StateSnapshot"]

CHUNK_ENTRIES = 8192

_VALUE, _LIST, _MAP, _REDUCING, _AGGREGATING = "value", "list", "map", "reducing", "aggregating"


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
            if name not in self._expiry and ATOMIC.issuperset(map(type, written.values())):
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
    is bound to one kind of state. See :mod:`raystream.checkpoint.state` for the
    copy-on-write snapshot scheme and the ownership contract, and the module docstring
    for the threading contract.
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
        self._tables: dict[str, StateTable] = {}
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
        self._kk: Any = None  # entry_key(current key, current namespace)

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
        self._kk = entry_key(key, self._ns)

    @property
    def current_key(self) -> Any:
        return self._key

    @property
    def current_key_group(self) -> int | None:
        return None if self._kg_idx is None else self._kg_start + self._kg_idx

    def set_namespace(self, namespace: Any) -> None:
        """Scope subsequent state accesses to ``namespace`` (hashable; None by default)."""
        self._ns = namespace
        self._kk = entry_key(self._key, namespace)

    @property
    def current_namespace(self) -> Any:
        return self._ns

    # -- state handles -------------------------------------------------------
    def _table(self, name: str, kind: str, ttl: StateTtlConfig | None = None) -> StateTable:
        kind = ttl_kind(kind, name, ttl)
        t = self._tables.get(name)
        if t is None:
            t = self._tables[name] = StateTable(self, name, kind)
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
        cls = ValueState if ttl is None else TtlValueState
        return cls(self, self._table(name, _VALUE, ttl), default)

    def list_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> ListState:
        cls = ListState if ttl is None else TtlListState
        return cls(self, self._table(name, _LIST, ttl))

    def map_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> MapState:
        cls = MapState if ttl is None else TtlMapState
        return cls(self, self._table(name, _MAP, ttl))

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any], *,
                       ttl: StateTtlConfig | None = None) -> ReducingState:
        cls = ReducingState if ttl is None else TtlReducingState
        return cls(self, self._table(name, _REDUCING, ttl), reduce)

    def aggregating_state(self, name: str, aggregate: AggregateFunction, *,
                          ttl: StateTtlConfig | None = None) -> AggregatingState:
        cls = AggregatingState if ttl is None else TtlAggregatingState
        return cls(self, self._table(name, _AGGREGATING, ttl), aggregate)

    def _cleanup_step(self, t: StateTable, now: int) -> None:
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
            e = kgm.m.get(kk, MISSING)
            if e is MISSING:
                continue
            if base == _LIST:
                if any(is_expired(x[1], expires, now) for x in e):
                    store_list(kgm, kk, live_elements(kgm.owned(kk), expires, now))
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
    def _iter_keys(t: StateTable) -> Iterator[Any]:
        for kg in t.kgs:
            if kg.m:
                yield from dict.fromkeys([key_of(kk) for kk in kg.m])

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
                kgm.adopt(values)

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
            self._table(name, kind).kgs[i].put(entry_key(key, namespace), value)

    def __repr__(self) -> str:
        return (f"HeapKeyedStateBackend(max_parallelism={self.max_parallelism}, "
                f"key_groups={self.key_groups!r}, states={list(self._tables)})")
