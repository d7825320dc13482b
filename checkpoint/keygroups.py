"""Key groups: the unit in which keyed state and timers are partitioned.

A key's group is a fixed, versioned hash of the key, modulo
``max_parallelism``. Key group ``g`` belongs to subtask
``g * parallelism // max_parallelism``, so each subtask owns a contiguous range
(Flink's ``KeyGroupRangeAssignment``) and a job can be restored at another
parallelism by handing ranges around.

The hash never uses Python's salted ``hash()``: it must give the same group in
every process, on every machine and across restarts. Version 1 is:

* integers (and booleans, dates, timestamps, durations): murmur3 ``fmix64`` of
  the value's two's-complement int64 bits;
* floats: ``fmix64`` of the IEEE-754 float64 bits, with ``-0.0`` folded to ``0.0`` and
  every NaN to the bits of ``float("nan")``;
* strings and bytes: murmur3 x86 32-bit (seed 0) of the UTF-8 bytes;
* composite keys (several columns, or a tuple): ``h = h0``, then for every
  further part ``h = fmix64(h * 31 + h_i)`` (wrapping uint64 arithmetic).

The vectorized path (:func:`key_groups_of_array`) and the per-row path
(:func:`key_group_of`) are golden-tested against each other.

Example:
    >>> import pyarrow as pa
    >>> key_group_of("alice", max_parallelism=128) == int(
    ...     key_groups_of_array(pa.array(["alice"]), max_parallelism=128)[0])
    True
    >>> subtask_for_key_group(127, parallelism=2, max_parallelism=128)
    1
"""

from __future__ import annotations

import math

from typing import Any, Sequence, TypeVar

import numpy as np
import pyarrow as pa

HASH_VERSION = 1
DEFAULT_MAX_PARALLELISM = 128

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_C1 = 0xCC9E2D51
_C2 = 0x1B873593


# ---------------------------------------------------------------------------
# Assignment of key groups to subtasks (Flink KeyGroupRangeAssignment)
# ---------------------------------------------------------------------------

# one key group, or an array of them (the partitioner routes a batch's at once)
KeyGroups = TypeVar("KeyGroups", int, np.ndarray)


def subtask_for_key_group(key_group: KeyGroups, parallelism: int,
                          max_parallelism: int) -> KeyGroups:
    """Index of the subtask that owns ``key_group`` (elementwise for an array)."""
    return key_group * parallelism // max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The contiguous key groups owned by ``subtask`` (inverse of :func:`subtask_for_key_group`).

    >>> key_group_range(0, parallelism=3, max_parallelism=128)
    range(0, 43)
    """
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def check_max_parallelism(parallelism: int, max_parallelism: int) -> None:
    if not 1 <= parallelism <= max_parallelism:
        raise ValueError(
            f"parallelism {parallelism} must be between 1 and max_parallelism "
            f"{max_parallelism}: each subtask needs at least one key group")


# ---------------------------------------------------------------------------
# Per-row path (pure Python integers; the reference for the vectorized path)
# ---------------------------------------------------------------------------

def _fmix64_int(k: int) -> int:
    k &= _M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    k ^= k >> 33
    return k


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """murmur3 x86 32-bit of ``data`` (reference implementation, one value)."""
    h = seed & _M32
    n = len(data)
    nblocks = n // 4
    for i in range(nblocks):
        k = int.from_bytes(data[4 * i:4 * i + 4], "little")
        k = (k * _C1) & _M32
        k = _rotl32(k, 15)
        k = (k * _C2) & _M32
        h ^= k
        h = _rotl32(h, 13)
        h = (h * 5 + 0xE6546B64) & _M32
    tail = data[4 * nblocks:]
    k = 0
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * _C1) & _M32
        k = _rotl32(k, 15)
        k = (k * _C2) & _M32
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h


def _hash_scalar(value: Any) -> int:
    if isinstance(value, tuple):
        if not value:
            raise TypeError("an empty tuple is not a key")
        h = _hash_scalar(value[0])
        for part in value[1:]:
            h = _fmix64_int((h * 31 + _hash_scalar(part)) & _M64)
        return h
    if value is None:
        raise TypeError("a key must not be null (None)")
    if isinstance(value, (bool, int, np.integer)):
        return _fmix64_int(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value) + 0.0  # folds -0.0 to 0.0
        if f != f:  # every NaN is one key (canonical_key)
            f = NAN_KEY
        return _fmix64_int(int(np.array(f, dtype=np.float64).view(np.uint64)))
    if isinstance(value, str):
        return murmur3_32(value.encode("utf-8"))
    if isinstance(value, bytes):
        return murmur3_32(value)
    if hasattr(value, "value") and isinstance(getattr(value, "value"), int):
        return _fmix64_int(value.value)  # pyarrow/pandas timestamps carry .value
    raise TypeError(f"cannot key by a value of type {type(value).__name__}: {value!r}")


# Keys are equal when Python's == says so, except that every NaN is one key (as pandas
# groups with dropna=False, and Flink's Double.equals): -0.0 is 0.0, and a NaN key is
# this one object, which a dict finds by identity (NaN != NaN).
NAN_KEY = math.nan


def canonical_key(key: Any) -> Any:
    """``key`` with its floats canonical: -0.0 as 0.0, any NaN as one NaN object.

    >>> canonical_key((-0.0, "a"))
    (0.0, 'a')
    >>> canonical_key(float("nan")) is canonical_key(-float("nan"))
    True
    """
    if type(key) is float:
        return NAN_KEY if key != key else key + 0.0  # -0.0 + 0.0 is 0.0
    if type(key) is tuple:
        return tuple(map(canonical_key, key))
    return key


def key_group_of(key: Any, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> int:
    """Key group of one key (int, float, str, bytes, or a tuple of those)."""
    return _hash_scalar(key) % max_parallelism


# ---------------------------------------------------------------------------
# Vectorized path
# ---------------------------------------------------------------------------

def _fmix64(k: np.ndarray) -> np.ndarray:
    k = k.astype(np.uint64, copy=True)
    k ^= k >> np.uint64(33)
    k *= np.uint64(0xFF51AFD7ED558CCD)
    k ^= k >> np.uint64(33)
    k *= np.uint64(0xC4CEB9FE1A85EC53)
    k ^= k >> np.uint64(33)
    return k


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _murmur3_32_distinct(arr: pa.Array) -> np.ndarray:
    """murmur3 x86 32 of every value of a null-free binary-like array.

    Loops over 4-byte block positions, each step vectorized over all strings
    still that long (strings are ordered by length so those are a prefix).
    """
    arr = arr.cast(pa.large_binary())
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    _validity, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(4, np.uint8)]).astype(np.uint32)
    starts = offsets[:-1]
    lengths = (offsets[1:] - starts).astype(np.int64)
    nblocks = lengths // 4
    order = np.argsort(-nblocks, kind="stable")
    starts_o, nblocks_o = starts[order], nblocks[order]
    h = np.zeros(n, dtype=np.uint32)
    c1, c2 = np.uint32(_C1), np.uint32(_C2)
    with np.errstate(over="ignore"):
        for b in range(int(nblocks_o[0]) if n else 0):
            active = int(np.searchsorted(-nblocks_o, -b, side="left"))  # count with nblocks > b
            idx = starts_o[:active] + 4 * b
            k = data[idx] | (data[idx + 1] << np.uint32(8)) | (data[idx + 2] << np.uint32(16)) | (
                data[idx + 3] << np.uint32(24))
            k = _rotl(k * c1, 15) * c2
            hh = _rotl(h[:active] ^ k, 13)
            h[:active] = hh * np.uint32(5) + np.uint32(0xE6546B64)
        h_sorted = h
        h = np.empty(n, dtype=np.uint32)
        h[order] = h_sorted
        tail = lengths & 3
        base = starts + nblocks * 4
        k = np.zeros(n, dtype=np.uint32)
        k = np.where(tail >= 3, k ^ (data[base + 2] << np.uint32(16)), k)
        k = np.where(tail >= 2, k ^ (data[base + 1] << np.uint32(8)), k)
        k = np.where(tail >= 1, k ^ data[base], k)
        k = _rotl(k * c1, 15) * c2
        h = np.where(tail >= 1, h ^ k, h)
        h ^= lengths.astype(np.uint32)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h.astype(np.uint64)


def _hash_array(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count:
        raise TypeError("a key must not be null")
    t = arr.type
    if pa.types.is_dictionary(t):
        return _hash_array(arr.dictionary)[arr.indices.to_numpy(zero_copy_only=False)]
    if pa.types.is_boolean(t):
        arr = arr.cast(pa.int64())
        t = arr.type
    if pa.types.is_temporal(t):
        arr = arr.view(pa.int64() if t.bit_width == 64 else pa.int32())
        t = arr.type
    if pa.types.is_integer(t):
        ints = arr.cast(pa.int64(), safe=False).to_numpy(zero_copy_only=False)
        return _fmix64(ints.view(np.uint64))
    if pa.types.is_floating(t):
        f = np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False)) + 0.0
        f[np.isnan(f)] = NAN_KEY  # every NaN is one key (canonical_key)
        return _fmix64(f.view(np.uint64))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        # Hash each distinct value once.
        encoded = arr.dictionary_encode()
        distinct = _murmur3_32_distinct(encoded.dictionary)
        return distinct[encoded.indices.to_numpy(zero_copy_only=False)]
    raise TypeError(f"cannot key by a column of type {t}")


def key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray]) -> np.ndarray:
    """uint64 version-1 hash of each row of one or more key columns."""
    h = _hash_array(columns[0])
    with np.errstate(over="ignore"):
        for col in columns[1:]:
            h = _fmix64(h * np.uint64(31) + _hash_array(col))
    return h


def key_groups_of_array(*columns: pa.Array | pa.ChunkedArray,
                        max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> np.ndarray:
    """Key group (int64) of every row of one or more key columns, vectorized."""
    return (key_hashes(columns) % np.uint64(max_parallelism)).astype(np.int64)


def check_key_group_range(key_groups: range, max_parallelism: int) -> None:
    """Raise unless ``key_groups`` is a non-empty contiguous range within ``[0, max_parallelism)``."""
    if not isinstance(key_groups, range) or key_groups.step != 1:
        raise TypeError(f"key_groups must be a contiguous range, got {key_groups!r}")
    if max_parallelism < 1:
        raise ValueError(f"max_parallelism must be positive, got {max_parallelism}")
    if len(key_groups) == 0 or key_groups.start < 0 or key_groups.stop > max_parallelism:
        raise ValueError(
            f"key_groups {key_groups!r} must be a non-empty range within [0, {max_parallelism})")
