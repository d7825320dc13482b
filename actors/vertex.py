"""A vertex of the physical plan, as the subtask actors that run it see it.

A :class:`JobVertex` is a chain of operators (:class:`ChainNode` s) that
``parallelism`` subtask actors run; :class:`JobEdge` s between vertices carry
batches over channels, one per (upstream subtask, downstream subtask) pair, or
per index for ``forward``. The engine builds them from the job's graph
(:mod:`raystream.engine.plan`, as Flink's ``JobGraph`` is built by its client
and run by its runtime); a subtask's spec carries its vertex.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from raystream.actors.messages import ChannelId
from raystream.actors.operator import Operator
from raystream.actors.partitioners import PartitionSpec
from raystream.actors.record_writer import DEFAULT_BUFFER_TIMEOUT_MS
from raystream.actors.resources import Resources


@dataclass
class ChainNode:
    """One operator inside a vertex's chain."""

    transformation_id: int
    name: str
    create_operator: Callable[[], Operator]
    chained_outputs: list[int] = field(default_factory=list)  # indexes into JobVertex.nodes
    network_outputs: list[int] = field(default_factory=list)  # JobEdge ids
    # consumers of the operator's side outputs: (tag, node index) and (tag, JobEdge id)
    side_chained_outputs: list[tuple[str, int]] = field(default_factory=list)
    side_network_outputs: list[tuple[str, int]] = field(default_factory=list)
    is_sink: bool = False
    committer: bool = False  # an exactly-once sink's committer (engine/regions.py)
    coordinator: Callable[[Any], Any] | None = None  # the operator coordinator's factory
    # how long its output may wait in a buffer before it is sent (-1: until full)
    buffer_timeout_ms: float = DEFAULT_BUFFER_TIMEOUT_MS


@dataclass
class JobEdge:
    id: int
    source_vertex: int
    source_node: int  # index of the sending node in the source vertex's chain
    target_vertex: int
    partitioning: PartitionSpec
    input_index: int
    source_parallelism: int
    target_parallelism: int
    side_output: str | None = None
    into_committer: bool = False  # to an exactly-once sink's committer: the data has landed

    def channels(self) -> list[ChannelId]:
        if self.partitioning.kind == "forward":
            return [ChannelId(self.id, i, i) for i in range(self.source_parallelism)]
        return [ChannelId(self.id, u, d) for u in range(self.source_parallelism)
                for d in range(self.target_parallelism)]

    def output_channels(self, upstream: int) -> list[ChannelId]:
        """The channels subtask ``upstream`` sends on, indexed as its partitioner routes."""
        return [c for c in self.channels() if c.upstream == upstream]

    def input_channels(self, downstream: int) -> list[ChannelId]:
        return [c for c in self.channels() if c.downstream == downstream]


@dataclass
class JobVertex:
    id: int
    parallelism: int
    nodes: list[ChainNode]
    resources: Resources
    is_source: bool
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " -> ".join(node.name for node in self.nodes)

    def input_channels(self, subtask: int) -> list[tuple[ChannelId, int]]:
        return [(c, e.input_index) for e in self.inputs for c in e.input_channels(subtask)]
