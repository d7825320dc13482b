"""The byte layouts of the disk state backend's RocksDB: one module for every layout.

Values are MessagePack (:func:`pack_value`, :func:`unpack_value`): ints, floats,
strings, bytes, booleans, None, lists and dicts of those, tuples through an extension
type, anything else pickled in another (the database is the operator instance's own, so
its values are only ever read back by it or from its job's own checkpoint). Keys are
canonical MessagePack (:func:`encode_key`: equal keys, equal bytes).

Every entry's database key starts with its key group and its state id, both big-endian
uint16 (:data:`STATE_PREFIX`), so all of a key group's state is one contiguous key range
(snapshots and rescaling move key groups by range) and all of one state's entries of a
key group too. After the prefix:

* keyed state (:mod:`raystream.checkpoint.disk_state`): ``len(key)`` (uint32) | key |
  namespace (:data:`KEYED_PREFIX`);
* entries ordered by an int64 (timers by timestamp, window panes and entries by window
  end, join buckets): that int64 plus 2**63 as a big-endian uint64 (:func:`ordered_key`),
  so byte order is numeric order and a range scan reads them in time order;
* a layout's own suffix after either (a key's code; a chunk's or row's number,
  :data:`SEQUENCE`, big-endian so that a prefix scan reads them in order).

    >>> key = ordered_key(3, 1, -5)
    >>> key[:4] == state_prefix(3, 1), ordered_value(key)
    (True, -5)
    >>> ordered_key(3, 1, -5) < ordered_key(3, 1, 7) < ordered_key(4, 0, -2 ** 62)
    True
    >>> unpack_value(pack_value((1, ["a", None])))
    (1, ['a', None])

A window layout whose values are fixed-width numpy records names their fields in its
state kind (:func:`record_kind`, :func:`partials_record`), so a restored job decodes them
before any record arrives.
"""

from __future__ import annotations

import json
import pickle
import struct
import threading
from typing import Any, Iterable, Mapping, Sequence

import msgpack
import numpy as np

from raystream.checkpoint.keygroups import canonical_key

__all__ = ["KEY_GROUP", "KEYED_PREFIX", "KEYED_HEAD", "MAX_ORDERED", "ORDERED",
           "SEQUENCE", "SIGN", "STATE_ID", "STATE_PREFIX", "PLAIN_KEY_TYPES",
           "encode_key", "group_bound", "ordered", "ordered_key", "ordered_array",
           "ordered_value", "pack_value", "partials_record", "record_fields",
           "record_kind", "state_id_of", "state_prefix", "unordered_array",
           "unpack_value", "unpack_values", "value_packer"]

KEY_GROUP = struct.Struct(">H")  # a key group alone: the bound of a range of key groups
STATE_ID = KEY_GROUP  # a state id, as the backend hands it out (raw_state_id)
STATE_PREFIX = struct.Struct(">HH")  # key group, state id
KEYED_PREFIX = struct.Struct(">HHI")  # key group, state id, key length
KEYED_HEAD = np.dtype([("group", ">u2"), ("state", ">u2"), ("length", ">u4")])  # the same
ORDERED = struct.Struct(">HHQ")  # key group, state id, int64 + 2**63
SIGN = 1 << 63  # int64 + SIGN, as uint64: byte order is numeric order
MAX_ORDERED = SIGN - 1  # the largest int64: the last ordered entry
SEQUENCE = struct.Struct(">Q")  # a suffix ordering an entry's parts (chunks, rows) by number


def group_bound(group: int) -> bytes:
    """The first key of key group ``group``: the upper bound of a scan of the ones before."""
    return KEY_GROUP.pack(group)


def state_prefix(group: int, sid: int) -> bytes:
    """The first bytes of every entry of state ``sid`` in key group ``group``."""
    return STATE_PREFIX.pack(group, sid)


def state_id_of(raw: bytes) -> int:
    """A state id the backend handed out as bytes, as a number."""
    return STATE_ID.unpack(raw)[0]


def ordered_array(values: np.ndarray) -> np.ndarray:
    """int64 ``values`` + 2**63 as uint64 (the big-endian bytes sort as the numbers do)."""
    return np.ascontiguousarray(values, dtype=np.int64).view(np.uint64) ^ np.uint64(SIGN)


def unordered_array(values: np.ndarray) -> np.ndarray:
    """The int64 values :func:`ordered_array` made."""
    return (values.astype(np.uint64) ^ np.uint64(SIGN)).view(np.int64)


def ordered(values: np.ndarray) -> list[int]:
    """:func:`ordered_array` as Python ints, to pack :data:`ORDERED` keys with."""
    return ordered_array(values).tolist()


def ordered_key(group: int, sid: int, value: int) -> bytes:
    """The :data:`ORDERED` prefix of an entry of state ``sid`` ordered by ``value``."""
    return ORDERED.pack(group, sid, value + SIGN)


def ordered_value(key: bytes) -> int:
    """The int64 an :data:`ORDERED` key is ordered by."""
    return ORDERED.unpack_from(key)[2] - SIGN


_EXT_TUPLE = 1
_EXT_PICKLE = 2


# ---------------------------------------------------------------------------
# Serialization: MessagePack, pickle only for opaque objects
# ---------------------------------------------------------------------------

def _default(obj: Any) -> msgpack.ExtType:
    if type(obj) is tuple:  # a fresh packer: this runs inside the thread's packer
        return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(
            list(obj), default=_default, strict_types=True, use_bin_type=True))
    try:
        return msgpack.ExtType(_EXT_PICKLE, pickle.dumps(obj, protocol=5))
    except Exception as exc:  # a lock, a socket, a generator: say what and why
        raise TypeError(f"a {type(obj).__name__} cannot be kept in keyed state ({exc}): a "
                        f"state value is made of MessagePack types and picklable objects") \
            from exc


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_TUPLE:
        return tuple(unpack_value(data))
    if code == _EXT_PICKLE:
        return pickle.loads(data)
    return msgpack.ExtType(code, data)


_local = threading.local()  # one reusable packer per thread (msgpack.packb builds one per call)


def value_packer() -> msgpack.Packer:
    """This thread's packer (``msgpack.packb`` would build one per call)."""
    try:
        return _local.packer
    except AttributeError:
        # strict_types: subclasses (IntEnum, OrderedDict, np.float64) are opaque, keep their type
        packer = _local.packer = msgpack.Packer(default=_default, strict_types=True,
                                                use_bin_type=True)
        return packer


def pack_value(obj: Any) -> bytes:
    return value_packer().pack(obj)


def unpack_value(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def unpack_values(raws: list[bytes | None]) -> list[Any]:
    """``unpack_value`` of each of ``raws`` (None stays None), by one unpacker over their
    concatenation: for small values half the time of an ``unpackb`` call each, whose
    keyword arguments and set-up dominate (0.29 against 0.54 us a 3-field dict)."""
    present = [raw for raw in raws if raw is not None]
    if not present:
        return [None] * len(raws)
    unpacker = msgpack.Unpacker(None, ext_hook=_ext_hook, raw=False, strict_map_key=False,
                                max_buffer_size=0)  # 0: no limit
    unpacker.feed(b"".join(present))
    decoded = list(unpacker)
    if len(decoded) != len(present):  # each value is one pack_value: only corruption gets here
        raise ValueError(f"disk state backend: {len(present)} stored values decoded as "
                         f"{len(decoded)} MessagePack objects: the local database is corrupt")
    if len(present) == len(raws):
        return decoded
    values = iter(decoded)
    return [None if raw is None else next(values) for raw in raws]


def _canonical_key(key: Any) -> Any:
    if isinstance(key, np.generic):
        key = key.item()
    if type(key) is tuple:
        return tuple(_canonical_key(k) for k in key)
    return canonical_key(key)  # a float: -0.0 as 0.0, one NaN (the heap's dict keys too)


# encode_key packs these as they are (not floats: two zeros and many NaNs)
PLAIN_KEY_TYPES = frozenset((int, str, bytes))


def encode_key(key: Any) -> bytes:
    """Canonical bytes of a key (equal keys, equal bytes).

    >>> import numpy as np
    >>> encode_key(7) == encode_key(np.int64(7))
    True
    >>> encode_key(-0.0) == encode_key(0.0), encode_key(float("nan")) == encode_key(-np.nan)
    (True, True)
    """
    if type(key) in PLAIN_KEY_TYPES:  # the common keys: nothing to convert
        return pack_value(key)
    return pack_value(_canonical_key(key))


def record_kind(prefix: str, fields: Iterable[tuple[str, np.dtype]]) -> str:
    """A state kind that carries the fields of its values' fixed-width numpy records, so
    a restored job decodes them before any record arrives (:func:`record_fields`).

    >>> kind = record_kind("panes", [("n", np.dtype("<i8"))])
    >>> kind, record_fields("panes", kind)
    ('panes [["n", "<i8"]]', [('n', dtype('int64'))])
    """
    return f"{prefix} {json.dumps([[name, np.dtype(dtype).str] for name, dtype in fields])}"


def record_fields(prefix: str, kind: str) -> list[tuple[str, np.dtype]]:
    """The record fields a :func:`record_kind` carries."""
    return [(name, np.dtype(dtype)) for name, dtype in json.loads(kind[len(prefix) + 1:])]


def partials_record(prefix: str, partials: Mapping[str, Any], *, where: str,
                    first: Sequence[tuple[str, str]] = (), last: Sequence[tuple[str, str]] = ()
                    ) -> tuple[np.dtype, str]:
    """A window layout's value record, its fields ``first``, the partial columns of dtypes
    ``partials`` and its fields ``last``, all little-endian, and the :func:`record_kind`
    of ``prefix`` that carries it; ``where`` (the operator) names partials that are not
    fixed-width (objects).

    >>> import numpy as np
    >>> record, kind = partials_record("panes", {"n": np.dtype(">i4")}, where="w",
    ...                                last=[("__kid", "<i8")])
    >>> record.descr, kind
    ([('n', '<i4'), ('__kid', '<i8')], 'panes [["n", "<i4"], ["__kid", "<i8"]]')
    """
    record = np.dtype([*first, *((n, np.dtype(d).newbyteorder("<")) for n, d in partials.items()),
                       *last])
    if record.hasobject:
        raise ValueError(f"{where}: partials of type "
                         f"{', '.join(str(np.dtype(d)) for d in partials.values())} cannot be "
                         f"kept in the disk state backend (fixed-width numeric partials only); "
                         f"run this job with CheckpointConfig(state_backend='heap')")
    return record, record_kind(prefix, [(n, record[n]) for n in record.names or ()])
