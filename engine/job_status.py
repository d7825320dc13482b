"""A job's status and the transitions between statuses (Flink's ``JobStatus``).

The job master changes its status only through :func:`check_transition`, so
the table below is every way a job's status can change:

>>> check_transition(JobStatus.RUNNING, JobStatus.RESTARTING)
<JobStatus.RESTARTING: 'RESTARTING'>
>>> check_transition(JobStatus.FINISHED, JobStatus.RUNNING)
Traceback (most recent call last):
...
raystream.engine.job_status.IllegalJobTransition: a job cannot go from FINISHED to RUNNING
>>> JobStatus.RUNNING == "RUNNING"  # a StrEnum: JSON and command-line output are unchanged
True
"""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    CREATED = "CREATED"
    DEPLOYING = "DEPLOYING"  # the first attempt's subtasks are being placed and wired
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"  # failing over: waiting for the restart delay, redeploying
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)


_ENDS = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED}
ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    # a job master that Ray restarted after its process died starts by failing the job over
    JobStatus.CREATED: frozenset({JobStatus.DEPLOYING, JobStatus.RESTARTING, JobStatus.FAILED}),
    # a subtask lost while deploying goes through the restart strategy like any failure
    JobStatus.DEPLOYING: frozenset({JobStatus.RUNNING, JobStatus.RESTARTING} | _ENDS),
    JobStatus.RUNNING: frozenset({JobStatus.RESTARTING} | _ENDS),
    # a failure while redeploying fails over again
    JobStatus.RESTARTING: frozenset({JobStatus.RUNNING, JobStatus.RESTARTING} | _ENDS),
    JobStatus.FINISHED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELED: frozenset(),
}


class IllegalJobTransition(RuntimeError):
    """The job master tried a status change the table does not allow (a bug)."""


def check_transition(current: JobStatus, new: JobStatus | str) -> JobStatus:
    """``new`` as a :class:`JobStatus`, if a job may go there from ``current``."""
    new = JobStatus(new)
    if new not in ALLOWED[current]:
        raise IllegalJobTransition(f"a job cannot go from {current} to {new}")
    return new
