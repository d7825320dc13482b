"""The Ray actor hosting a subtask (:class:`~raystream.actors.subtask.Subtask`).

Calls reach it on two Ray concurrency groups (see docs/architecture.md, "The data
plane"): the *data* lane (``deliver``) only enqueues into the input gate and returns;
the *control* lane (credits, checkpoint triggers, barriers, checkpoint notifications,
stop, cancel) only enqueues into the mailbox and returns. A third group, *monitor*,
holds the one long call ``await_termination`` through which the job master learns how
the subtask ended (or that its process died).
"""

from __future__ import annotations

from typing import Any

import ray

from raystream.actors.barrier_handler import CheckpointAborted, TriggerReceived
from raystream.actors.liveness import SubtaskLiveness
from raystream.actors.mailbox import (BarrierReceived, Cancel, CheckpointCompleted, Credit,
                                      Drain, OperatorEvent, Stop)
from raystream.actors.messages import ChannelId, Envelope
from raystream.actors.subtask import Subtask
from raystream.actors.subtask_spec import SubtaskSpec, TerminationReport
from raystream.checkpoint.barrier import Barrier
from raystream.checkpoint import local_recovery

HOST_STOP_TIMEOUT_S = 10.0


# ray's typed overloads of remote() lack concurrency_groups
@ray.remote(concurrency_groups={"data": 1, "control": 1, "monitor": 1},  # pyright: ignore[reportCallIssue]
            max_restarts=0, max_task_retries=0)
class SubtaskActor:
    """Ray actor hosting one :class:`Subtask` (its methods only enqueue or report).

    Created with a spec, or empty as a warm spare; :meth:`host` swaps in the
    subtask of a new attempt. Failover reuses live actors that way: a new
    attempt need not wait for new worker processes to start and import.
    """

    def __init__(self, spec: SubtaskSpec | None = None) -> None:
        # pyarrow imports pandas at the first Arrow -> numpy conversion, about half a second
        # of a subtask's first batch; importing it here puts that into the process start,
        # before the actor reports ready (and keeps it out of the job master and the driver)
        import pandas  # noqa: F401

        self.subtask = Subtask(spec) if spec is not None else None

    def _hosted(self) -> Subtask:
        if self.subtask is None:
            raise RuntimeError("this actor hosts no subtask yet (a warm spare): host() one first")
        return self.subtask

    def ready(self) -> str:
        """Answered once the actor is up: the id of the Ray node it runs on."""
        return ray.get_runtime_context().get_node_id()

    @ray.method(concurrency_group="control")
    def host(self, spec: SubtaskSpec) -> str:
        """Cancel the current subtask, wait until it has stopped, and host ``spec``'s."""
        old = self.subtask
        if old is not None and old.started:
            old.post(Cancel())
            if not old.done.wait(HOST_STOP_TIMEOUT_S):
                raise RuntimeError(f"subtask {old.spec.actor_name} did not stop within "
                                   f"{HOST_STOP_TIMEOUT_S:.0f} s")
        self.subtask = Subtask(spec)
        return spec.actor_name

    @ray.method(concurrency_group="control")
    def connect(self, downstream: dict, upstream: dict) -> None:
        self._hosted().connect(downstream, upstream)

    @ray.method(concurrency_group="control")
    def start(self) -> None:
        self._hosted().start()

    @ray.method(concurrency_group="data")
    def deliver(self, envelope: Envelope) -> None:
        subtask = self.subtask
        if subtask is not None:
            subtask.deliver(envelope)

    @ray.method(concurrency_group="control")
    def add_credit(self, channel: ChannelId, n: int, attempt: int) -> None:
        subtask = self.subtask
        if subtask is not None and attempt == subtask.spec.attempt:
            subtask.post(Credit(channel, n))

    @ray.method(concurrency_group="control")
    def handle_operator_event(self, attempt: int, operator: str, event: Any) -> None:
        """An event from ``operator``'s coordinator: queued in the mailbox, in order."""
        subtask = self.subtask
        if subtask is not None and attempt == subtask.spec.attempt:
            subtask.post(OperatorEvent(operator, event))

    @ray.method(concurrency_group="control")
    def trigger_checkpoint(self, barrier: Barrier) -> None:
        subtask = self.subtask
        if subtask is not None and barrier.attempt == subtask.spec.attempt:
            subtask.post(TriggerReceived(barrier))

    @ray.method(concurrency_group="control")
    def receive_barrier(self, channel: ChannelId, barrier: Barrier, upto: int,
                        index: int) -> None:
        subtask = self.subtask
        if subtask is not None and subtask.accepts(channel, barrier.attempt):
            subtask.post(BarrierReceived(channel, barrier, upto, index))

    @ray.method(concurrency_group="control")
    def notify_checkpoint_complete(self, checkpoint_id: int, attempt: int) -> None:
        subtask = self.subtask
        if subtask is not None and attempt == subtask.spec.attempt:
            subtask.post(CheckpointCompleted(checkpoint_id))

    @ray.method(concurrency_group="control")
    def notify_checkpoint_aborted(self, checkpoint_id: int, attempt: int) -> None:
        subtask = self.subtask
        if subtask is not None and attempt == subtask.spec.attempt:
            subtask.post(CheckpointAborted(checkpoint_id))

    @ray.method(concurrency_group="control")
    def upstream_restarted(self, upstreams: dict, attempt: int, checkpoint_id: int,
                           timeout_s: float) -> bool:
        """A region failover restored this subtask's senders on ``upstreams`` alone
        (:meth:`Subtask.upstream_restarted`); False if it cannot go on with them."""
        subtask = self.subtask
        return subtask is not None and subtask.upstream_restarted(upstreams, attempt,
                                                                  checkpoint_id, timeout_s)

    @ray.method(concurrency_group="control")
    def drain(self) -> None:
        """A source ends its input at once (stop-with-savepoint with drain)."""
        self._hosted().post(Drain())

    @ray.method(concurrency_group="control")
    def stop(self) -> None:
        """End a finished subtask (after the final checkpoint)."""
        self._hosted().post(Stop())

    @ray.method(concurrency_group="control")
    def cancel(self) -> None:
        self._hosted().post(Cancel())

    @ray.method(concurrency_group="control")
    def running(self) -> bool:
        """Does this actor run a subtask now (not: idle, or its subtask has ended)?"""
        return self.subtask is not None and not self.subtask.done.is_set()

    @ray.method(concurrency_group="control")
    def metrics(self) -> dict[str, float]:
        return self._hosted().metrics()

    @ray.method(concurrency_group="control")
    def liveness(self) -> SubtaskLiveness:
        """What the hosted subtask still waits for before it can end."""
        return self._hosted().liveness()

    @ray.method(concurrency_group="control")
    def forget_job(self) -> None:
        """The job is over and this actor goes back to the driver's pool: drop the local
        copy of its subtask's state (checkpoint/local_recovery.py)."""
        local_recovery.PROCESS_COPY.clear()  # (through the module: Ray pickles this class)

    @ray.method(concurrency_group="control")
    def local_copy_bytes(self) -> int:
        """Bytes of checkpoint files this process keeps for local recovery."""
        return local_recovery.PROCESS_COPY.size

    @ray.method(concurrency_group="monitor")
    def await_termination(self) -> TerminationReport:
        subtask = self._hosted()  # the one hosted now, even if host() swaps it meanwhile
        subtask.done.wait()
        if subtask.report is None:
            raise RuntimeError(f"subtask {subtask.spec.actor_name} ended without a report")
        return subtask.report
