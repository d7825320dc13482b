"""What a job does after a failure: restart from a checkpoint, or fail (no Ray here).

The job master's event thread turns every failure (a subtask's report, a
coordinator's exception) into a :class:`Failure` and asks :class:`Failover`
what to do. The answer depends only on the job's history:

* a job without checkpoints fails on its first failure;
* otherwise the job restarts until the restart strategy's attempts are used
  up, after its delay, from the newest completed checkpoint, else from the
  savepoint it started from (``restore_from``), else from the beginning;
* the restart is a region's (its subtasks alone, as the new attempt) when the
  master offers a region (:mod:`raystream.engine.regions`: it does only when
  nothing is in doubt) and there is a completed checkpoint to restore it
  from; otherwise every subtask restarts. Every restart, of a region or of the
  job, counts against the strategy and takes a new attempt number, so no two
  deployments ever share one.

    >>> from raystream.checkpoint.config import RestartStrategy
    >>> failover = Failover(RestartStrategy.fixed_delay(2, 0.5))
    >>> failover.on_failure(Failure("boom"), completed=[3, 4], at=0.0)
    Restart(attempt=1, delay_s=0.5, source=<RestoreSource.CHECKPOINT: 'checkpoint'>, checkpoint_id=4, region=None)
    >>> failover.on_failure(Failure("boom"), completed=[4], at=0.5, region=frozenset({(0, 1)})).region
    frozenset({(0, 1)})
    >>> failover.on_failure(Failure("boom again"), completed=[4], at=1.0).error
    'boom again (restart attempts exhausted: 2)'
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raystream.checkpoint.config import RestartStrategy


@dataclass(frozen=True)
class Failure:
    """A failure of the job: what went wrong, where (subtask index None: not a subtask's)."""

    error: str | None
    operator: str | None = None
    subtask: int | None = None
    traceback: str | None = None
    error_types: tuple[str, ...] = ()  # the exception's classes (TerminationReport's)
    vertex: int | None = None  # the failed subtask's vertex (None: not a subtask's)

    @property
    def message(self) -> str:
        return self.error or "unknown failure"


class FailoverStrategy(enum.Enum):
    """What a failure restarts (Flink's ``jobmanager.execution.failover-strategy``)."""

    REGION = "region"  # the failed subtask's pipelined region, where nothing is in doubt
    FULL = "full"  # every subtask, always


class RestoreSource(enum.Enum):
    CHECKPOINT = "checkpoint"  # the newest completed checkpoint (or stop savepoint) of the job
    SAVEPOINT = "savepoint"  # the savepoint or checkpoint the job was started from
    BEGINNING = "beginning"  # nothing completed yet: the input starts over


@dataclass(frozen=True)
class Restart:
    """Redeploy the job as ``attempt`` after ``delay_s``. ``checkpoint_id``: the one the
    restore is expected to use (the coordinator verifies it, and goes back to an older
    one only if the newest is corrupt and committed nothing)."""

    attempt: int
    delay_s: float
    source: RestoreSource
    checkpoint_id: int | None
    region: frozenset[tuple[int, int]] | None = None  # restart these subtasks alone


@dataclass(frozen=True)
class FailJob:
    """The job ends FAILED with ``error`` (which says why it was not restarted)."""

    error: str
    operator: str | None = None
    subtask: int | None = None
    traceback: str | None = None
    error_types: tuple[str, ...] = ()


Decision = Restart | FailJob


class Failover:
    """The failures of one job so far, and what each one calls for.

    ``initial_checkpoint``: the id of the savepoint (or retained checkpoint) the job
    was started from with ``restore_from``; None for a job started empty.
    """

    def __init__(self, restart: RestartStrategy, initial_checkpoint: int | None = None) -> None:
        self.restart = restart
        self.initial_checkpoint = initial_checkpoint
        # every failure restarts the job once or ends it: the attempt deployed now is
        # the number of failures so far
        self.failures: list[str] = []
        # each failure with where it happened and its traceback, for the web UI
        self.failure_details: list[dict[str, Any]] = []

    def carry_on(self, failure_details: Sequence[dict[str, Any]]) -> None:
        """This failover takes over from a job master that died, after ``failure_details``
        (its :attr:`failure_details`): the restart strategy counts them too."""
        self.failure_details = [dict(d) for d in failure_details]
        self.failures = [d["error"] for d in self.failure_details]

    def started_from(self, checkpoint_id: int | None) -> None:
        """The job's first attempt restored ``checkpoint_id`` (``restore_from``)."""
        self.initial_checkpoint = checkpoint_id

    def on_failure(self, failure: Failure, completed: Sequence[int] | None,
                   at: float, region: frozenset[tuple[int, int]] | None = None) -> Decision:
        """Record ``failure`` (at wall-clock time ``at``) and decide. ``completed``: the ids
        of the job's completed checkpoints, oldest first (None: the job takes none).
        ``region``: the subtasks that may restart alone (None: the whole job)."""
        self.failure_details.append({"attempt": len(self.failures), "at": at,
                                     "error": failure.message, "operator": failure.operator,
                                     "subtask": failure.subtask, "traceback": failure.traceback})
        self.failures.append(failure.message)
        restart = len(self.failures)
        if completed is None:
            return self._fail(failure, " (no checkpoints: no restart)")
        if restart > self.restart.attempts:
            return self._fail(failure, f" (restart attempts exhausted: {self.restart.attempts})"
                              if self.restart.attempts else "")
        if completed:
            return Restart(restart, self.restart.delay_before(restart), RestoreSource.CHECKPOINT,
                           completed[-1], region)
        if self.initial_checkpoint is not None:
            source, checkpoint_id = RestoreSource.SAVEPOINT, self.initial_checkpoint
        else:
            source, checkpoint_id = RestoreSource.BEGINNING, None
        return Restart(restart, self.restart.delay_before(restart), source, checkpoint_id)

    @staticmethod
    def cannot_restore(failure: Failure, reason: str) -> FailJob:
        """A restart found nothing it may go back to (a corrupt checkpoint that committed
        output, a savepoint gone): the job fails, naming the failure that started it."""
        return FailJob(f"{failure.error}; the job cannot restore: {reason}",
                       operator=failure.operator, traceback=failure.traceback)

    @staticmethod
    def _fail(failure: Failure, why: str) -> FailJob:
        return FailJob((failure.error or "") + why, operator=failure.operator,
                       subtask=failure.subtask, traceback=failure.traceback,
                       error_types=failure.error_types)
