"""The asynchronous part of a disk keyed-state snapshot, and the format of its sections.

:meth:`~raystream.checkpoint.disk_state.DiskKeyedStateBackend.snapshot` is the
synchronous part of a checkpoint: it creates a RocksDB iterator over the backend's key
range (O(1), no copying; a RocksDB iterator reads the database as of its creation, like
a snapshot) and returns the asynchronous part, a :class:`DiskStateSnapshot` that runs
that iterator on the checkpointing thread while processing goes on, giving one section
per non-empty key group: a full snapshot, every checkpoint writes all state. With
``DiskStateOptions(incremental=True)`` the synchronous part also flushes the
memtable and makes a local RocksDB checkpoint (hard links), and a checkpoint
uploads only the SST files no completed checkpoint has uploaded before,
referencing the others again (:mod:`raystream.checkpoint.disk_incremental`;
:meth:`~raystream.checkpoint.disk_state.DiskKeyedStateBackend.restore_db` reads such a
checkpoint back, at any parallelism). A savepoint is always full, in the section format
below.

Section format: the envelope of :mod:`raystream.checkpoint.envelope` (magic
``b"RSKD"``, format version, key-group hash version, max_parallelism, key
group); a big-endian ``uint32`` length and a MessagePack directory
``[[state id, name, kind], ...]`` (kind ``"+ttl"``-suffixed for a state with a
TTL); then entries ``state id (uint16) | len (uint32) | key suffix | len
(uint32) | value``, the suffix and value exactly as stored (no
re-serialization; only a TTL list or map with expired parts is rewritten
without them).
Either backend restores the other's sections, so a job switches backends by
restoring a savepoint with the other ``state_backend``. The timers of a disk job are
entries of kind :data:`~raystream.checkpoint.disk_sections.TIMERS_KIND` in the same
database (:mod:`raystream.timers.disk_service`), so sections carry them too:
:func:`~raystream.checkpoint.disk_sections.section_entries` leaves them out and
:func:`~raystream.checkpoint.disk_sections.section_timer_entries` gives them to a heap
job's timer service.

In a snapshot's directory the kind of a state with a TTL carries the heap
backend's ``+ttl`` suffix (``"value+ttl"``...), so a restore declaring the
state without a TTL (or a state without one with a TTL) is refused, as in
Flink, and a section moves between backends with its timestamps: the heap
backend stores ``(value, ts)`` (per element, per entry) and converts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterator

from raystream.checkpoint.disk_layout import pack_value, state_id_of
from raystream.checkpoint.disk_sections import SECTION_LENGTH, unexpired
from raystream.checkpoint.envelope import Envelope, SectionKind

if TYPE_CHECKING:  # (the backend takes these snapshots)
    from raystream.checkpoint.disk_state import DiskKeyedStateBackend

__all__ = ["DiskStateSnapshot"]


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
