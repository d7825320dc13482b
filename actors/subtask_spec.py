"""What a subtask is given to run (:class:`SubtaskSpec`) and what it reports when its
run ends (:class:`TerminationReport`, :class:`SubtaskEnding`): the data the job
master's deployment and the subtask's actor exchange (no Ray here)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from raystream.actors.subtask_checkpoints import CheckpointingSpec
from raystream.actors.vertex import JobVertex
from raystream.checkpoint.restore import RestoreSpec
from raystream.core.failpoints import Failpoint


@dataclass
class SubtaskSpec:
    job_id: str
    job_name: str
    attempt: int
    vertex: JobVertex
    index: int
    max_parallelism: int
    credits: int
    master: Any = None  # the job master actor: finished reports, checkpoint acknowledgements
    checkpointing: CheckpointingSpec | None = None
    restore: RestoreSpec | None = None
    failpoints: tuple[Failpoint, ...] = ()
    # how long the data in flight on the input may take to process (actors/credit_limit.py);
    # None: every sender holds all its credits
    in_flight_s: float | None = None

    @property
    def actor_name(self) -> str:
        return subtask_actor_name(self.job_id, self.vertex.name, self.index, self.attempt)


def subtask_actor_name(job_id: str, vertex_name: str, index: int, attempt: int) -> str:
    return f"raystream/{job_id}/{vertex_name}/{index}@{attempt}"


class SubtaskEnding(enum.Enum):
    """How a subtask's run ended."""

    FINISHED = "finished"  # stopped after its input ended and its output was committed
    FAILED = "failed"
    CANCELED = "canceled"


@dataclass
class TerminationReport:
    """How a subtask ended, returned to the job master."""

    vertex_id: int
    index: int
    status: SubtaskEnding
    error: str | None = None
    operator: str | None = None
    traceback: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    # the qualified names of the exception's classes, most derived first (the driver
    # raises a user's data error as its own type: engine/errors.job_failed_error)
    error_types: tuple[str, ...] = ()

    @staticmethod
    def error_types_of(cause: BaseException) -> tuple[str, ...]:
        """``module.Class`` of ``cause``'s class and of every class it derives from, most
        derived first.

            >>> TerminationReport.error_types_of(KeyError("k"))[:2]
            ('builtins.KeyError', 'builtins.LookupError')
        """
        return tuple(f"{k.__module__}.{k.__qualname__}" for k in type(cause).__mro__)
