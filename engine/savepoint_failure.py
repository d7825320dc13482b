"""Why a savepoint a client asked for failed, typed from the job master to the client.

The job master answers a savepoint (or a stop with one) with its path or with a
:class:`SavepointFailure`, a value Ray returns as it is (never an exception of the
master's, which Ray would wrap with its own traceback). The client turns it into a
:class:`~raystream.SavepointFailedError`, and retries it when it is retryable and the
caller asked for retries.

    >>> f = SavepointFailure(SavepointFailureCause.FAILOVER, "/sp",
    ...                      "the job failed over after: a subtask died")
    >>> f.retryable, f.job_still_running
    (True, True)
    >>> print(f.message())
    savepoint to /sp failed: the job failed over after: a subtask died; the job is still running, and retrying makes sense
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from raystream.engine.errors import SavepointFailedError


class SavepointFailureCause(Enum):
    """What kept a savepoint from completing (or a stop savepoint from stopping the job)."""

    NO_CHECKPOINTS = "savepoints need checkpoints: StreamEnvironment(checkpoints=...)"
    DECLINED = "declined"  # by a subtask, an operator coordinator or the storage
    TIMED_OUT = "timed out"
    NO_ANSWER = "no answer in time"  # the caller's timeout_s: the savepoint may still complete
    FAILOVER = "the job failed over"
    JOB_ENDED = "the job ended before it"
    NOT_STOPPED = "complete, but the job did not stop"


# Causes after which the same call again may well succeed: the job still runs and the
# path holds no complete savepoint (a complete one's metadata would refuse a second).
_RETRYABLE = frozenset({SavepointFailureCause.DECLINED, SavepointFailureCause.TIMED_OUT,
                        SavepointFailureCause.FAILOVER})


@dataclass(frozen=True)
class SavepointFailure:
    """A savepoint to ``path`` failed for ``cause``; ``detail`` says it in the coordinator's
    or the failover's words (the cause's own when empty). ``job_still_running`` is False
    only when the job has ended."""

    cause: SavepointFailureCause
    path: str
    detail: str = ""
    job_still_running: bool = True

    @property
    def retryable(self) -> bool:
        return self.job_still_running and self.cause in _RETRYABLE

    def error(self) -> SavepointFailedError:
        return SavepointFailedError(self.message(), path=self.path, cause=self.cause,
                                    job_still_running=self.job_still_running,
                                    retryable=self.retryable)

    def message(self) -> str:
        if self.cause is SavepointFailureCause.NOT_STOPPED:
            head = (f"savepoint {self.path} is complete, but the job did not stop"
                    + (f" ({self.detail})" if self.detail else ""))
            advice = ("the job is still running, on from that savepoint; to stop it, stop "
                      "again with another path") if self.job_still_running else (
                "the job is no longer running")
        else:
            head = f"savepoint to {self.path} failed: {self.detail or self.cause.value}"
            if not self.job_still_running:
                advice = "the job is no longer running"
            elif self.retryable:
                advice = "the job is still running, and retrying makes sense"
            elif self.cause is SavepointFailureCause.NO_ANSWER:
                advice = ("the job is still running and the savepoint may still complete: "
                          "look at client.checkpoints() before asking again")
            else:
                advice = "the job is still running; a retry would fail the same way"
        return f"{head}; {advice}"
