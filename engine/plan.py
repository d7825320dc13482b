"""Logical graph → physical plan: operator chaining and job edges.

An operator is chained to its input (runs in the same subtask, handed
batches by a function call) when it has exactly one input, the edge is
``forward`` and both sides have the same parallelism — Flink's chaining rule.
Each chain is a :class:`~raystream.actors.vertex.JobVertex`; ``parallelism``
subtask actors run it. Between vertices,
:class:`~raystream.actors.vertex.JobEdge` s carry batches over channels: one per
(upstream subtask, downstream subtask) pair, or per index for ``forward``. Those
types are the subtask's (:mod:`raystream.actors.vertex`); this module builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

from raystream.actors.partitioners import PartitionSpec
from raystream.actors.record_writer import DEFAULT_BUFFER_TIMEOUT_MS
from raystream.actors.vertex import ChainNode, JobEdge, JobVertex
from raystream.checkpoint.coordinator_holder import CoordinatedOperator
from raystream.checkpoint.keygroups import check_max_parallelism
from raystream.engine.graph import Transformation


@dataclass
class JobPlan:
    vertices: list[JobVertex]
    edges: list[JobEdge]
    max_parallelism: int

    def vertex_of(self, operator_name: str) -> JobVertex:
        for vertex in self.vertices:
            if any(node.name == operator_name for node in vertex.nodes):
                return vertex
        raise KeyError(f"no operator named {operator_name!r}; operators: "
                       f"{[n.name for v in self.vertices for n in v.nodes]}")

    def coordinated_operators(self) -> list[CoordinatedOperator]:
        """The operators that have an operator coordinator."""
        return [CoordinatedOperator(node.name, v.parallelism, node.coordinator)
                for v in self.vertices for node in v.nodes if node.coordinator is not None]

    def num_subtasks(self) -> int:
        return sum(v.parallelism for v in self.vertices)

    def describe(self) -> str:
        lines = []
        for v in self.vertices:
            ins = ", ".join(f"{e.partitioning} from #{e.source_vertex}" for e in v.inputs)
            lines.append(f"#{v.id} [{v.name}] x{v.parallelism}" + (f" <- {ins}" if ins else ""))
        return "\n".join(lines)


def build_plan(transformations: list[Transformation], max_parallelism: int, *,
               buffer_timeout_ms: float = DEFAULT_BUFFER_TIMEOUT_MS) -> JobPlan:
    """Chain and connect the transformations that feed at least one sink; an operator
    without a buffer timeout of its own gets ``buffer_timeout_ms`` (the job's)."""
    by_id = {t.id: t for t in transformations}
    needed = _ancestors_of_sinks(transformations, by_id)
    if not any(by_id[i].is_sink for i in needed):
        raise ValueError("the job has no sink: add .collect(), .print() or .sink_to(...)")
    vertices: list[JobVertex] = []
    edges: list[JobEdge] = []
    place: dict[int, tuple[JobVertex, int]] = {}  # transformation id -> (vertex, node index)
    for t in sorted((by_id[i] for i in needed), key=lambda t: t.id):
        check_max_parallelism(t.parallelism, max_parallelism)
        node = ChainNode(t.id, t.name, t.create_operator, is_sink=t.is_sink,
                         committer=t.committer, coordinator=t.coordinator,
                         buffer_timeout_ms=(buffer_timeout_ms if t.buffer_timeout_ms is None
                                            else t.buffer_timeout_ms))
        resolved = [(e, _resolve(e.partitioning, by_id[e.upstream], t)) for e in t.inputs]
        if _chainable(t, resolved, by_id):
            vertex, upstream_index = place[t.inputs[0].upstream]
            vertex.nodes.append(node)
            vertex.resources = vertex.resources.merged(t.resources)
            upstream_node, tag = vertex.nodes[upstream_index], t.inputs[0].side_output
            if tag is None:
                upstream_node.chained_outputs.append(len(vertex.nodes) - 1)
            else:
                upstream_node.side_chained_outputs.append((tag, len(vertex.nodes) - 1))
            place[t.id] = (vertex, len(vertex.nodes) - 1)
            continue
        vertex = JobVertex(len(vertices), t.parallelism, [node], t.resources, t.is_source)
        vertices.append(vertex)
        place[t.id] = (vertex, 0)
        for edge_in, partitioning in resolved:
            source, source_node = place[edge_in.upstream]
            edge = JobEdge(len(edges), source.id, source_node, vertex.id, partitioning,
                           edge_in.input_index, source.parallelism, vertex.parallelism,
                           edge_in.side_output, into_committer=t.committer)
            edges.append(edge)
            source.outputs.append(edge)
            if edge_in.side_output is None:
                source.nodes[source_node].network_outputs.append(edge.id)
            else:
                source.nodes[source_node].side_network_outputs.append((edge_in.side_output, edge.id))
            vertex.inputs.append(edge)
    return JobPlan(vertices, edges, max_parallelism)


def _ancestors_of_sinks(transformations, by_id) -> set[int]:
    needed: set[int] = set()
    stack = [t.id for t in transformations if t.is_sink]
    while stack:
        tid = stack.pop()
        if tid not in needed:
            needed.add(tid)
            stack.extend(e.upstream for e in by_id[tid].inputs)
    return needed


def _resolve(spec: PartitionSpec | None, upstream: Transformation,
             downstream: Transformation) -> PartitionSpec:
    same = upstream.parallelism == downstream.parallelism
    if spec is None:
        return PartitionSpec("forward" if same else "rebalance")
    if spec.kind == "forward" and not same:
        raise ValueError(f"forward edge from '{upstream.name}' (parallelism {upstream.parallelism}) "
                         f"to '{downstream.name}' (parallelism {downstream.parallelism}): "
                         f"forward needs equal parallelism; use rebalance()")
    return spec


def _chainable(t: Transformation, resolved, by_id) -> bool:
    if len(resolved) != 1 or not t.chainable:
        return False
    edge, partitioning = resolved[0]
    upstream = by_id[edge.upstream]
    return (partitioning.kind == "forward" and upstream.chainable and not upstream.is_sink
            and upstream.parallelism == t.parallelism)
