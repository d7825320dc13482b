"""The disk backend's checkpoint sections and its values with a TTL: the formats the heap
backend reads too, when a job switches backends through a savepoint.

A section of key group ``g`` is its envelope (:mod:`raystream.checkpoint.envelope`),
then the directory of its states (``[[state id, name, kind], ...]``, MessagePack, after
its length), then every entry as state id (2 bytes), key suffix and value (each after
its uint32 length): the database's own bytes (:mod:`raystream.checkpoint.disk_layout`).

    >>> ttl_base("value" + TTL_KIND_SUFFIX), ttl_base("value")
    ('value', None)
    >>> raw = from_heap_value("value", ("x", 1_000))
    >>> to_heap_value("value", raw)
    ('x', 1000)
"""

from __future__ import annotations

import struct
from typing import Any, Iterator

from raystream.checkpoint.disk_layout import STATE_ID, pack_value, unpack_value
from raystream.checkpoint.envelope import KEYED_STATE, SectionKind, read
from raystream.checkpoint.ttl import TTL_KIND_SUFFIX, is_expired, live_elements, live_entries

__all__ = ["NEVER_EXPIRES", "SECTION_LENGTH", "TIMERS_KIND", "TTL_HEADER", "encode_ttl_list",
           "encode_ttl_map", "from_heap_value", "oldest_live", "parse_body",
           "section_entries", "section_state_kinds", "section_timer_entries", "to_heap_value",
           "ttl_base", "unexpired"]

SECTION_LENGTH = struct.Struct(">I")  # lengths in a section's directory and entries
TTL_HEADER = struct.Struct(">q")  # the timestamp before every value of a state with a TTL
NEVER_EXPIRES = (1 << 63) - 1
_LIST, _MAP = "list", "map"  # the state kinds whose elements expire one by one
# The kind of the timer service's entries (raystream.timers.disk_service): not keyed state
# of the heap backend's kinds, so section_entries leaves them to the timer service.
TIMERS_KIND = "timers"


# ---------------------------------------------------------------------------
# Values of states with a TTL: an 8-byte timestamp, then the MessagePack bytes
# ---------------------------------------------------------------------------
# value, reducing, aggregating: ts | value, ts the processing time of the last renewal
# list: min ts | [[element, ts], ...]   (every element expires on its own)
# map:  min ts | {user key: [value, ts]} (every entry expires on its own)
# So whether anything of a stored value has expired is one look at its first 8 bytes
# (snapshots and the cleanup unpack only values with something expired), and a read
# that renews a single value rewrites its header only.

def ttl_base(kind: str) -> str | None:
    """The plain kind of a stored kind with a TTL, None for a state without one."""
    return kind[:-len(TTL_KIND_SUFFIX)] if kind.endswith(TTL_KIND_SUFFIX) else None


def encode_ttl_list(entries: list) -> bytes:
    """A TTL list state's stored value from ``[[element, ts], ...]`` (not empty)."""
    return TTL_HEADER.pack(min(e[1] for e in entries)) + pack_value(entries)


def encode_ttl_map(entries: dict) -> bytes:
    """A TTL map state's stored value from ``{user key: [value, ts]}`` (not empty)."""
    return TTL_HEADER.pack(min(e[1] for e in entries.values())) + pack_value(entries)


def oldest_live(raw: bytes, ttl_ms: int, now: int) -> bool:
    """Whether nothing in ``raw``, a TTL list or map state's stored value, has expired at
    ``now``: its header holds the oldest timestamp."""
    return not is_expired(TTL_HEADER.unpack_from(raw)[0], ttl_ms, now)


def unexpired(base: str, raw: bytes, ttl_ms: int, now: int) -> bytes | None:
    """``raw`` (a stored value of a TTL state of kind ``base``) without what has expired
    at ``now``: ``raw`` itself when nothing has, None when everything has."""
    if oldest_live(raw, ttl_ms, now):
        return raw
    if base == _LIST:
        live = live_elements(unpack_value(raw[8:]), ttl_ms, now)
        return encode_ttl_list(live) if live else None
    if base == _MAP:
        kept = live_entries(unpack_value(raw[8:]), ttl_ms, now)
        return encode_ttl_map(kept) if kept else None
    return None


def from_heap_value(base: str, value: Any) -> bytes:
    """The stored value of a heap TTL state's value (``(value, ts)``, ``[(element,
    ts), ...]`` or ``{user key: (value, ts)}``)."""
    if base == _LIST:
        return encode_ttl_list([[e, ts] for e, ts in value])
    if base == _MAP:
        return encode_ttl_map({k: [v, ts] for k, (v, ts) in value.items()})
    return TTL_HEADER.pack(value[1]) + pack_value(value[0])


def to_heap_value(base: str, raw: bytes) -> Any:
    """The heap backend's value of a stored value of a TTL state (see :func:`from_heap_value`)."""
    if base == _LIST:
        return [(e, ts) for e, ts in unpack_value(raw[8:])]
    if base == _MAP:
        return {k: (v, ts) for k, (v, ts) in unpack_value(raw[8:]).items()}
    return unpack_value(raw[8:]), TTL_HEADER.unpack_from(raw)[0]


def parse_body(kg: int, body: memoryview
                ) -> tuple[dict[bytes, tuple[str, str]], list[tuple[bytes, bytes, bytes]]]:
    """Split the body of a disk section (after its envelope): ``{state id: (name, kind)}``
    and ``[(state id, key suffix, value), ...]``, all still serialized."""
    if len(body) < SECTION_LENGTH.size:
        raise ValueError(f"key group {kg}: disk keyed-state section truncated before its "
                         f"directory")
    data = bytes(body)
    pos = 0
    (n,) = SECTION_LENGTH.unpack_from(data, pos)
    pos += 4
    directory = {STATE_ID.pack(sid): (name, kind) for sid, name, kind in unpack_value(data[pos:pos + n])}
    pos += n
    entries = []
    end = len(data)
    while pos < end:
        sid = data[pos:pos + 2]
        (n,) = SECTION_LENGTH.unpack_from(data, pos + 2)
        pos += 6
        suffix = data[pos:pos + n]
        pos += n
        (n,) = SECTION_LENGTH.unpack_from(data, pos)
        pos += 4
        entries.append((sid, suffix, data[pos:pos + n]))
        pos += n
    return directory, entries


def section_state_kinds(group: int, section: bytes, max_parallelism: int) -> list[str]:
    """The kinds of the states in keyed-state ``section`` of key group ``group``: those
    its directory lists when it is the disk backend's, none when it is the heap's."""
    envelope, body = read(section, key_group=group, max_parallelism=max_parallelism,
                          kinds=KEYED_STATE)
    if envelope.kind is not SectionKind.DISK_STATE or len(body) < SECTION_LENGTH.size:
        return []
    (n,) = SECTION_LENGTH.unpack_from(body, 0)
    return [str(kind) for _, _, kind in unpack_value(bytes(body[SECTION_LENGTH.size:SECTION_LENGTH.size + n]))]


def section_entries(kg: int, body: memoryview, skip_kinds: tuple[str, ...] = ()
                    ) -> Iterator[tuple[str, str, Any, Any, Any]]:
    """``(state name, kind, key, namespace, value)`` of every entry of a disk section's
    body (after its envelope, which the caller checked), deserialized (a value of a
    state with a TTL as the heap backend stores it, with its timestamps): how the heap
    backend restores a disk backend's savepoint. Entries whose kind starts with one of
    ``skip_kinds`` (an operator's own layouts, which it moves itself) are left out."""
    directory, entries = parse_body(kg, body)
    for sid, suffix, value in entries:
        name, kind = directory[sid]
        if kind == TIMERS_KIND or (skip_kinds and kind.startswith(skip_kinds)):
            continue  # timers: section_timer_entries
        (n,) = SECTION_LENGTH.unpack_from(suffix, 0)
        ns = suffix[4 + n:]
        base = ttl_base(kind)
        yield (name, kind, unpack_value(suffix[4:4 + n]), (unpack_value(ns) if ns else None),
               unpack_value(value) if base is None else to_heap_value(base, value))


def section_timer_entries(kg: int, section: bytes, max_parallelism: int
                          ) -> Iterator[tuple[str, bytes]]:
    """``(state name, key suffix)`` of the timer entries (kind :data:`TIMERS_KIND`) of
    the keyed-state ``section`` of key group ``kg``: none in a heap backend's section."""
    envelope, body = read(section, key_group=kg, max_parallelism=max_parallelism,
                          kinds=KEYED_STATE)
    if envelope.kind is not SectionKind.DISK_STATE:
        return
    directory, entries = parse_body(kg, body)
    for sid, suffix, _ in entries:
        name, kind = directory[sid]
        if kind == TIMERS_KIND:
            yield name, suffix
