"""What a subtask tells its job master, and only that: one typed gateway per subtask.

The job master actor implements :class:`JobMasterEndpoint` (its Ray methods, each
taking the attempt and the subtask it is from); a subtask holds a :class:`MasterGateway`
bound to its own attempt, vertex and index, so its code says what it reports
(``gateway.acknowledge_checkpoint(n, written, stats)``) and never which positional
arguments a Ray call on the master takes. Every call is one-way (``.remote()``, its
result never waited for): the master answers with messages of its own, and a master that
died is the failover's concern, not the subtask's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from raystream.checkpoint.handles import OperatorSubtaskState
from raystream.checkpoint.local_recovery import StateOrigin
from raystream.checkpoint.snapshot_stats import SnapshotStats


class JobMasterEndpoint(Protocol):
    """The job master's methods that subtasks call (through Ray)."""

    def report_finished(self, attempt: int, vertex: int, index: int, results: dict) -> None:
        ...

    def report_stage(self, attempt: int, vertex: int, index: int, stage: str,
                     at: float, origin: StateOrigin | None = None) -> None: ...

    def acknowledge_checkpoint(self, attempt: int, checkpoint_id: int, vertex: int, index: int,
                               written: dict[str, OperatorSubtaskState],
                               stats: SnapshotStats) -> None: ...

    def decline_checkpoint(self, attempt: int, checkpoint_id: int, vertex: int, index: int,
                           reason: str) -> None: ...

    def operator_event(self, attempt: int, operator: str, index: int, event: Any) -> None: ...

    def acknowledge_coordinator_checkpoint(self, attempt: int, operators: list[str], index: int,
                                           checkpoint_id: int) -> None: ...


@dataclass(frozen=True)
class MasterGateway:
    """Subtask ``index`` of vertex ``vertex`` in ``attempt``, talking to its job master
    (``master``: the master actor's Ray handle, a :class:`JobMasterEndpoint`)."""

    master: Any
    attempt: int
    vertex: int
    index: int

    def report_finished(self, results: dict) -> None:
        """Its input ended and its output is sent; ``results`` per sink operator."""
        self.master.report_finished.remote(self.attempt, self.vertex, self.index, results)

    def report_stage(self, stage: str, origin: StateOrigin | None = None) -> None:
        """It reached ``stage`` of its attempt's recovery (engine/recovery.py), now;
        ``origin``: at "restored", where its state came from."""
        self.master.report_stage.remote(self.attempt, self.vertex, self.index, stage,
                                        time.time(), origin)

    def acknowledge_checkpoint(self, checkpoint_id: int, written: dict[str, OperatorSubtaskState],
                               stats: SnapshotStats) -> None:
        self.master.acknowledge_checkpoint.remote(self.attempt, checkpoint_id, self.vertex,
                                                  self.index, written, stats)

    def decline_checkpoint(self, checkpoint_id: int, reason: str) -> None:
        self.master.decline_checkpoint.remote(self.attempt, checkpoint_id, self.vertex,
                                              self.index, reason)

    def operator_event(self, operator: str, event: Any) -> None:
        """An operator event from this subtask of ``operator`` to its coordinator."""
        self.master.operator_event.remote(self.attempt, operator, self.index, event)

    def acknowledge_coordinator_checkpoint(self, operators: list[str], checkpoint_id: int) -> None:
        """The synchronous snapshot of ``operators`` (with coordinators) is taken."""
        self.master.acknowledge_coordinator_checkpoint.remote(self.attempt, operators,
                                                              self.index, checkpoint_id)
