"""Savepoints clients wait for, from the request to the answer (no Ray here).

The job master's event thread hands each :class:`SavepointRequest` to
:class:`SavepointRequests`, which asks the checkpoint coordinator for it and
answers the client once its checkpoint completes or fails. A *stop* savepoint
ends the job once complete; a *drain* one is the final checkpoint taken after
the sources ended their input. Both are answered by the job master once the
job has stopped and its outcome is published. A failure is answered as a typed
:class:`~raystream.engine.savepoint_failure.SavepointFailure`.
"""

from __future__ import annotations

from raystream.checkpoint.coordinator import (AbortCause, CheckpointCoordinator,
                                              CheckpointStatus, SavepointTicket)
from raystream.engine.job_events import SavepointMode, SavepointRequest
from raystream.engine.savepoint_failure import SavepointFailure, SavepointFailureCause as Cause

# a savepoint whose checkpoint the coordinator aborted: why (any other abort: declined)
_ABORTED = {AbortCause.TIMED_OUT: Cause.TIMED_OUT, AbortCause.FAILOVER: Cause.FAILOVER}


class SavepointRequests:
    def __init__(self) -> None:
        self.by_checkpoint: dict[int, SavepointRequest] = {}  # by the id of its checkpoint
        # asked for, waiting in the coordinator for a free checkpoint slot
        self.queued: list[tuple[SavepointTicket, SavepointRequest]] = []
        self.draining: SavepointRequest | None = None  # its savepoint is the final checkpoint
        # complete stop savepoints after which the job failed to stop: answered at failover
        self.unstopped: list[SavepointRequest] = []

    def request(self, request: SavepointRequest, coordinator: CheckpointCoordinator | None) -> bool:
        """Ask for ``request``'s savepoint. True: it drains the job (the sources are to end
        their input; the final checkpoint goes to its path). An exception of the
        coordinator is answered, then raised (the job fails over)."""
        if coordinator is None:
            request.reply.set(SavepointFailure(Cause.NO_CHECKPOINTS, request.path))
            return False
        if request.mode is SavepointMode.DRAIN:
            self.draining = request
            return True
        try:
            ticket = coordinator.request_savepoint(request.path,
                                                   stop=request.mode is SavepointMode.STOP)
        except Exception as exc:  # the job may fail over: the caller still hears
            request.reply.set(SavepointFailure(Cause.FAILOVER, request.path,
                                               f"{type(exc).__name__}: {exc}"))
            raise
        self.queued.append((ticket, request))
        return False

    def drain_target(self) -> str | None:
        """Where the final checkpoint goes (a drain savepoint's path), if anywhere."""
        return self.draining.path if self.draining is not None else None

    def final_triggered(self, checkpoint_id: int) -> None:
        """The final checkpoint was triggered: a drain savepoint waits for it."""
        if self.draining is not None:
            self.by_checkpoint[checkpoint_id] = self.draining

    def take_draining(self) -> SavepointRequest | None:
        """The final checkpoint completed: the drain savepoint (if any) ends the job."""
        request, self.draining = self.draining, None
        return request

    def answer(self, coordinator: CheckpointCoordinator) -> SavepointRequest | None:
        """Answer every savepoint whose checkpoint has ended; a completed stop savepoint
        is returned instead (the job ends after it, then it is answered)."""
        queued = []
        for ticket, request in self.queued:
            if ticket.checkpoint_id is None:
                queued.append((ticket, request))
            else:
                self.by_checkpoint[ticket.checkpoint_id] = request
        self.queued = queued
        for n, request in list(self.by_checkpoint.items()):
            stats = coordinator.checkpoint_stats(n)
            if stats is not None and stats.status is CheckpointStatus.PENDING:
                continue
            del self.by_checkpoint[n]
            if stats is None or stats.status is not CheckpointStatus.COMPLETED:
                if stats is None or stats.abort_cause is None:
                    failure = SavepointFailure(Cause.DECLINED, request.path,
                                               f"checkpoint {n}: no record of it is left")
                else:
                    failure = SavepointFailure(_ABORTED.get(stats.abort_cause, Cause.DECLINED),
                                               request.path, f"checkpoint {n} {stats.reason}")
                request.reply.set(failure)
                if request is self.draining:  # the input has ended: a checkpoint ends the job
                    self.draining = None
            elif request.mode is SavepointMode.KEEP_RUNNING:
                request.reply.set(stats.savepoint or request.path)
            elif request.mode is SavepointMode.STOP:
                return request
        return None

    def did_not_stop(self, request: SavepointRequest) -> None:
        """``request``'s stop savepoint is complete, but a subtask failed before the job
        stopped: the failover that follows answers it."""
        self.unstopped.append(request)

    def answer_open(self, coordinator: CheckpointCoordinator | None, cause: Cause, reason: str,
                    *, job_still_running: bool) -> None:
        """A failover (``cause`` FAILOVER) or the end of the job (JOB_ENDED): every
        savepoint not answered yet is answered now (a completed one that was to stop the
        job did not stop it)."""
        open_requests: list[tuple[int | None, SavepointRequest]] = list(self.by_checkpoint.items())
        open_requests += [(ticket.checkpoint_id, request) for ticket, request in self.queued]
        if self.draining is not None and self.draining not in self.by_checkpoint.values():
            open_requests.append((None, self.draining))
        for request in self.unstopped:
            request.reply.set(SavepointFailure(Cause.NOT_STOPPED, request.path, reason,
                                               job_still_running))
        self.by_checkpoint, self.queued, self.draining, self.unstopped = {}, [], None, []
        for n, request in open_requests:
            stats = coordinator.checkpoint_stats(n) if coordinator and n else None
            if stats is not None and stats.status is CheckpointStatus.COMPLETED:
                if request.mode is SavepointMode.KEEP_RUNNING:
                    request.reply.set(stats.savepoint or request.path)
                else:
                    request.reply.set(SavepointFailure(Cause.NOT_STOPPED, request.path, reason,
                                                       job_still_running))
            else:
                request.reply.set(SavepointFailure(cause, request.path, reason,
                                                   job_still_running))
