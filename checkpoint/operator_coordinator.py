"""Operator coordinators: the job-level brain of an operator (Flink ``OperatorCoordinator``).

A coordinator lives in the job master, beside the checkpoint coordinator, and
talks to the parallel instances (subtasks) of its operator through *operator
events*: it sends them with ``context.send_event(subtask, event)`` and
receives theirs in :meth:`OperatorCoordinator.handle_event_from_subtask`. An
operator receives events in ``Operator.handle_operator_event(event)`` and
sends them with ``self.ctx.send_event_to_coordinator(event)``. Events are any
picklable values and travel on the subtasks' control lane.

Checkpoints snapshot every coordinator *first*
(:meth:`OperatorCoordinator.checkpoint_coordinator`), then the subtasks; the
subtask gateways (:mod:`raystream.checkpoint.subtask_gateway`) hold the events
sent after a coordinator's snapshot until the subtask has taken its own, so an
event is in both snapshots or in neither. On failover every coordinator is
reset to the checkpoint the job restores (:meth:`reset_to_checkpoint`); events
it had sent after that checkpoint are forgotten on both sides.

All methods run on the job master's event thread, one at a time: never block
in them. ``context.call_later`` schedules work on that thread, and
``context.call_async`` runs blocking work on a worker thread and hands its
result back to that thread (a coordinator that discovers files polls that way).

    >>> class Countdown(OperatorCoordinator):
    ...     '''Sends 3, 2, 1 to every subtask once it is ready.'''
    ...     def __init__(self, context): self.context = context
    ...     def subtask_ready(self, subtask, gateway):
    ...         for n in (3, 2, 1): gateway.send_event(n)
    >>> stream.transform("receiver", Receiver, coordinator=Countdown)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")


class SubtaskEventGateway(Protocol):
    """Sends events to one subtask of the current attempt, in order."""

    def send_event(self, event: Any) -> None: ...


class OperatorCoordinatorContext(Protocol):
    """What a coordinator can do: send events, schedule work, fail the job."""

    operator_name: str
    parallelism: int

    def send_event(self, subtask: int, event: Any) -> None:
        """Send ``event`` to subtask ``subtask`` (0-based) of the operator, in order."""

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the job master's event thread after ``delay_s`` seconds.
        Calls scheduled before a failover are dropped."""

    def call_async(self, work: Callable[[], T],
                   handler: Callable[[T | None, BaseException | None], None]) -> None:
        """Run ``work`` on a worker thread (for what may block: listing a directory,
        reading file footers), then ``handler(result, None)`` -- or
        ``handler(None, error)`` if it raised -- on the event thread. ``work`` must
        not touch the coordinator's state; ``handler`` may. Results of work started
        before a failover are dropped."""

    def fail_job(self, reason: str) -> None:
        """Fail the job (it fails over where its restart strategy allows)."""


class OperatorCoordinator:
    """Base class of operator coordinators; every method has a no-op default but
    :meth:`checkpoint_coordinator` and :meth:`reset_to_checkpoint` go together: a
    coordinator with state implements both.

    A coordinator class is created with its context: ``Coordinator(context)``.
    """

    def start(self) -> None:
        """Called once, before any subtask is ready."""

    def close(self) -> None:
        """The job ended (finished, failed or cancelled)."""

    def handle_event_from_subtask(self, subtask: int, event: Any) -> None:
        """An event sent by subtask ``subtask`` of the operator."""

    def checkpoint_coordinator(self, checkpoint_id: int) -> bytes:
        """This coordinator's state for checkpoint ``checkpoint_id``; taken before any
        subtask's snapshot of it. Events sent after this call are delivered after
        each subtask's snapshot of the checkpoint."""
        return b""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete (durable)."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted."""

    def reset_to_checkpoint(self, checkpoint_id: int | None, state: bytes | None) -> None:
        """Global failover: go back to the state of checkpoint ``checkpoint_id`` (``state``
        as :meth:`checkpoint_coordinator` returned it), or to the initial state when
        the job restarts without a checkpoint (both None)."""

    def supports_subtask_reset(self) -> bool:
        """Can :meth:`subtask_reset` restore one subtask alone? False (the default): every
        failover of the job is global (:meth:`reset_to_checkpoint`)."""
        return False

    def subtask_reset(self, subtask: int, checkpoint_id: int | None) -> None:
        """Subtask ``subtask`` alone is restored to ``checkpoint_id`` (a region failover):
        what it was sent after that checkpoint is not in its state any more, while the
        coordinator and the other subtasks go on. It is ready again with
        :meth:`subtask_ready`."""

    def subtask_ready(self, subtask: int, gateway: "SubtaskEventGateway") -> None:
        """Subtask ``subtask`` of the current attempt runs and can receive events, through
        ``gateway`` or ``context.send_event(subtask, ...)`` (the same gateway)."""
