"""A failover's recovery, by stage: what the job master saw, and when.

A failure is followed by a fixed sequence of stages, each reached once,
in order, timed in seconds since the master detected the failure:

* ``DETECTED`` (0): the master learned of the failure (a subtask's process
  died, an operator raised, a checkpoint failure went over its bound) and
  aborted the checkpoints in flight;
* ``CANCELLED``: the previous attempt is gone: the restart delay is over, the
  checkpoint to restore is chosen, and every live actor has stopped its old
  subtask (a dead one is replaced);
* ``DEPLOYED``: every subtask of the new attempt is wired to its neighbours
  and started;
* ``RESTORED``: every subtask has restored its state and opened its operators
  (each says where its state came from: its process's local copy or checkpoint
  storage, :class:`~raystream.checkpoint.local_recovery.StateOrigin`);
* ``FIRST_RECORD``: a sink of the new attempt processed its first record.

A sink is a chain without outputs or an exactly-once sink's writer (its
committables alone go on, to the committer). A region failover's recovery (its
row names the ``region``) is timed over the region's subtasks alone.

A stage reached out of order is a bug of the caller and raises. The master
keeps one :class:`Recovery` per failover (``JobResult.restores``,
``client.progress()["restores"]``, ``raystream status`` and the web UI show
them as :meth:`Recovery.as_dict` rows).

    >>> r = Recovery.detected(attempt=1, failure="sum[0] died", at=1_700_000_000.0)
    >>> r = r.reached(RecoveryStage.CANCELLED, 0.25).reached(RecoveryStage.DEPLOYED, 0.4)
    >>> r.next_stage, r.seconds(RecoveryStage.DEPLOYED), r.complete
    (<RecoveryStage.RESTORED: 'restored'>, 0.4, False)
    >>> r.reached(RecoveryStage.FIRST_RECORD, 0.9)
    Traceback (most recent call last):
    ...
    ValueError: recovery of attempt 1: stage first_record reached before restored
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from raystream.checkpoint.local_recovery import StateOrigin


class RecoveryStage(enum.Enum):
    """The stages of a recovery, in the order they are reached."""

    DETECTED = "detected"
    CANCELLED = "cancelled"
    DEPLOYED = "deployed"
    RESTORED = "restored"
    FIRST_RECORD = "first_record"


STAGES = tuple(RecoveryStage)


@dataclass(frozen=True)
class RestoredFrom:
    """Where one subtask's restored state came from (``subtask``: ``chain[index]``)."""

    subtask: str
    origin: StateOrigin


@dataclass(frozen=True)
class Recovery:
    """One failover: the failure, the checkpoint restored, and the stages reached."""

    attempt: int  # the attempt the recovery deploys
    failure: str
    at: float  # wall-clock time (s since the epoch) the failure was detected
    checkpoint_id: int | None = None
    lost_nodes: tuple[str, ...] = ()
    stages: tuple[float, ...] = (0.0,)  # seconds since detection, one per stage reached
    restored_from: tuple[RestoredFrom, ...] = ()  # by subtask, in the order they reported
    region: tuple[str, ...] = ()  # a region failover's subtasks (``chain[index]``); (): all

    @classmethod
    def detected(cls, *, attempt: int, failure: str, at: float) -> Recovery:
        return cls(attempt, failure, at)

    @property
    def next_stage(self) -> RecoveryStage | None:
        """The stage to be reached next (None once the first record was processed)."""
        return STAGES[len(self.stages)] if len(self.stages) < len(STAGES) else None

    @property
    def complete(self) -> bool:
        return self.next_stage is None

    def reached(self, stage: RecoveryStage, seconds: float) -> Recovery:
        """This recovery with ``stage`` reached ``seconds`` after the detection."""
        if stage is not self.next_stage:
            expected = "none" if self.next_stage is None else self.next_stage.value
            raise ValueError(f"recovery of attempt {self.attempt}: stage {stage.value} reached "
                             f"before {expected}")
        # clocks of different processes may disagree by a little: a stage never precedes
        return dataclasses.replace(self, stages=(*self.stages, max(seconds, self.stages[-1])))

    def restoring(self, checkpoint_id: int | None, lost_nodes: tuple[str, ...],
                  region: tuple[str, ...] = ()) -> Recovery:
        return dataclasses.replace(self, checkpoint_id=checkpoint_id, lost_nodes=lost_nodes,
                                   region=region)

    def restored(self, subtask: str, origin: StateOrigin) -> Recovery:
        """This recovery with ``subtask``'s state restored from ``origin``."""
        return dataclasses.replace(
            self, restored_from=(*self.restored_from, RestoredFrom(subtask, origin)))

    @property
    def restored_locally(self) -> tuple[str, ...]:
        """The subtasks that restored their state from their process's local copy."""
        return tuple(r.subtask for r in self.restored_from if r.origin is StateOrigin.LOCAL)

    def seconds(self, stage: RecoveryStage) -> float | None:
        """When ``stage`` was reached, in seconds since detection (None: not yet)."""
        index = STAGES.index(stage)
        return self.stages[index] if index < len(self.stages) else None

    @property
    def restore_s(self) -> float | None:
        """From the detection until the new attempt ran (deployed)."""
        return self.seconds(RecoveryStage.DEPLOYED)

    def as_dict(self) -> dict[str, Any]:
        """The row published for people and clients (and noted for a successor master)."""
        return {"attempt": self.attempt, "failure": self.failure, "at": self.at,
                "checkpoint_id": self.checkpoint_id, "lost_nodes": list(self.lost_nodes),
                "restore_s": self.restore_s,
                "stages": {s.value: t for s, t in zip(STAGES, self.stages)},
                "restored_from": {r.subtask: r.origin.value for r in self.restored_from},
                "region": list(self.region)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Recovery:
        """A row of :meth:`as_dict` (rows noted before stages were kept: their restore time
        as the deployed stage)."""
        stages = raw.get("stages")
        if stages is None:
            restore_s = raw.get("restore_s")
            times = (0.0,) if restore_s is None else (0.0, restore_s, restore_s)
        else:
            times = tuple(stages[s.value] for s in STAGES if s.value in stages)
        restored_from = tuple(RestoredFrom(subtask, StateOrigin(origin))
                              for subtask, origin in raw.get("restored_from", {}).items())
        return cls(raw["attempt"], raw["failure"], raw.get("at", 0.0), raw.get("checkpoint_id"),
                   tuple(raw.get("lost_nodes", ())), times, restored_from,
                   tuple(raw.get("region", ())))


class RecoveryClock:
    """Times the stages of one attempt's recovery from what its deployment and its
    subtasks report (events in, the :class:`Recovery` so far out).

    A sink may process a record before the slowest subtask has opened (another
    region's); that record counts once every subtask has opened.

    >>> clock = RecoveryClock(Recovery.detected(attempt=2, failure="x", at=100.0), subtasks=2)
    >>> clock.deployed(cancelled_at=100.2, deployed_at=100.3)
    >>> clock.reached(RecoveryStage.RESTORED, (0, 0), at=100.5)
    >>> clock.reached(RecoveryStage.FIRST_RECORD, (0, 0), at=100.6)
    >>> clock.reached(RecoveryStage.RESTORED, (1, 0), at=100.7)
    >>> [round(s, 2) for s in clock.recovery.stages]
    [0.0, 0.2, 0.3, 0.7, 0.7]
    """

    def __init__(self, recovery: Recovery, subtasks: int) -> None:
        self.recovery = recovery
        self.subtasks = subtasks
        self._opened: dict[tuple[int, int], float] = {}
        self._first_record_at: float | None = None

    def _reach(self, stage: RecoveryStage, at: float) -> None:
        self.recovery = self.recovery.reached(stage, at - self.recovery.at)

    def deployed(self, *, cancelled_at: float, deployed_at: float) -> None:
        self._reach(RecoveryStage.CANCELLED, cancelled_at)
        self._reach(RecoveryStage.DEPLOYED, deployed_at)
        self._settle()

    def reached(self, stage: RecoveryStage, subtask: tuple[int, int], *, at: float,
                restored_from: RestoredFrom | None = None) -> None:
        """``subtask`` reported ``stage``: RESTORED (its state restored, its operators open;
        ``restored_from``: where its state came from) or FIRST_RECORD (a sink processed its
        first record)."""
        if stage is RecoveryStage.RESTORED:
            if subtask not in self._opened and restored_from is not None:
                self.recovery = self.recovery.restored(restored_from.subtask,
                                                       restored_from.origin)
            self._opened.setdefault(subtask, at)
        elif stage is RecoveryStage.FIRST_RECORD:
            if self._first_record_at is None or at < self._first_record_at:
                self._first_record_at = at  # the earliest heard before the stage is due
        else:
            raise ValueError(f"a subtask reports restored or first_record, not {stage.value}")
        self._settle()

    def _settle(self) -> None:
        # subtasks may open before the deployment has returned: their reports wait for it
        if (self.recovery.next_stage is RecoveryStage.RESTORED
                and len(self._opened) == self.subtasks):
            self._reach(RecoveryStage.RESTORED, max(self._opened.values()))
        if (self.recovery.next_stage is RecoveryStage.FIRST_RECORD
                and self._first_record_at is not None):
            self._reach(RecoveryStage.FIRST_RECORD, self._first_record_at)


class RecoveryLog:
    """A job's recoveries, oldest first, with the clock of the one under way.

    >>> log = RecoveryLog(subtasks=1)
    >>> log.begin(Recovery.detected(attempt=1, failure="x", at=10.0))
    >>> log.timed(1, lambda clock: clock.deployed(cancelled_at=10.1, deployed_at=10.2))
    >>> log.timed(0, lambda clock: clock.deployed(cancelled_at=99, deployed_at=99))  # no one's
    >>> [round(s, 2) for s in log.recoveries[-1].stages]
    [0.0, 0.1, 0.2]
    """

    def __init__(self, subtasks: int, recoveries: Iterable[Recovery] = ()) -> None:
        self.subtasks = subtasks
        self.recoveries = list(recoveries)
        self._clock: RecoveryClock | None = None

    def begin(self, recovery: Recovery) -> None:
        """``recovery`` is under way: the attempt it deploys (the job's subtasks, or its
        region's) is timed by stage from now on."""
        self.recoveries.append(recovery)
        self._clock = RecoveryClock(recovery, len(recovery.region) or self.subtasks)

    def timed(self, attempt: int, change: Callable[[RecoveryClock], None]) -> None:
        """Apply what ``attempt``'s deployment or a subtask reported to the recovery under
        way (nothing if none, or it is another attempt's: the first one is no recovery)."""
        clock = self._clock
        if clock is None or clock.recovery.attempt != attempt:
            return
        change(clock)
        self.recoveries[-1] = clock.recovery
        if clock.recovery.complete:
            self._clock = None

    def rows(self) -> list[dict[str, Any]]:
        return [r.as_dict() for r in self.recoveries]


def describe(row: dict[str, Any]) -> str:
    """One line for people of a row of :meth:`Recovery.as_dict`.

    >>> describe(Recovery.detected(attempt=1, failure="x", at=0.0).reached(
    ...     RecoveryStage.CANCELLED, 0.2).as_dict())
    'attempt 1 from the start: cancelled 0.20 s (deployed: not yet)'
    """
    checkpoint = row.get("checkpoint_id")
    where = "the start" if checkpoint is None else f"checkpoint {checkpoint}"
    stages = row.get("stages") or {}
    reached = [f"{stage.value.replace('_', ' ')} {stages[stage.value]:.2f} s"
               for stage in STAGES[1:] if stage.value in stages]
    pending = next((s for s in STAGES if s.value not in stages), None)
    waiting = "" if pending is None else f" ({pending.value.replace('_', ' ')}: not yet)"
    origins = list((row.get("restored_from") or {}).values())
    local = (f"; {origins.count(StateOrigin.LOCAL.value)} of {len(origins)} subtasks restored "
             f"locally" if origins else "")
    return (f"attempt {row['attempt']} from {where}: {', '.join(reached) or 'detected'}"
            f"{waiting}{local}")
