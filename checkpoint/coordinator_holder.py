"""Runs the operator coordinators of a job inside its job master (Flink
``OperatorCoordinatorHolder``): their gateways, their part in checkpoints, failover.

The checkpoint coordinator calls, for checkpoint ``n``, in this order:

1. :meth:`OperatorCoordinators.checkpoint` -- mark every gateway for ``n``,
   snapshot every coordinator, close every gateway (later events are held);
2. :meth:`OperatorCoordinators.ready_to_trigger` until it is true -- every
   event sent before the snapshots is delivered, and so is every event an
   earlier checkpoint held (they are part of the snapshots too: a gateway that
   still holds them keeps ``n`` waiting); only then are the sources triggered;
3. :meth:`OperatorCoordinators.complete` or :meth:`OperatorCoordinators.abort`.

A subtask reopens its gateways with :meth:`OperatorCoordinators.acknowledge`
right after its synchronous snapshot of ``n``. On failover
:meth:`OperatorCoordinators.reset` drops held events and resets every
coordinator to the restored checkpoint; :meth:`OperatorCoordinators.bind`
then connects the gateways to the new attempt's subtasks and tells each
coordinator that they are ready. A region failover resets only the region's
subtasks (:meth:`OperatorCoordinators.subtask_reset`) and binds only them.

Everything runs on the job master's one event thread. A coordinator that
raises fails the job over (:class:`CoordinatorFailure`).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from raystream.checkpoint.operator_coordinator import OperatorCoordinator
from raystream.checkpoint.restore import RestoreSpec
from raystream.checkpoint.storage import CheckpointStorage
from raystream.checkpoint.subtask_gateway import Delivery, SubtaskGateway

# (operator name, subtask index) -> a function that transmits one event to that subtask
Transport = Callable[[str, int], Callable[[Any], Delivery]]
CoordinatorFactory = Callable[[Any], OperatorCoordinator]


class CoordinatorFailure(RuntimeError):
    """An operator coordinator raised, or asked to fail the job."""

    def __init__(self, operator: str, message: str) -> None:
        super().__init__(f"operator coordinator of '{operator}': {message}")
        self.operator = operator


@dataclass(frozen=True)
class CoordinatedOperator:
    """An operator of the plan that has a coordinator."""

    name: str
    parallelism: int
    create: CoordinatorFactory


class _Context:
    """The :class:`~raystream.checkpoint.operator_coordinator.OperatorCoordinatorContext`
    of one coordinator."""

    def __init__(self, holder: "_Holder") -> None:
        self._holder = holder
        self.operator_name = holder.name
        self.parallelism = holder.parallelism

    def send_event(self, subtask: int, event: Any) -> None:
        gateways = self._holder.gateways
        if not 0 <= subtask < len(gateways):
            raise IndexError(f"'{self.operator_name}' has subtasks 0..{self.parallelism - 1}, "
                             f"not {subtask}")
        gateways[subtask].send_event(event)

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        self._holder.owner._schedule(self._holder, delay_s, callback)

    def call_async(self, work: Callable[[], Any],
                   handler: Callable[[Any, BaseException | None], None]) -> None:
        self._holder.owner._submit(self._holder, work, handler)

    def fail_job(self, reason: str) -> None:
        raise CoordinatorFailure(self.operator_name, reason)


class _Holder:
    def __init__(self, owner: "OperatorCoordinators", operator: CoordinatedOperator) -> None:
        self.owner = owner
        self.name, self.parallelism = operator.name, operator.parallelism
        self.gateways: list[SubtaskGateway] = []
        self.context = _Context(self)
        try:
            self.coordinator = operator.create(self.context)
        except Exception as exc:
            raise CoordinatorFailure(self.name, f"could not be created: {type(exc).__name__}: "
                                                f"{exc}") from exc

    def call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.coordinator, method)(*args)
        except CoordinatorFailure:
            raise
        except Exception as exc:
            raise CoordinatorFailure(self.name, f"{method} raised {type(exc).__name__}: "
                                                f"{exc}") from exc


class _GatewayHandle:
    """What ``subtask_ready`` hands a coordinator: a send function bound to one subtask."""

    def __init__(self, gateway: SubtaskGateway) -> None:
        self._gateway = gateway

    def send_event(self, event: Any) -> None:
        self._gateway.send_event(event)


class OperatorCoordinators:
    """Every coordinator of one job, with their subtask gateways."""

    def __init__(self, operators: list[CoordinatedOperator]) -> None:
        self._holders = {op.name: _Holder(self, op) for op in operators}
        self._timers: list[tuple[float, int, int, _Holder, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._generation = 0  # timers and async results of an older attempt are dropped
        self._workers: ThreadPoolExecutor | None = None  # call_async's, made on first use
        self._finished: queue.SimpleQueue = queue.SimpleQueue()  # call_async work done

    def __bool__(self) -> bool:
        return bool(self._holders)

    def gateway(self, operator: str, subtask: int) -> SubtaskGateway:
        return self._holders[operator].gateways[subtask]

    def coordinator(self, operator: str) -> OperatorCoordinator:
        return self._holders[operator].coordinator

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for holder in self._holders.values():
            holder.call("start")

    def bind(self, transport: Transport, only: set[tuple[str, int]] | None = None) -> None:
        """The subtasks of a new attempt run (``only``: these (operator, index) alone, a
        region's): connect the gateways and call ``subtask_ready``."""
        for holder in self._holders.values():
            if not holder.gateways:
                holder.gateways = [SubtaskGateway(i, transport(holder.name, i), operator=holder.name)
                                   for i in range(holder.parallelism)]
            else:
                for i, gateway in enumerate(holder.gateways):
                    if only is None or (holder.name, i) in only:
                        gateway.reset(transport(holder.name, i))
        for holder in self._holders.values():
            for i, gateway in enumerate(holder.gateways):
                if only is None or (holder.name, i) in only:
                    holder.call("subtask_ready", i, _GatewayHandle(gateway))

    def support_subtask_reset(self) -> bool:
        """Can every coordinator restore one of its subtasks alone (a region failover)?"""
        return all(holder.call("supports_subtask_reset") for holder in self._holders.values())

    def subtask_reset(self, subtasks: set[tuple[str, int]], checkpoint_id: int | None) -> None:
        """Region failover: the (operator, index) ``subtasks`` alone restore
        ``checkpoint_id``. Their gateways drop what they held or had in flight (the
        subtasks' failed attempt is gone), and their coordinators are told; everything
        else goes on. :meth:`bind` connects them once their new attempt runs."""
        for holder in self._holders.values():
            for i, gateway in enumerate(holder.gateways):
                if (holder.name, i) in subtasks:
                    gateway.reset()
                    holder.call("subtask_reset", i, checkpoint_id)

    def reset_to(self, restore: RestoreSpec | None) -> None:
        """Global failover (or a start from a savepoint): every coordinator goes back to
        the state ``restore`` holds of it (read from its storage), or to its start without
        one."""
        if not self._holders:
            return
        states = {}
        if restore is not None:
            storage = CheckpointStorage(restore.storage_uri)
            states = {name: storage.read_state(handle)
                      for name, handle in restore.coordinators.items()}
        self.reset(restore.checkpoint_id if restore else None, states)

    def reset(self, checkpoint_id: int | None, states: dict[str, bytes]) -> None:
        """Global failover to ``checkpoint_id`` (None: the start): held and undelivered
        events are dropped and every coordinator goes back to the checkpoint's state."""
        self._generation += 1
        self._timers.clear()
        for holder in self._holders.values():
            for gateway in holder.gateways:
                gateway.reset()
            holder.call("reset_to_checkpoint", checkpoint_id, states.get(holder.name))

    def close(self) -> None:
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)
        for holder in self._holders.values():
            try:
                holder.coordinator.close()
            except Exception:  # the job is over either way
                pass

    # -- events -------------------------------------------------------------------------------
    def handle_event_from_subtask(self, operator: str, subtask: int, event: Any) -> None:
        holder = self._holders.get(operator)
        if holder is None:
            raise CoordinatorFailure(operator, "an operator event arrived for an operator that "
                                               "has no coordinator")
        holder.call("handle_event_from_subtask", subtask, event)

    def _schedule(self, holder: _Holder, delay_s: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + max(0.0, delay_s), next(self._sequence),
                                      self._generation, holder, callback))

    def next_due(self) -> float | None:
        """When (``time.monotonic()``) the next ``call_later`` callback is due, if any."""
        return self._timers[0][0] if self._timers else None

    def _submit(self, holder: _Holder, work: Callable[[], Any],
                handler: Callable[[Any, BaseException | None], None]) -> None:
        if self._workers is None:
            self._workers = ThreadPoolExecutor(max_workers=2,
                                               thread_name_prefix="coordinator-call-async")
        generation, finished = self._generation, self._finished
        self._workers.submit(work).add_done_callback(
            lambda future: finished.put((generation, holder, handler, future)))

    def run_due(self, now: float) -> None:
        """Run the ``call_later`` callbacks that are due and the handlers of finished
        ``call_async`` work."""
        while self._timers and self._timers[0][0] <= now:
            _, _, generation, holder, callback = heapq.heappop(self._timers)
            if generation == self._generation:
                _run_callback(holder, "a call_later callback", callback)
        while True:
            try:
                generation, holder, handler, future = self._finished.get_nowait()
            except queue.Empty:
                return
            if generation == self._generation and not future.cancelled():
                error = future.exception()
                result = None if error is not None else future.result()
                _run_callback(holder, "a call_async handler", lambda: handler(result, error))

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint(self, checkpoint_id: int) -> dict[str, bytes]:
        """Snapshot every coordinator for ``checkpoint_id``; events sent afterwards are
        held until each subtask acknowledges its own snapshot of it."""
        states = {}
        for holder in self._holders.values():
            for gateway in holder.gateways:
                gateway.mark_for_checkpoint(checkpoint_id)
            state = holder.call("checkpoint_coordinator", checkpoint_id)
            if not isinstance(state, (bytes, bytearray, memoryview)):
                raise CoordinatorFailure(holder.name, f"checkpoint_coordinator returned "
                                                      f"{type(state).__name__}, not bytes")
            states[holder.name] = bytes(state)
            for gateway in holder.gateways:
                gateway.close_for_checkpoint(checkpoint_id)
        return states

    def ready_to_trigger(self, checkpoint_id: int) -> bool:
        """True once the sources may get barrier ``checkpoint_id``: every event sent before
        the coordinators' snapshots is delivered and no gateway holds events of an
        earlier checkpoint. Raises :class:`EventDeliveryError` for a failed delivery."""
        # Until the subtask's snapshot of checkpoint_id its own held events stay held, so
        # whatever has been transmitted must arrive first: sent before the snapshots, or
        # released since by an earlier checkpoint (those are "sent" in its state too).
        for holder in self._holders.values():
            for gateway in holder.gateways:
                if gateway.holds_before(checkpoint_id) or not gateway.all_delivered():
                    return False
        return True

    def acknowledge(self, operators: list[str], subtask: int, checkpoint_id: int) -> None:
        """The subtask took its synchronous snapshot of ``checkpoint_id``."""
        for name in operators:
            holder = self._holders.get(name)
            if holder is not None and subtask < len(holder.gateways):
                holder.gateways[subtask].acknowledge_checkpoint(checkpoint_id)

    def complete(self, checkpoint_id: int) -> None:
        for holder in self._holders.values():
            holder.call("notify_checkpoint_complete", checkpoint_id)

    def abort(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: what its gateways held goes out."""
        for holder in self._holders.values():
            for gateway in holder.gateways:
                gateway.release(checkpoint_id)
            holder.call("notify_checkpoint_aborted", checkpoint_id)


def _run_callback(holder: _Holder, what: str, callback: Callable[[], None]) -> None:
    try:
        callback()
    except CoordinatorFailure:
        raise
    except Exception as exc:
        raise CoordinatorFailure(holder.name, f"{what} raised {type(exc).__name__}: "
                                              f"{exc}") from exc
