"""One state file holding many key-group sections, readable by key-group range.

Layout: ``b"RSKG"``, a uint32 count, then per section (int32 key group,
uint64 offset, uint64 length), then the sections' bytes. A restoring
subtask reads the table and takes only the key groups of its range.

    >>> blob = encode_sections({3: b"abc", 7: b"de"})
    >>> list(decode_sections(blob, range(0, 5)))
    [(3, b'abc')]

A key group's section may hold several named parts (an operator's keyed state
*and* its timers, for example): :func:`encode_parts` / :func:`decode_parts`.

    >>> decode_parts(encode_parts({"state": b"s", "timers": b"tt"}))
    {'state': b's', 'timers': b'tt'}
"""

from __future__ import annotations

import struct
from typing import Iterator, Mapping

MAGIC = b"RSKG"
PARTS_MAGIC = b"RSKP"
_HEADER = struct.Struct("<4sI")
_ENTRY = struct.Struct("<iQQ")


def encode_sections(sections: Mapping[int, bytes]) -> bytes:
    groups = sorted(sections)
    table_end = _HEADER.size + _ENTRY.size * len(groups)
    parts, entries, offset = [], [], table_end
    for group in groups:
        data = sections[group]
        entries.append(_ENTRY.pack(group, offset, len(data)))
        parts.append(data)
        offset += len(data)
    return b"".join([_HEADER.pack(MAGIC, len(groups)), *entries, *parts])


def decode_sections(blob: bytes, key_groups: range) -> Iterator[tuple[int, bytes]]:
    magic, count = _HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise ValueError("not a key-group state file (bad magic)")
    view = memoryview(blob)
    for i in range(count):
        group, offset, length = _ENTRY.unpack_from(blob, _HEADER.size + i * _ENTRY.size)
        if group in key_groups:
            yield group, bytes(view[offset:offset + length])


def encode_parts(parts: Mapping[str, bytes]) -> bytes:
    """Named byte strings in one section: magic, count, then (name, length, bytes) each."""
    out = [PARTS_MAGIC, struct.pack("<I", len(parts))]
    for name, data in parts.items():
        encoded = name.encode()
        out += [struct.pack("<HQ", len(encoded), len(data)), encoded, data]
    return b"".join(out)


def decode_parts(blob: bytes) -> dict[str, bytes]:
    if blob[:4] != PARTS_MAGIC:
        raise ValueError("not a multi-part key-group section (bad magic)")
    (count,) = struct.unpack_from("<I", blob, 4)
    view, offset, parts = memoryview(blob), 8, {}
    for _ in range(count):
        name_len, length = struct.unpack_from("<HQ", blob, offset)
        offset += 10
        name = bytes(view[offset:offset + name_len]).decode()
        offset += name_len
        parts[name] = bytes(view[offset:offset + length])
        offset += length
    return parts
