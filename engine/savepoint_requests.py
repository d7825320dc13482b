"""Savepoints clients wait for, from the request to the answer (no Ray here).

The job master's event thread hands each :class:`SavepointRequest` to
:class:`SavepointRequests`, which asks the checkpoint coordinator for it and
answers the client once its checkpoint completes or fails. A *stop* savepoint
ends the job once complete; a *drain* one is the final checkpoint taken after
the sources ended their input. Both are answered by the job master once the
job has stopped and its outcome is published.
"""

from __future__ import annotations

from raystream.checkpoint.coordinator import (CheckpointCoordinator, CheckpointStatus,
                                              SavepointTicket)
from raystream.engine.job_events import SavepointMode, SavepointRequest


class SavepointRequests:
    def __init__(self) -> None:
        self.by_checkpoint: dict[int, SavepointRequest] = {}  # by the id of its checkpoint
        # asked for, waiting in the coordinator for a free checkpoint slot
        self.queued: list[tuple[SavepointTicket, SavepointRequest]] = []
        self.draining: SavepointRequest | None = None  # its savepoint is the final checkpoint

    def request(self, request: SavepointRequest, coordinator: CheckpointCoordinator | None) -> bool:
        """Ask for ``request``'s savepoint. True: it drains the job (the sources are to end
        their input; the final checkpoint goes to its path). An exception of the
        coordinator is answered, then raised (the job fails over)."""
        if coordinator is None:
            request.reply.set(
                error="savepoints need checkpoints: StreamEnvironment(checkpoints=...)")
            return False
        if request.mode is SavepointMode.DRAIN:
            self.draining = request
            return True
        try:
            ticket = coordinator.request_savepoint(request.path,
                                                   stop=request.mode is SavepointMode.STOP)
        except Exception as exc:  # the job may fail over: the caller still hears
            request.reply.set(error=f"savepoint to {request.path} failed: "
                                    f"{type(exc).__name__}: {exc}")
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
                reason = stats.reason if stats is not None else "no record of it is left"
                request.reply.set(error=f"savepoint {n} failed: {reason}")
                if request is self.draining:  # the input has ended: a checkpoint ends the job
                    self.draining = None
            elif request.mode is SavepointMode.KEEP_RUNNING:
                request.reply.set(stats.savepoint)
            elif request.mode is SavepointMode.STOP:
                return request
        return None

    def answer_open(self, coordinator: CheckpointCoordinator | None, reason: str) -> None:
        """A failover or the end of the job: every savepoint not answered yet is answered
        now (a completed one that was to stop the job did not stop it)."""
        open_requests: list[tuple[int | None, SavepointRequest]] = list(self.by_checkpoint.items())
        open_requests += [(ticket.checkpoint_id, request) for ticket, request in self.queued]
        if self.draining is not None and self.draining not in self.by_checkpoint.values():
            open_requests.append((None, self.draining))
        self.by_checkpoint, self.queued, self.draining = {}, [], None
        for n, request in open_requests:
            stats = coordinator.checkpoint_stats(n) if coordinator and n else None
            if stats is not None and stats.status is CheckpointStatus.COMPLETED:
                if request.mode is SavepointMode.KEEP_RUNNING:
                    request.reply.set(stats.savepoint)
                else:
                    request.reply.set(error=f"savepoint {request.path} is complete, but the job "
                                            f"did not stop: {reason}")
            else:
                request.reply.set(error=f"savepoint to {request.path} failed: {reason}")
