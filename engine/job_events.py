"""What reaches the job master's event thread: typed, immutable events.

Subtasks (on the master's control lane) and clients only put events on the
master's queue; one thread takes them off and owns every transition of the
job. Each event names the attempt it belongs to, so the thread can drop
what an older attempt still sends after a failover.

    >>> event = CheckpointDeclined(attempt=0, checkpoint_id=3, subtask=(1, 0), reason="aborted")
    >>> event.subtask, event.checkpoint_id
    ((1, 0), 3)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any

from raystream.checkpoint.handles import OperatorSubtaskState
from raystream.checkpoint.local_recovery import StateOrigin
from raystream.checkpoint.snapshot_stats import SnapshotStats
from raystream.engine.recovery import RecoveryStage
from raystream.engine.savepoint_failure import SavepointFailure
SubtaskKey = tuple[int, int]  # (vertex id, subtask index)


class Reply:
    """A client's savepoint waiting for the event thread's answer: the savepoint's path, or
    why it failed (a value, not an exception: it reaches the client typed)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.answer: str | SavepointFailure | None = None

    def set(self, answer: str | SavepointFailure) -> None:
        self.answer = answer
        self._done.set()

    def wait(self, timeout_s: float | None) -> str | SavepointFailure | None:
        """The answer, or None if none came within ``timeout_s``."""
        self._done.wait(timeout_s)
        return self.answer


class SavepointMode(Enum):
    KEEP_RUNNING = "keep running"  # the job goes on; the savepoint commits nothing
    STOP = "stop"  # the sources stop at its barrier; the job ends after it
    DRAIN = "drain"  # the sources end their input; the final checkpoint is the savepoint


@dataclass(frozen=True)
class SavepointRequest:
    """A client waiting for a savepoint."""

    path: str
    mode: SavepointMode
    reply: Reply


@dataclass(frozen=True)
class CancelRequested:
    """A client asked to cancel the job."""


@dataclass(frozen=True)
class SavepointRequested:
    request: SavepointRequest


@dataclass(frozen=True)
class SubtaskFinished:
    """A subtask's input ended and its output is sent; ``results`` per sink operator."""

    attempt: int
    subtask: SubtaskKey
    results: dict


@dataclass(frozen=True)
class CheckpointAcknowledged:
    """A subtask's snapshot of a checkpoint is written (``written``: its state handles by
    operator)."""

    attempt: int
    checkpoint_id: int
    subtask: SubtaskKey
    written: dict[str, OperatorSubtaskState]
    stats: SnapshotStats


@dataclass(frozen=True)
class CheckpointDeclined:
    attempt: int
    checkpoint_id: int
    subtask: SubtaskKey
    reason: str


@dataclass(frozen=True)
class OperatorEventReceived:
    """An operator event from subtask ``index`` of ``operator`` to its coordinator."""

    attempt: int
    operator: str
    index: int
    event: Any


@dataclass(frozen=True)
class GatewayAcknowledged:
    """Subtask ``index`` of ``operators`` took its synchronous snapshot of a checkpoint
    (the operator coordinators' gateways may let that checkpoint's events through)."""

    attempt: int
    operators: tuple[str, ...]
    index: int
    checkpoint_id: int


@dataclass(frozen=True)
class SubtaskReachedStage:
    """A subtask reached a stage of its attempt's recovery ``at`` (wall clock): restored
    (its state restored and its operators open) or, a sink's, first record processed."""

    attempt: int
    subtask: SubtaskKey
    stage: RecoveryStage
    at: float
    origin: StateOrigin | None = None  # at RESTORED: where its state came from


JobEvent = (CancelRequested | SavepointRequested | SubtaskFinished | CheckpointAcknowledged
            | CheckpointDeclined | OperatorEventReceived | GatewayAcknowledged
            | SubtaskReachedStage)
