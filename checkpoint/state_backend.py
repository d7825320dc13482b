"""The keyed state backend seam: what keyed operators need from their state.

A keyed operator never builds its state backend itself: it asks
:func:`create_keyed_state_backend` for the kind its job chose
(``CheckpointConfig(state_backend=...)``), and talks to it only through the
:class:`KeyedStateBackend` protocol. The heap backend (``"heap"``, Flink's
``HashMapStateBackend``) is the default; the disk backend (``"disk"``, an
embedded RocksDB per operator instance, Flink's ``EmbeddedRocksDBStateBackend``,
see :mod:`raystream.checkpoint.disk_state`) plugs in here without changing any
operator. ``DiskStateOptions(memory_mb=..., local_dir=...)`` selects the disk
backend with settings.

A backend snapshots per key group: ``snapshot()`` is the synchronous part of a
checkpoint and returns a callable (the asynchronous part) giving one section
(bytes) per non-empty key group; ``restore`` takes sections of any key groups
and keeps those of its own range, which is how a job is restored at another
parallelism. (Where checkpoints are taken, the heap backend returns a
:class:`~raystream.checkpoint.heap_changelog.HeapIncrementalSnapshot`, unless
``HeapStateOptions(incremental=False)``: a checkpoint uploads it as a full
snapshot or the changes since the previous one. The disk backend with
``DiskStateOptions(incremental=True)`` returns an
:class:`~raystream.checkpoint.disk_incremental.IncrementalSnapshot`, uploaded as
new RocksDB files, which ``DiskKeyedStateBackend.restore_db`` reads back. Both
are callables too, giving full sections: a savepoint.)

>>> backend = create_keyed_state_backend(StateBackend.HEAP, max_parallelism=128,
...                                      key_groups=range(128))
>>> count = backend.value_state("count", default=0)
>>> backend.set_current_key("alice")
>>> count.update(count.value() + 1)
>>> sections = backend.snapshot()()
>>> all(backend.owns_section(s) for s in sections.values())
True
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.heap_backend import HeapKeyedStateBackend
from raystream.checkpoint.heap_changelog import HeapStateOptions
from raystream.checkpoint.ttl import StateTtlConfig
from raystream.checkpoint.state import AggregateFunction


class StateBackend(enum.StrEnum):
    """Where keyed state lives."""

    HEAP = "heap"  # Python objects in the subtask's memory, copy-on-write snapshots
    DISK = "disk"  # an embedded RocksDB per operator instance, RocksDB-snapshot checkpoints


class KeyedState(Protocol):
    """What a keyed state of each kind offers, whichever backend holds it (the heap
    backend's ``ValueState``, ..., the disk backend's ``DiskValueState``, ...)."""

    @property
    def name(self) -> str: ...

    def clear(self) -> None: ...


class KeyedValueState(KeyedState, Protocol):
    def value(self) -> Any: ...
    def update(self, value: Any) -> None: ...


class KeyedMergingState(KeyedState, Protocol):
    def merge_namespaces(self, target: Any, sources: Iterable[Any]) -> None: ...


class KeyedListState(KeyedMergingState, Protocol):
    def get(self) -> list: ...
    def add(self, value: Any) -> None: ...
    def add_all(self, values: Iterable[Any]) -> None: ...
    def update(self, values: Iterable[Any]) -> None: ...


class KeyedMapState(KeyedState, Protocol):
    def get(self, key: Any, default: Any = None) -> Any: ...
    def put(self, key: Any, value: Any) -> None: ...
    def put_all(self, mapping: Mapping[Any, Any]) -> None: ...
    def remove(self, key: Any) -> None: ...
    def contains(self, key: Any) -> bool: ...
    def keys(self) -> list: ...
    def values(self) -> list: ...
    def items(self) -> list: ...
    def is_empty(self) -> bool: ...


class KeyedReducingState(KeyedMergingState, Protocol):  # and aggregating state
    def get(self) -> Any: ...
    def add(self, value: Any) -> None: ...


class KeyedStateBackend(Protocol):
    """Keyed state of one operator instance, for the key groups ``key_groups``."""

    max_parallelism: int
    key_groups: range

    def set_current_key(self, key: Any, key_group: int | None = None) -> None: ...

    @property
    def current_key(self) -> Any: ...

    @property
    def current_key_group(self) -> int | None: ...

    def set_namespace(self, namespace: Any) -> None: ...

    # ttl: a StateTtlConfig, or None (both backends implement it)
    def value_state(self, name: str, default: Any = None, *,
                    ttl: StateTtlConfig | None = None) -> KeyedValueState: ...

    def list_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> KeyedListState: ...

    def map_state(self, name: str, *, ttl: StateTtlConfig | None = None) -> KeyedMapState: ...

    def reducing_state(self, name: str, reduce: Callable[[Any, Any], Any], *,
                       ttl: StateTtlConfig | None = None) -> KeyedReducingState: ...

    def aggregating_state(self, name: str, aggregate: AggregateFunction, *,
                          ttl: StateTtlConfig | None = None) -> KeyedReducingState: ...

    def state_names(self) -> list[str]: ...

    def keys(self, name: str) -> Iterator[Any]: ...

    def snapshot(self) -> Callable[[], dict[int, bytes]]: ...

    def restore(self, sections: Iterable[tuple[int, bytes]] | Mapping[int, bytes]) -> None: ...

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None: ...

    @staticmethod
    def owns_section(section: bytes) -> bool:
        """Is ``section`` one this kind of backend wrote (by its header)?"""
        ...


StateBackendChoice = StateBackend | str | DiskStateOptions | HeapStateOptions


def create_keyed_state_backend(kind: StateBackendChoice, *, max_parallelism: int,
                               key_groups: range, checkpointing: bool = False
                               ) -> KeyedStateBackend:
    """A new, empty backend of ``kind`` for ``key_groups``; ``checkpointing``: its
    snapshots are checkpoints (the heap backend's are then incremental, by default)."""
    if isinstance(kind, DiskStateOptions):
        return DiskKeyedStateBackend(max_parallelism=max_parallelism, key_groups=key_groups,
                                     options=kind)
    if state_backend_kind(kind) is StateBackend.DISK:
        return DiskKeyedStateBackend(max_parallelism=max_parallelism, key_groups=key_groups)
    options = kind if isinstance(kind, HeapStateOptions) else HeapStateOptions()
    return HeapKeyedStateBackend(max_parallelism=max_parallelism, key_groups=key_groups,
                                 options=options if checkpointing else None)


def normalize_state_backend(choice: StateBackendChoice
                            ) -> StateBackend | DiskStateOptions | HeapStateOptions:
    """A :class:`StateBackend`, or the options given (kept whole: they travel with the
    job's checkpoint settings to every subtask)."""
    if isinstance(choice, (DiskStateOptions, HeapStateOptions)):
        return choice
    return state_backend_kind(choice)


def is_disk(choice: StateBackendChoice) -> bool:
    """Does ``choice`` select the disk backend?

    >>> is_disk("disk"), is_disk(DiskStateOptions(memory_mb=32)), is_disk(StateBackend.HEAP)
    (True, True, False)
    """
    return isinstance(choice, DiskStateOptions) or state_backend_kind(choice) is StateBackend.DISK


def state_backend_kind(kind: StateBackendChoice) -> StateBackend:
    """``kind`` as a :class:`StateBackend`; a clear error naming the choices otherwise."""
    if isinstance(kind, DiskStateOptions):
        return StateBackend.DISK
    if isinstance(kind, HeapStateOptions):
        return StateBackend.HEAP
    try:
        return StateBackend(kind)
    except ValueError:
        choices = ", ".join(repr(k.value) for k in StateBackend)
        raise ValueError(f"unknown state backend {kind!r}: choose one of {choices}") from None
