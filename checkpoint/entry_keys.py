"""A batch's RocksDB keys in the database's order, for one multi-get and one write batch.

RocksDB sorts the keys of a multi-get itself, comparing them where they lie: Python
bytes objects made in the batch's order, which its sort and its lookups then visit
all over memory. Keys that arrive sorted, as new objects made in that order (so
memory order is key order), spare it those cache misses, and a write batch in key
order walks the memtable's skiplist along one path. The keys are assembled and
sorted with numpy and Arrow, not one Python call a key. A keyed reduce on 3,000,000
stored keys, in one process, alternating batches of 11,000 keys: 5.1 against 6.3 µs
a key in the multi-get and 13.9 against 14.9 µs a key in all.

    >>> import numpy as np
    >>> heads = np.array([2, 1, 2], dtype=">u2")
    >>> keys = EntryKeys.build(heads, [b"b", b"z", b"a"])
    >>> keys.ordered
    [b'\\x00\\x01z', b'\\x00\\x02a', b'\\x00\\x02b']
    >>> keys.order, keys.rank, keys.key(0)
    ([1, 2, 0], [2, 0, 1], b'\\x00\\x02b')
    >>> keys.in_caller_order(["1z", "2a", "2b"])
    ['2b', '1z', '2a']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["EntryKeys"]

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class EntryKeys:
    """Stored keys of a batch: ``ordered`` sorted bytewise (RocksDB's order; equal keys
    keep the caller's order, so of a key written twice the later value wins), where
    ``ordered[j]`` is the caller's key ``order[j]`` and the caller's key ``i`` is
    ``ordered[rank[i]]``."""

    ordered: list[bytes]
    order: list[int]
    rank: list[int]

    @classmethod
    def build(cls, heads: np.ndarray, codes: list[bytes]) -> "EntryKeys":
        """The keys ``heads[i] + codes[i]``: ``heads`` is a fixed-width array (one
        element a key, a structured dtype for a prefix of several fields), whose bytes
        as they lie in memory come first."""
        n = len(codes)
        width = heads.dtype.itemsize
        lengths = np.fromiter(map(len, codes), dtype=np.int64, count=n) + width
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        at = (offsets[:-1, None] + np.arange(width)).reshape(-1)
        rest = np.ones(len(data), dtype=bool)
        rest[at] = False
        data[at] = np.ascontiguousarray(heads).view(np.uint8).reshape(-1)
        data[rest] = np.frombuffer(b"".join(codes), dtype=np.uint8)
        keys = pa.Array.from_buffers(pa.large_binary(), n,
                                     [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        # stable, and binary sorts as unsigned bytes (pyarrow.compute is generated at import)
        order = pc.sort_indices(keys)  # pyright: ignore[reportAttributeAccessIssue]
        rank = np.empty(n, dtype=np.int64)
        rank[order.to_numpy()] = np.arange(n)
        return cls(keys.take(order).to_pylist(), order.to_pylist(), rank.tolist())

    def __len__(self) -> int:
        return len(self.ordered)

    def key(self, i: int) -> bytes:
        """The caller's key ``i``."""
        return self.ordered[self.rank[i]]

    def in_caller_order(self, items: Sequence[T]) -> list[T]:
        """``items``, one per key of ``ordered``, in the caller's order."""
        return [items[r] for r in self.rank]
