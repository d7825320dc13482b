"""How a job runs: the options its driver hands to the job master, the master's actor
name and its Ray restart options (no Ray here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from raystream.checkpoint.config import CheckpointConfig, RestartStrategy
from raystream.core.failpoints import Failpoint
from raystream.engine.failover import FailoverStrategy
from raystream.engine.job_progress import Extent
from raystream.engine.plan import JobPlan


@dataclass(frozen=True)
class JobOptions:
    credits: int = 8
    in_flight_s: float | None = None  # see StreamEnvironment(in_flight_ms=...)
    actor_start_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0  # for every subtask to stop (and confirm its final commit)
    checkpoints: CheckpointConfig | None = None
    restart: RestartStrategy = field(default_factory=RestartStrategy.none)
    failover: FailoverStrategy = FailoverStrategy.REGION
    failpoints: tuple[Failpoint, ...] = ()
    restore_from: str | None = None
    submission_id: str | None = None  # the Ray Jobs API submission that runs the driver
    # the actor name of the driver's pool keeper, which leased idle subtask actors to the
    # job for its first attempt (engine/actor_pool.py); they go back to it when it ends
    pool_keeper: str | None = None
    # a detached job master outlives its driver, and ends itself DETACHED_LINGER_S after
    # the job ended (time for a client to fetch the outcome) unless a client ends it first
    detached: bool = False
    # what the driver knows of the input (for the job's progress: the share read)
    input_extent: Extent = Extent(bounded=False, rows=None)

    @property
    def may_restart(self) -> bool:
        """Whether the job may restart after a failure, its master's death included."""
        return self.checkpoints is not None and self.restart.attempts > 0


@dataclass(frozen=True)
class MasterAssignment:
    """The job a job master runs: given to its constructor, or to a warm master's ``run``
    (:mod:`raystream.engine.master_pool`)."""

    job_id: str
    job_name: str
    plan: JobPlan
    options: JobOptions


RESUME_HINT = ("resume it from its newest completed checkpoint with env.execute('{name}', "
               "resume=True) or raystream run --resume")

DETACHED_LINGER_S = 600.0


def master_actor_name(job_id: str) -> str:
    """The Ray actor name (in namespace ``raystream``) of a job's master: named by the
    suffix of the job id (``<name>-<hex>``), which a warm master is created with before
    its job is known (:mod:`raystream.engine.master_pool`).

        >>> master_actor_name("clicks-0a1b2c3d")
        'raystream/master/0a1b2c3d'
    """
    return f"raystream/master/{job_id.rsplit('-', 1)[-1]}"


def master_restarts(options: JobOptions) -> dict[str, int]:
    """Ray's restart options for the master of a job: one that fails over is restarted
    when its process dies (at most as often as the job may restart; each restart is a
    failover), and the calls clients and subtasks had made to it go to its successor."""
    if not options.may_restart:
        return {"max_restarts": 0, "max_task_retries": 0}
    return {"max_restarts": options.restart.attempts, "max_task_retries": -1}
