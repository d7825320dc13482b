"""Timer service of a keyed operator: event-time and processing-time timer heaps
over one append-only key table, with flat-copy snapshots partitioned by key group
in the background (Flink ``InternalTimerServiceImpl``,
``HeapPriorityQueueSnapshotRestoreWrapper``, ``KeyGroupPartitioner``).

Key table
---------
Timers name their key by a dense int64 *key id* of the service's
:class:`~raystream.timers.key_table.KeyTable`. Here it only ever grows: an id,
once given, keeps its key and key group, so a snapshot captures the table by its
current length, and its reference to the key-group array stays valid while the
processing thread appends.

Snapshots
---------
:meth:`TimerService.snapshot` is the synchronous part: one memcpy per heap
column (``TimerHeap.arrays``) and the key table's length, nothing else. The
:class:`TimerSnapshot` it returns is the asynchronous part, to run on a
background thread while the service keeps changing: it partitions the copies by
key group with a stable radix argsort on the key-group column (a counting sort)
and writes one section per non-empty key group. Dedup and position indexes are
not written; :meth:`TimerService.restore` rebuilds them (vectorized), at any
parallelism: timers follow their key groups.

Section format
--------------
The envelope of :mod:`raystream.checkpoint.envelope` (magic ``b"RSTM"``, format
version, key-group hash version, max_parallelism, key group), then three
big-endian ``uint64``: the number of event-time timers, of processing-time
timers and of keys. Then six little-endian int64 arrays:
event-time timestamps, key indexes, namespaces, then processing-time
timestamps, key indexes, namespaces (a key index points into the section's key
list). Then the section's keys as consecutive pickled lists (protocol 5) of at
most ``CHUNK_ENTRIES`` keys: each is pickled in one C call holding the GIL, so
chunks bound how long the background writer can stall the processing thread,
however many keys a key group holds. Restore checks the envelope. As for keyed
state, the bytes are only ever read back by the same job's restore.

Example:
    >>> from raystream.checkpoint.keygroups import key_group_of
    >>> timers = TimerService(max_parallelism=128, key_groups=range(128))
    >>> alice = timers.key_id("alice", key_group_of("alice", 128))
    >>> timers.register_event_time_timer(alice, 0, 1999)
    >>> timers.register_processing_time_timer(alice, 0, 5_000)
    >>> write = timers.snapshot()            # synchronous part: flat copies
    >>> timers.delete_event_time_timer(alice, 0, 1999)
    >>> sections = write()                   # asynchronous part: {key group: bytes}
    >>> restored = TimerService(max_parallelism=128, key_groups=range(128))
    >>> restored.restore(sections.items())
    >>> ts, key_ids, namespaces = restored.advance_watermark(2000)
    >>> ts.tolist(), restored.keys(key_ids), namespaces.tolist()
    ([1999], ['alice'], [0])
    >>> restored.next_processing_time()
    5000
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterable, cast

import numpy as np

from raystream.checkpoint.envelope import Envelope, SectionKind, read
from raystream.checkpoint.heap_backend import CHUNK_ENTRIES
from raystream.timers.heap import TimerHeap
from raystream.timers.key_table import KeyTable

__all__ = ["TimerSection", "TimerService", "TimerSnapshot", "read_timer_section"]

# after the envelope: event-time timers, processing-time timers, keys
_COUNTS = struct.Struct(">QQQ")
# a heap's timers: (timestamps, key ids, namespaces)
_Timers = tuple[np.ndarray, np.ndarray, np.ndarray]
_I64 = np.dtype("<i8")


@dataclass(frozen=True)
class TimerSection:
    """A timer section read back: per domain (timestamps, key indexes, namespaces),
    the key indexes pointing into ``keys``."""

    event: _Timers
    processing: _Timers
    keys: list


def read_timer_section(kg: int, data: bytes, max_parallelism: int) -> TimerSection:
    """Parse the timer section of key group ``kg`` (format in the module docstring)."""
    _, view = read(data, key_group=kg, max_parallelism=max_parallelism,
                   kinds=(SectionKind.TIMERS,))  # the body, after the envelope
    if len(view) < _COUNTS.size:
        raise ValueError(f"key group {kg}: timer section truncated in its counts")
    n_ev, n_pt, n_keys = _COUNTS.unpack_from(view)
    offset = _COUNTS.size
    arrays = []
    for count in (n_ev, n_ev, n_ev, n_pt, n_pt, n_pt):
        end = offset + 8 * count
        if end > len(view):
            raise ValueError(f"key group {kg}: timer section truncated")
        arrays.append(np.frombuffer(view, _I64, count, offset).astype(np.int64))
        offset = end
    keys: list = []
    stream = io.BytesIO(view[offset:])
    while len(keys) < n_keys:
        try:
            chunk = pickle.load(stream)  # a fresh memo per chunk, as each was written
        except (EOFError, pickle.UnpicklingError) as e:
            raise ValueError(f"key group {kg}: timer section truncated in its keys") from e
        if not isinstance(chunk, list):
            break
        keys += chunk
    if len(keys) != n_keys:
        raise ValueError(f"key group {kg}: timer section holds a bad key list")
    for local in (arrays[1], arrays[4]):
        if local.size and (local.min() < 0 or local.max() >= n_keys):
            raise ValueError(f"key group {kg}: timer section refers to a missing key")
    return TimerSection((arrays[0], arrays[1], arrays[2]), (arrays[3], arrays[4], arrays[5]),
                        keys)


class TimerSnapshot:
    """The asynchronous part of a timer snapshot: call it (on any thread) to get
    ``{key_group: section_bytes}`` for every key group holding timers.

    It owns flat copies of both heaps and reads only the first ``n_keys``
    entries of the append-only key table, so it sees exactly the timers present
    when :meth:`TimerService.snapshot` was called.

    Example:
        >>> timers = TimerService(max_parallelism=4, key_groups=range(4))
        >>> timers.register_event_time_timer(timers.key_id("k", 2), 0, 10)
        >>> sorted(timers.snapshot()())
        [2]
    """

    def __init__(self, *, max_parallelism: int, event: tuple[np.ndarray, ...],
                 processing: tuple[np.ndarray, ...], keys: list, key_groups: np.ndarray,
                 n_keys: int) -> None:
        self._max_parallelism = max_parallelism
        self._event = event
        self._processing = processing
        self._keys = keys  # the live, append-only list: read below n_keys only
        self._key_groups = key_groups  # never mutated below n_keys
        self._n_keys = n_keys

    @property
    def num_timers(self) -> int:
        return len(self._event[0]) + len(self._processing[0])

    def __call__(self) -> dict[int, bytes]:
        max_par = self._max_parallelism
        ev_ts, ev_kid, ev_ns = self._event
        pt_ts, pt_kid, pt_ns = self._processing
        key_group_of_id = self._key_groups[:self._n_keys]
        # Keys referenced by any timer, ordered by (key group, key id); each gets
        # its index within its key group's key list.
        referenced = np.zeros(self._n_keys, bool)
        referenced[ev_kid] = True
        referenced[pt_kid] = True
        key_ids = np.flatnonzero(referenced)
        key_ids = key_ids[np.argsort(key_group_of_id[key_ids], kind="stable")]
        keys_per_group = np.bincount(key_group_of_id[key_ids], minlength=max_par)
        key_starts = np.concatenate(([0], np.cumsum(keys_per_group)))
        local_index = np.zeros(self._n_keys, np.int64)
        local_index[key_ids] = (np.arange(len(key_ids), dtype=np.int64)
                                - np.repeat(key_starts[:-1], keys_per_group))

        def partition(kid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            groups = key_group_of_id[kid]
            # stable argsort of a 16-bit column is a radix (counting) sort
            return (np.argsort(groups, kind="stable"),
                    np.concatenate(([0], np.cumsum(np.bincount(groups, minlength=max_par)))))

        ev_order, ev_starts = partition(ev_kid)
        pt_order, pt_starts = partition(pt_kid)
        keys = self._keys
        sections: dict[int, bytes] = {}
        for kg in np.flatnonzero(keys_per_group).tolist():
            e = ev_order[ev_starts[kg]:ev_starts[kg + 1]]
            p = pt_order[pt_starts[kg]:pt_starts[kg + 1]]
            ids = key_ids[key_starts[kg]:key_starts[kg + 1]].tolist()
            group_keys = [keys[i] for i in ids]
            sections[kg] = b"".join((
                Envelope.current(SectionKind.TIMERS, max_parallelism=max_par, key_group=kg).pack(),
                _COUNTS.pack(len(e), len(p), len(group_keys)),
                ev_ts[e].astype(_I64, copy=False).tobytes(),
                local_index[ev_kid[e]].astype(_I64, copy=False).tobytes(),
                ev_ns[e].astype(_I64, copy=False).tobytes(),
                pt_ts[p].astype(_I64, copy=False).tobytes(),
                local_index[pt_kid[p]].astype(_I64, copy=False).tobytes(),
                pt_ns[p].astype(_I64, copy=False).tobytes(),
                *(pickle.dumps(group_keys[i:i + CHUNK_ENTRIES], protocol=5)
                  for i in range(0, len(group_keys), CHUNK_ENTRIES)),
            ))
        return sections


class TimerService(KeyTable):
    """Timers of one keyed operator subtask: an event-time and a processing-time
    :class:`~raystream.timers.heap.TimerHeap` sharing one append-only key table.

    A timer is (timestamp, key id, namespace), unique on all three; namespace
    is an int64 chosen by the caller (0 = none; window operators use the window
    start). Event-time timers fire when the watermark reaches them
    (``timestamp <= watermark``), processing-time timers when the clock does,
    in (timestamp, key id, namespace) order. All methods but the returned
    :class:`TimerSnapshot` run on the operator's processing thread.

    Example:
        >>> import numpy as np
        >>> from raystream.checkpoint.keygroups import key_group_of
        >>> timers = TimerService(max_parallelism=128, key_groups=range(0, 64))
        >>> keys = ["a", "b", "f"]
        >>> groups = np.array([key_group_of(k, 128) for k in keys])
        >>> groups.tolist()  # within this subtask's key groups 0..63
        [50, 3, 59]
        >>> ids = timers.key_ids(keys, groups)
        >>> timers.register_event_time_timers(ids, np.zeros(3, np.int64), np.array([30, 10, 20]))
        >>> ts, key_ids, _ = timers.advance_watermark(20)
        >>> ts.tolist(), timers.keys(key_ids)
        ([10, 20], ['b', 'f'])
        >>> timers.key_id("c", key_group_of("c", 128))
        Traceback (most recent call last):
        ValueError: key 'c' is in key group 95, outside this subtask's key groups 0..63
        >>> timers.num_event_time_timers
        1
    """

    def __init__(self, *, max_parallelism: int, key_groups: range) -> None:
        super().__init__(max_parallelism=max_parallelism, key_groups=key_groups)
        self._event = TimerHeap()
        self._processing = TimerHeap()
        self._restored: set[int] = set()

    # -- event time -----------------------------------------------------------
    def register_event_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Fire at ``timestamp`` once the watermark reaches it (no-op if already set)."""
        self._event.add(timestamp, self._check_key_id(key_id), namespace)

    def register_event_time_timers(self, key_ids: np.ndarray, namespaces: np.ndarray,
                                   timestamps: np.ndarray) -> None:
        """Bulk :meth:`register_event_time_timer` (arrays; vectorized)."""
        self._event.add_many(timestamps, self._check_key_ids(key_ids), namespaces)

    def delete_event_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Delete an event-time timer (no-op if absent)."""
        self._event.remove(timestamp, key_id, namespace)

    def advance_watermark(self, watermark: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pop the event-time timers with ``timestamp <= watermark``:
        (timestamps, key_ids, namespaces) in timer order."""
        return self._event.pop_until(watermark)

    def next_event_time(self) -> int | None:
        """The earliest event-time timer's timestamp, or None."""
        head = self._event.peek()
        return None if head is None else head[0]

    @property
    def num_event_time_timers(self) -> int:
        return len(self._event)

    # -- processing time ------------------------------------------------------
    def register_processing_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Fire at wall-clock ``timestamp`` (ms; no-op if already set)."""
        self._processing.add(timestamp, self._check_key_id(key_id), namespace)

    def register_processing_time_timers(self, key_ids: np.ndarray, namespaces: np.ndarray,
                                        timestamps: np.ndarray) -> None:
        """Bulk :meth:`register_processing_time_timer` (arrays; vectorized)."""
        self._processing.add_many(timestamps, self._check_key_ids(key_ids), namespaces)

    def delete_processing_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        """Delete a processing-time timer (no-op if absent)."""
        self._processing.remove(timestamp, key_id, namespace)

    def next_processing_time(self) -> int | None:
        """The earliest processing-time timer's timestamp (when to wake up), or None."""
        head = self._processing.peek()
        return None if head is None else head[0]

    def fire_processing_time(self, now_ms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Pop the processing-time timers with ``timestamp <= now_ms``, in timer order."""
        return self._processing.pop_until(now_ms)

    @property
    def num_processing_time_timers(self) -> int:
        return len(self._processing)

    # -- checkpoints ----------------------------------------------------------
    def snapshot(self) -> TimerSnapshot:
        """Synchronous part of a checkpoint: flat copies of both heaps and the key
        table's length. Call the result (on any thread) for ``{key_group: bytes}``."""
        return TimerSnapshot(max_parallelism=self.max_parallelism,
                             event=self._event.arrays(), processing=self._processing.arrays(),
                             keys=self._keys, key_groups=self._kg, n_keys=len(self._keys))

    def restore(self, sections: Iterable[tuple[int, bytes]] | Mapping[int, bytes]) -> None:
        """Add the timers of snapshot ``sections`` (``(key_group, bytes)`` pairs, each key
        group once, all within ``self.key_groups``), written at any parallelism."""
        if isinstance(sections, Mapping):  # the Mapping[int, bytes] of the union
            sections = cast(Mapping[int, bytes], sections).items()
        event: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        processing: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for kg, data in sections:
            if kg not in self.key_groups:
                raise ValueError(
                    f"timer section of key group {kg} handed to a subtask owning key groups "
                    f"{self.key_groups.start}..{self.key_groups.stop - 1}")
            if kg in self._restored:
                raise ValueError(f"timers of key group {kg} restored twice")
            ev, pt = self._read_section(kg, data)
            event.append(ev)
            processing.append(pt)
            self._restored.add(kg)
        for heap, parts in ((self._event, event), (self._processing, processing)):
            if parts:
                ts, kid, ns = (np.concatenate(cols) for cols in zip(*parts))
                heap.add_many(ts, kid, ns)

    def _read_section(self, kg: int, data: bytes) -> tuple[_Timers, _Timers]:
        section = read_timer_section(kg, data, self.max_parallelism)
        ids = self.key_ids(section.keys, np.full(len(section.keys), kg, np.int64))
        (ev_ts, ev_local, ev_ns), (pt_ts, pt_local, pt_ns) = section.event, section.processing
        return ((ev_ts, ids[ev_local], ev_ns), (pt_ts, ids[pt_local], pt_ns))

    def restore_keyed_timers(self, key_group: int, event: tuple[np.ndarray, list, np.ndarray],
                             processing: tuple[np.ndarray, list, np.ndarray]) -> None:
        """Add timers of key group ``key_group`` given with their keys, each domain as
        (timestamps, keys, namespaces): the timers of a disk job's savepoint."""
        if key_group not in self.key_groups:
            raise ValueError(
                f"timers of key group {key_group} handed to a subtask owning key groups "
                f"{self.key_groups.start}..{self.key_groups.stop - 1}")
        for heap, (ts, keys, ns) in ((self._event, event), (self._processing, processing)):
            if len(keys):
                heap.add_many(ts, self.key_ids(keys, np.full(len(keys), key_group, np.int64)),
                              ns)

    def __repr__(self) -> str:
        return (f"TimerService(key_groups={self.key_groups!r}, keys={len(self._keys)}, "
                f"event_time_timers={len(self._event)}, "
                f"processing_time_timers={len(self._processing)})")
