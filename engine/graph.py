"""The logical graph a job program builds: one :class:`Transformation` per operator.

Transformations are numbered in creation order, so inputs always have
smaller ids and creation order is a topological order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from raystream.actors.operator import Operator
from raystream.actors.partitioners import PartitionSpec
from raystream.actors.resources import Resources


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
    # the columns of its output, where known when the job is built (engine/columns.py)
    columns: tuple[str, ...] | None = None
    # checks on the driver before the job starts (a source's: engine/preflight.py)
    preflight: Callable[[], None] | None = None
    # the committer of an exactly-once sink: it outlives a restart of a writer's region
    # (engine/regions.py)
    committer: bool = False

    @property
    def is_source(self) -> bool:
        return self.kind == "source"

    @property
    def is_sink(self) -> bool:
        return self.kind == "sink"
