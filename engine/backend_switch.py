"""A savepoint restored with the other state backend: what cannot move is refused before
the job deploys.

A savepoint's metadata says which backend wrote its keyed state. Every keyed operator's
state moves from the heap backend into the disk one; from the disk backend into the heap
one, only the layouts whose operator says it reads them
(:meth:`~raystream.engine.operators.keyed.KeyedOperator.heap_unreadable_disk_layout`).
The job master asks each operator the savepoint holds keyed state of, before any subtask
is deployed, so a job that could not restore fails at once with a message naming the
operator, not later in one of its subtasks.
"""

from __future__ import annotations

from raystream.checkpoint.restore import RestoreSpec
from raystream.checkpoint.state_backend import StateBackendChoice, is_disk
from raystream.engine.errors import JobSetupError
from raystream.engine.operators.keyed import KeyedOperator
from raystream.engine.plan import JobPlan


def refuse_unreadable_state(plan: JobPlan, restore: RestoreSpec, backend: StateBackendChoice,
                            path: str) -> None:
    """Raise :class:`~raystream.JobSetupError` if an operator of ``plan`` on ``backend``
    cannot read its keyed state in ``restore`` (of the savepoint or checkpoint ``path``)."""
    if restore.state_backend != "disk" or is_disk(backend):
        return  # the same backend, a heap savepoint (either reads it), or an older savepoint
    for vertex in plan.vertices:
        for node in vertex.nodes:
            files = restore.operators.get(node.name)
            if files is None or not (files.keyed_state or files.keyed_db):
                continue
            operator = node.create_operator()  # (cheap: its state is made in the subtask)
            if not isinstance(operator, KeyedOperator):
                continue
            layout = operator.heap_unreadable_disk_layout()
            if layout is not None:
                raise JobSetupError(
                    f"cannot restore {path}: {operator.label} '{node.name}' keeps {layout} "
                    f"in the disk state backend's layout, which the heap state backend "
                    f"cannot read; restore with CheckpointConfig(state_backend='disk')")
