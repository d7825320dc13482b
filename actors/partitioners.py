"""Output partitioners: which downstream subtask(s) get which rows of a batch.

Each partitioner splits a whole ``pyarrow.RecordBatch`` at once (one ``take``
and zero-copy slices), never row by row. A job edge carries a
:class:`PartitionSpec`, from which each sending subtask creates its partitioner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from raystream.checkpoint.keygroups import subtask_for_key_group


class KeyGroupFunction(Protocol):
    def key_arrays(self, batch: pa.RecordBatch) -> list[pa.Array]: ...
    def key_groups(self, batch: pa.RecordBatch, max_parallelism: int) -> np.ndarray: ...


class Partitioner:
    """Base: ``route(batch)`` yields ``(channel_index, sub_batch)`` pairs."""

    name = "partitioner"
    #: one channel per downstream subtask (False: only the subtask with my index)
    all_to_all = True

    def setup(self, subtask_index: int, num_channels: int) -> None:
        self.subtask_index = subtask_index
        self.num_channels = num_channels

    def route(self, batch: pa.RecordBatch) -> list[tuple[int, pa.RecordBatch]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class ForwardPartitioner(Partitioner):
    """Subtask i sends to subtask i (both sides have the same parallelism)."""

    name = "forward"
    all_to_all = False

    def route(self, batch):
        return [(0, batch)]


class RebalancePartitioner(Partitioner):
    """Whole batches round-robin over all downstream subtasks."""

    name = "rebalance"

    def setup(self, subtask_index, num_channels):
        super().setup(subtask_index, num_channels)
        self._next = subtask_index % num_channels  # spread the subtasks' starting points

    def route(self, batch):
        target = self._next
        self._next = (self._next + 1) % self.num_channels
        return [(target, batch)]


class BroadcastPartitioner(Partitioner):
    """Every downstream subtask gets every batch (the same object ref)."""

    name = "broadcast"

    def route(self, batch):
        return [(i, batch) for i in range(self.num_channels)]


class KeyGroupPartitioner(Partitioner):
    """Rows go to the subtask owning their key group.

    >>> import pyarrow as pa
    >>> from raystream.engine.keys import KeySelector
    >>> p = KeyGroupPartitioner(KeySelector.of("k"), max_parallelism=128)
    >>> p.setup(0, 2)
    >>> sorted(sum(b.num_rows for _, b in p.route(pa.record_batch({"k": list(range(10))}))) for _ in [0])
    [10]
    """

    name = "hash"

    def __init__(self, keys: KeyGroupFunction, max_parallelism: int) -> None:
        self.keys = keys
        self.max_parallelism = max_parallelism

    def route(self, batch):
        if batch.num_rows == 0:
            return []
        if self.num_channels == 1:
            self.keys.key_arrays(batch)  # still reject missing or null keys here
            return [(0, batch)]
        groups = self.keys.key_groups(batch, self.max_parallelism)
        targets = subtask_for_key_group(groups, self.num_channels, self.max_parallelism)
        counts = np.bincount(targets, minlength=self.num_channels)
        order = np.argsort(targets, kind="stable")  # stable: keeps per-key order
        ordered = batch.take(pa.array(order))
        routed, start = [], 0
        for target, count in enumerate(counts.tolist()):
            if count:
                routed.append((target, ordered.slice(start, count)))
                start += count
        return routed

    def __repr__(self):
        return f"hash({self.keys})"


@dataclass(frozen=True)
class PartitionSpec:
    """How an edge distributes records: forward, rebalance, broadcast or hash(key)."""

    kind: str  # "forward" | "rebalance" | "broadcast" | "hash"
    keys: KeyGroupFunction | None = None

    def create(self, max_parallelism: int) -> Partitioner:
        if self.kind == "forward":
            return ForwardPartitioner()
        if self.kind == "rebalance":
            return RebalancePartitioner()
        if self.kind == "broadcast":
            return BroadcastPartitioner()
        if self.kind == "hash":
            if self.keys is None:
                raise ValueError("hash partitioning needs the keys")
            return KeyGroupPartitioner(self.keys, max_parallelism)
        raise ValueError(f"unknown partitioning {self.kind!r}")

    def __str__(self) -> str:
        return f"hash({self.keys})" if self.kind == "hash" else self.kind
