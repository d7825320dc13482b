"""The checkpoint barrier: what the coordinator triggers and subtasks pass on, and the
kind of snapshot it takes."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SnapshotKind(enum.Enum):
    """What a checkpoint barrier takes (one value, where three flags said it before).

        >>> SnapshotKind.DRAIN_SAVEPOINT.is_final, SnapshotKind.DRAIN_SAVEPOINT.stops
        (True, True)
        >>> SnapshotKind.SAVEPOINT.commits  # a running job's savepoint: no side effects
        False
    """

    CHECKPOINT = "checkpoint"  # periodic
    FINAL_CHECKPOINT = "final checkpoint"  # after every subtask's end of input (FLIP-147)
    SAVEPOINT = "savepoint"  # of a running job: it commits nothing, serves no failover
    STOP_SAVEPOINT = "stop-with-savepoint"  # sources emit nothing after its barrier
    DRAIN_SAVEPOINT = "drain savepoint"  # a drained job's final checkpoint, as a savepoint

    @property
    def is_savepoint(self) -> bool:
        """Its state goes to a savepoint's directory, which the job never deletes."""
        return self in _SAVEPOINTS

    @property
    def is_final(self) -> bool:
        """It follows the end of every input: the job ends once it completes."""
        return self in (SnapshotKind.FINAL_CHECKPOINT, SnapshotKind.DRAIN_SAVEPOINT)

    @property
    def stops(self) -> bool:
        """Sources emit nothing after its barrier."""
        return self in (SnapshotKind.STOP_SAVEPOINT, SnapshotKind.DRAIN_SAVEPOINT)

    @property
    def commits(self) -> bool:
        """Its completion commits side effects, and a failover may restore it."""
        return self is not SnapshotKind.SAVEPOINT


_SAVEPOINTS = frozenset({SnapshotKind.SAVEPOINT, SnapshotKind.STOP_SAVEPOINT,
                         SnapshotKind.DRAIN_SAVEPOINT})


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier ``checkpoint_id``; travels on the control lane.

    It is announced to each downstream channel with ``upto``: the sequence
    number of the last in-band message logically before the barrier on that
    channel (-1 if none). An *aligned* barrier sits behind everything its
    sender had put on the channel, sent or still waiting for credit; the
    receiver treats it as arrived once it has consumed every message up to
    ``upto`` — exactly where an in-band barrier would have been — so aligned
    checkpoints keep Flink's semantics while the barrier itself never waits
    for credit. An *unaligned* barrier (``unaligned=True``, Flink FLIP-76)
    overtakes the data its sender had not yet transmitted: ``upto`` is then
    the last sequence number *sent*, and the untransmitted rest is the
    sender's output channel state.

    ``aligned_timeout_ms``: the checkpoint starts aligned and turns unaligned
    wherever it is still in progress ``aligned_timeout_ms`` after
    ``trigger_ts_ms``. Savepoints are always aligned (both fields unset).
    """

    checkpoint_id: int
    attempt: int
    trigger_ts_ms: int
    kind: SnapshotKind = SnapshotKind.CHECKPOINT
    savepoint_target: str | None = None  # a savepoint's state goes here, not to checkpoint storage
    unaligned: bool = False
    aligned_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind.is_savepoint != (self.savepoint_target is not None):
            raise ValueError(f"a {self.kind.value} barrier with savepoint target "
                             f"{self.savepoint_target!r}: a savepoint has one, nothing else")

    @property
    def timeout_at_ms(self) -> int | None:
        """Wall-clock ms at which this aligned checkpoint turns unaligned, if ever."""
        if self.aligned_timeout_ms is None:
            return None
        return self.trigger_ts_ms + self.aligned_timeout_ms
