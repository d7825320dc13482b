"""A job's pipelined regions: the subtasks that must restart together (no Ray here).

Flink restarts a failed task's *pipelined region* (FLIP-1,
``RestartPipelinedRegionFailoverStrategy``, regions from
``SchedulingPipelinedRegionComputeUtil``): the connected component of the
subtask graph over its pipelined edges. raystream's region rule:

* a ``forward`` edge joins subtask ``i`` of its sender to subtask ``i`` of its
  receiver (one channel: nothing else is connected by it);
* every other edge (``rebalance``, ``hash``, ``broadcast``) is all-to-all and
  joins every subtask of both vertices, so a keyed job is one region;
* except the edge into an exactly-once sink's committer (parallelism 1, fed by
  every writer): the committer is its own region and survives the restart of
  a writer's region (it drops what the writer's failed attempt handed over for
  checkpoints after the restored one, :mod:`raystream.engine.operators.two_phase`).
  Were that edge a region edge, every checkpointed job with a sink would be one
  region. The committer's own failure restarts the job (it holds what every
  region handed over).

    >>> from raystream.actors.partitioners import PartitionSpec
    >>> from raystream.actors.resources import Resources
    >>> from raystream.actors.vertex import ChainNode, JobEdge, JobVertex
    >>> def vertex(id, p, committer=False):
    ...     return JobVertex(id, p, [ChainNode(id, f"v{id}", object, committer=committer)],
    ...                      Resources(), is_source=id == 0)
    >>> def edge(id, a, b, kind):
    ...     return JobEdge(id, a.id, 0, b.id, PartitionSpec(kind), 0, a.parallelism,
    ...                    b.parallelism)
    >>> source, sink, commit = vertex(0, 2), vertex(1, 2), vertex(2, 1, committer=True)
    >>> regions = Regions.of_vertices([source, sink, commit],
    ...                               [edge(0, source, sink, "forward"),
    ...                                edge(1, sink, commit, "rebalance")])
    >>> [sorted(r) for r in regions.regions]
    [[(0, 0), (1, 0)], [(0, 1), (1, 1)], [(2, 0)]]
    >>> sorted(regions.restart_set((1, 1)))
    [(0, 1), (1, 1)]
    >>> regions.restart_set((2, 0)) is None   # the committer: a global restart
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from raystream.actors.vertex import JobEdge, JobVertex
from raystream.engine.job_events import SubtaskKey

if TYPE_CHECKING:
    from raystream.engine.plan import JobPlan

Region = frozenset[SubtaskKey]


def joins_regions(edge: JobEdge, target: JobVertex) -> bool:
    """Does ``edge`` (into ``target``) connect regions? Not the edge into a committer."""
    return not (target.nodes[0].committer and edge.partitioning.kind != "forward")


@dataclass(frozen=True)
class Regions:
    """The pipelined regions of a plan, and which of them hold a committer."""

    regions: tuple[Region, ...]
    committers: frozenset[SubtaskKey]  # subtasks whose head is a survivor committer

    @classmethod
    def of_plan(cls, plan: JobPlan) -> Regions:
        return cls.of_vertices(plan.vertices, plan.edges)

    @classmethod
    def of_vertices(cls, vertices: Iterable[JobVertex], edges: Iterable[JobEdge]) -> Regions:
        by_id = {v.id: v for v in vertices}
        parent: dict[SubtaskKey, SubtaskKey] = {
            (v.id, i): (v.id, i) for v in by_id.values() for i in range(v.parallelism)}

        def root(key: SubtaskKey) -> SubtaskKey:
            while parent[key] != key:
                parent[key] = parent[parent[key]]
                key = parent[key]
            return key

        def join(a: SubtaskKey, b: SubtaskKey) -> None:
            parent[root(a)] = root(b)

        committers: set[SubtaskKey] = set()
        for edge in edges:
            target = by_id[edge.target_vertex]
            if not joins_regions(edge, target):
                committers.update((target.id, i) for i in range(target.parallelism))
                continue
            if edge.partitioning.kind == "forward":
                for i in range(edge.source_parallelism):
                    join((edge.source_vertex, i), (edge.target_vertex, i))
            else:  # all-to-all: every sender with every receiver
                first = (edge.target_vertex, 0)
                for i in range(edge.source_parallelism):
                    join((edge.source_vertex, i), first)
                for i in range(edge.target_parallelism):
                    join((edge.target_vertex, i), first)
        groups: dict[SubtaskKey, set[SubtaskKey]] = {}
        for key in parent:
            groups.setdefault(root(key), set()).add(key)
        regions = tuple(sorted((frozenset(g) for g in groups.values()), key=min))
        return cls(regions, frozenset(committers))

    def restart_set(self, failed: SubtaskKey) -> Region | None:
        """The subtasks to restart when ``failed`` fails: its region, or None (restart the
        job) if the region holds a survivor committer or no other region but the
        committers' would keep running (a keyed job)."""
        region = next((r for r in self.regions if failed in r), None)
        if region is None or region & self.committers:
            return None
        others = [r for r in self.regions if r is not region and not r <= self.committers]
        return region if others else None
