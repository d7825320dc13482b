"""The envelope every key-group section of a checkpoint starts with: what it holds
and what it was written for, checked in one place before a section's body is read.

Layout (16 bytes, big-endian ``struct(">4sHHII")``): the kind's magic bytes,
the kind's format version, the key-group hash version
(``keygroups.HASH_VERSION``), max_parallelism and the key group. The body
that follows is the kind's own (see :mod:`raystream.checkpoint.heap_backend`,
:mod:`raystream.checkpoint.disk_state` and :mod:`raystream.timers.service`).

    >>> envelope = Envelope.current(SectionKind.TIMERS, max_parallelism=128, key_group=5)
    >>> section = envelope.pack() + b"timer body"
    >>> found, body = read(section, key_group=5, max_parallelism=128, kinds=[SectionKind.TIMERS])
    >>> found == envelope, bytes(body)
    (True, b'timer body')
    >>> is_keyed_state(section)
    False
    >>> read(section, key_group=5, max_parallelism=128, kinds=KEYED_STATE)
    Traceback (most recent call last):
    ...
    ValueError: key group 5: a timer section, not a heap keyed-state, disk keyed-state or heap keyed-state changes section
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from raystream.checkpoint.keygroups import HASH_VERSION

__all__ = ["KEYED_STATE", "Envelope", "SectionKind", "is_keyed_state", "read"]

# magic, format version, hash version, max_parallelism, key group
_LAYOUT = struct.Struct(">4sHHII")


class SectionKind(Enum):
    """What a section holds, by the magic bytes it starts with."""

    HEAP_STATE = b"RSKS"  # keyed state of the heap backend
    HEAP_CHANGES = b"RSKC"  # what changed in the heap backend since an earlier snapshot
    DISK_STATE = b"RSKD"  # keyed state of the disk (RocksDB) backend
    TIMERS = b"RSTM"  # a keyed operator's timers

    @property
    def magic(self) -> bytes:
        return self.value

    @property
    def noun(self) -> str:
        return _NOUNS[self]

    @property
    def readable_versions(self) -> tuple[int, ...]:
        """The body format versions this raystream reads, oldest first."""
        return _VERSIONS[self]

    @property
    def format_version(self) -> int:
        """The body format version this raystream writes (the newest it reads)."""
        return _VERSIONS[self][-1]


_NOUNS = {SectionKind.HEAP_STATE: "heap keyed-state", SectionKind.DISK_STATE: "disk keyed-state",
          SectionKind.HEAP_CHANGES: "heap keyed-state changes", SectionKind.TIMERS: "timer"}
# A kind's body format versions, oldest first: bump (and keep reading the old ones) when
# the body changes. Heap 2: entries of the None namespace are keyed by the plain key.
_VERSIONS = {SectionKind.HEAP_STATE: (2,), SectionKind.DISK_STATE: (1,),
             SectionKind.HEAP_CHANGES: (1,), SectionKind.TIMERS: (1,)}
_BY_MAGIC = {kind.magic: kind for kind in SectionKind}

# Keyed state of either backend: each restores the other's (a job may switch backends
# through a savepoint); the heap backend's changes only follow its own full sections.
KEYED_STATE = (SectionKind.HEAP_STATE, SectionKind.DISK_STATE, SectionKind.HEAP_CHANGES)


@dataclass(frozen=True, slots=True)
class Envelope:
    """The first :attr:`SIZE` bytes of a section."""

    kind: SectionKind
    format_version: int
    hash_version: int
    max_parallelism: int
    key_group: int

    SIZE = _LAYOUT.size

    @classmethod
    def current(cls, kind: SectionKind, *, max_parallelism: int, key_group: int) -> Envelope:
        """The envelope this raystream writes for ``kind``."""
        return cls(kind, kind.format_version, HASH_VERSION, max_parallelism, key_group)

    def pack(self) -> bytes:
        return _LAYOUT.pack(self.kind.magic, self.format_version, self.hash_version,
                            self.max_parallelism, self.key_group)


def read(section: bytes | memoryview, *, key_group: int, max_parallelism: int,
         kinds: Collection[SectionKind]) -> tuple[Envelope, memoryview]:
    """The envelope of ``section`` and its body, once the envelope says the section is
    one of ``kinds``, in a format this raystream reads, written for this key group
    with this raystream's key-group hash and ``max_parallelism``; else ValueError."""
    view = memoryview(section)
    nouns = [kind.noun for kind in kinds]
    wanted = " or ".join(filter(None, [", ".join(nouns[:-1]), nouns[-1]]))
    if len(view) < _LAYOUT.size:
        raise ValueError(f"key group {key_group}: {wanted} section too short ({len(view)} "
                         f"bytes, less than its {_LAYOUT.size}-byte envelope): truncated")
    magic, fmt, hash_version, max_par, section_kg = _LAYOUT.unpack_from(view)
    kind = _BY_MAGIC.get(magic)
    if kind is None or kind not in kinds:
        found = f"unknown magic bytes {magic!r}" if kind is None else f"a {kind.noun} section"
        raise ValueError(f"key group {key_group}: {found}, not a {wanted} section")
    if fmt not in kind.readable_versions:
        raise ValueError(
            f"key group {key_group}: unsupported {kind.noun} section format {fmt}: this "
            f"raystream reads format {', '.join(map(str, kind.readable_versions))} (restore "
            f"it with the raystream version that wrote it)")
    if hash_version != HASH_VERSION:
        raise ValueError(
            f"key group {key_group}: {kind.noun} section written with key-group hash version "
            f"{hash_version}, this raystream uses {HASH_VERSION}: its keys would belong to "
            f"other key groups (restore it with the raystream version that wrote it)")
    if max_par != max_parallelism:
        raise ValueError(
            f"key group {key_group}: {kind.noun} section written with max_parallelism "
            f"{max_par}, restoring with {max_parallelism}: keyed state and timers restore "
            f"only at the max_parallelism they were written with (set it back to {max_par})")
    if section_kg != key_group:
        raise ValueError(f"{kind.noun} section handed over as key group {key_group} holds "
                         f"key group {section_kg}")
    return Envelope(kind, fmt, hash_version, max_par, section_kg), view[_LAYOUT.size:]


def is_keyed_state(section: bytes | memoryview) -> bool:
    """Is ``section`` keyed state of either backend (by its magic bytes; nothing else
    is checked: :func:`read` does that)?"""
    return _BY_MAGIC.get(bytes(section[:4])) in KEYED_STATE
