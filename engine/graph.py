"""The logical graph a job program builds: one :class:`Transformation` per operator.

Transformations are numbered in creation order, so inputs always have
smaller ids and creation order is a topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from raystream.actors.partitioners import (BroadcastPartitioner, ForwardPartitioner,
                                           KeyGroupPartitioner, Partitioner,
                                           RebalancePartitioner)
from raystream.engine.keys import KeySelector
from raystream.actors.operator import Operator


@dataclass(frozen=True)
class Resources:
    """What one subtask asks Ray for. The default is a tiny CPU fraction, so a
    2-core laptop can run many subtasks beside a Spark executor."""

    num_cpus: float = 0.01
    memory: int | None = None  # bytes
    custom: tuple[tuple[str, float], ...] = ()

    def ray_options(self) -> dict:
        options: dict = {"num_cpus": self.num_cpus}
        if self.memory:
            options["memory"] = self.memory
        if self.custom:
            options["resources"] = dict(self.custom)
        return options

    def merged(self, other: "Resources") -> "Resources":
        """Per resource, the larger of the two (chained operators share one subtask)."""
        custom = dict(self.custom)
        for name, amount in other.custom:
            custom[name] = max(custom.get(name, 0.0), amount)
        return Resources(max(self.num_cpus, other.num_cpus),
                         max(self.memory or 0, other.memory or 0) or None,
                         tuple(sorted(custom.items())))


@dataclass(frozen=True)
class PartitionSpec:
    """How an edge distributes records: forward, rebalance, broadcast or hash(key)."""

    kind: str  # "forward" | "rebalance" | "broadcast" | "hash"
    keys: KeySelector | None = None

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


@dataclass
class InputEdge:
    upstream: int  # transformation id
    partitioning: PartitionSpec | None  # None: forward if parallelism matches, else rebalance
    input_index: int = 0
    side_output: str | None = None  # read the upstream's side output with this tag, not its main output


@dataclass
class Transformation:
    id: int
    name: str
    kind: str  # "source", "operator", "sink"
    create_operator: Callable[[], Operator]
    parallelism: int
    inputs: list[InputEdge] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    chainable: bool = True
    # creates the operator's coordinator in the job master: ``coordinator(context)``
    coordinator: Callable[[Any], Any] | None = None
    buffer_timeout_ms: float | None = None  # of its output edges; None: the job's

    @property
    def is_source(self) -> bool:
        return self.kind == "source"

    @property
    def is_sink(self) -> bool:
        return self.kind == "sink"
