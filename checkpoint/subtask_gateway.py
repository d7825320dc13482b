"""The gateway from an operator coordinator to one subtask (Flink ``SubtaskGatewayImpl``,
FLINK-26029 / FLINK-28606).

Events from a coordinator to a subtask must be consistent with checkpoints:
an event is either part of the coordinator's checkpoint ``n`` *and* delivered
before the subtask's snapshot of ``n``, or neither. The gateway enforces it
with one state machine per subtask, driven from the job master's event thread:

* :meth:`SubtaskGateway.mark_for_checkpoint` -- the coordinator is about to
  snapshot itself for checkpoint ``n``; events still pass.
* :meth:`SubtaskGateway.close_for_checkpoint` -- the coordinator's snapshot of
  ``n`` is taken: from now on events are *held*, in order (they belong after
  ``n``, and the subtask has not snapshotted ``n`` yet).
* :meth:`SubtaskGateway.acknowledge_checkpoint` -- the subtask took the
  synchronous snapshot of ``n``: the events held for ``n`` are released in
  order, unless an earlier marked checkpoint still holds the gateway (then
  they join that checkpoint's held events).
* :meth:`SubtaskGateway.release` -- checkpoint ``n`` was aborted: what it
  held is released as on an acknowledgement.

Acknowledgements of checkpoints that are not marked any more (aborted,
subsumed, of an older attempt) are ignored; one above the highest marked
checkpoint is a protocol error.

Delivery: a send returns a :class:`Delivery`; a checkpoint's barriers go
out only once every event sent before its coordinator snapshot is delivered
(:meth:`SubtaskGateway.all_delivered`), and a failed delivery fails the
checkpoint and the subtask.

    >>> sent = []
    >>> class Done:
    ...     def done(self): return True
    ...     def error(self): return None
    >>> gateway = SubtaskGateway(0, lambda event: sent.append(event) or Done())
    >>> gateway.send_event("a")
    >>> gateway.mark_for_checkpoint(1); gateway.close_for_checkpoint(1)
    True
    >>> gateway.send_event("b"); sent
    ['a']
    >>> gateway.acknowledge_checkpoint(1); sent
    ['a', 'b']
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Protocol


class Delivery(Protocol):
    """The delivery of one event to a subtask (e.g. a Ray call on its control lane)."""

    def done(self) -> bool:
        """True once the subtask accepted the event or the delivery failed."""
        ...

    def error(self) -> BaseException | None:
        """Why the delivery failed; None if it succeeded (ask only once done)."""


class EventDeliveryError(RuntimeError):
    """An operator event could not be delivered to its subtask."""

    def __init__(self, operator: str, subtask: int, cause: BaseException) -> None:
        super().__init__(f"operator event of '{operator}' could not be delivered to subtask "
                         f"{subtask + 1}: {type(cause).__name__}: {cause}")
        self.operator, self.subtask, self.cause = operator, subtask, cause


class GatewayProtocolError(RuntimeError):
    """A subtask acknowledged a checkpoint its gateway was never marked for."""


class SubtaskGateway:
    """Events from one coordinator to one subtask, held while a checkpoint needs it.

    ``send`` transmits one event and returns its :class:`Delivery`. Not
    thread-safe: the job master's event thread drives every gateway.
    """

    def __init__(self, subtask: int, send: Callable[[Any], Delivery], *,
                 operator: str = "operator") -> None:
        self.subtask = subtask
        self.operator = operator
        self._send = send
        self._marked: set[int] = set()  # checkpoints the coordinator snapshotted or is snapshotting
        self._latest_marked = 0
        # checkpoint id -> events held since the gateway closed for it, in order
        self._held: dict[int, list[Any]] = {}
        self._in_flight: collections.deque[Delivery] = collections.deque()  # not known done

    # -- sending ----------------------------------------------------------------------------
    def send_event(self, event: Any) -> None:
        """Send ``event`` now, or hold it behind the newest closed checkpoint."""
        if self._held:
            self._held[max(self._held)].append(event)
        else:
            self._transmit(event)

    def _transmit(self, event: Any) -> None:
        self._in_flight.append(self._send(event))
        # Forget deliveries done (in order) so that a job without checkpoints, whose
        # gateways are never asked about deliveries, does not keep every one of them.
        # A failed one stays, for all_delivered to report.
        while self._in_flight and self._in_flight[0].done() and self._in_flight[0].error() is None:
            self._in_flight.popleft()

    @property
    def undelivered(self) -> int:
        """How many transmitted events are not known to be delivered."""
        return len(self._in_flight)

    @property
    def held(self) -> int:
        """How many events wait for a checkpoint acknowledgement."""
        return sum(len(events) for events in self._held.values())

    def holds_before(self, checkpoint_id: int) -> bool:
        """Events are held for a checkpoint older than ``checkpoint_id``."""
        return any(n < checkpoint_id and events for n, events in self._held.items())

    # -- checkpoint transitions ---------------------------------------------------------------
    def mark_for_checkpoint(self, checkpoint_id: int) -> None:
        """The coordinator snapshots itself for ``checkpoint_id`` now."""
        if checkpoint_id in self._marked:
            return
        if checkpoint_id <= self._latest_marked:
            raise GatewayProtocolError(
                f"gateway of '{self.operator}' to subtask {self.subtask + 1}: checkpoint "
                f"{checkpoint_id} marked after {self._latest_marked} (ids must increase)")
        self._marked.add(checkpoint_id)
        self._latest_marked = checkpoint_id

    def close_for_checkpoint(self, checkpoint_id: int) -> bool:
        """The coordinator's snapshot of ``checkpoint_id`` is taken: hold later events.
        False if the checkpoint is no longer marked (aborted meanwhile)."""
        if checkpoint_id not in self._marked:
            return False
        self._held.setdefault(checkpoint_id, [])
        return True

    def acknowledge_checkpoint(self, checkpoint_id: int) -> None:
        """The subtask took its synchronous snapshot of ``checkpoint_id``: reopen."""
        if checkpoint_id > self._latest_marked:
            raise GatewayProtocolError(
                f"subtask {self.subtask + 1} of '{self.operator}' acknowledged checkpoint "
                f"{checkpoint_id}, above the highest its gateway was marked for "
                f"({self._latest_marked})")
        self.release(checkpoint_id)

    def release(self, checkpoint_id: int) -> None:
        """Unmark ``checkpoint_id`` (acknowledged or aborted) and send what it held, unless
        an earlier checkpoint still holds the gateway."""
        if checkpoint_id not in self._marked:
            return  # aborted, subsumed or of an older attempt: nothing to release
        self._marked.discard(checkpoint_id)
        events = self._held.pop(checkpoint_id, None)
        if events is None:
            return
        earlier = [n for n in self._held if n < checkpoint_id]
        if earlier:  # an earlier checkpoint still holds the gateway: they wait with its events
            self._held[max(earlier)].extend(events)
            return
        # Events held for a later checkpoint stay held: they were sent after its
        # coordinator snapshot. These were sent before it, so they go out now, ahead.
        for event in events:
            self._transmit(event)

    def reset(self, send: Callable[[Any], Delivery] | None = None) -> None:
        """Failover: drop held and undelivered events (the coordinator is reset to a
        checkpoint that did not send them) and bind to the new subtask."""
        self._held.clear()
        self._marked.clear()
        self._in_flight.clear()
        if send is not None:
            self._send = send

    # -- deliveries -----------------------------------------------------------------------------
    def all_delivered(self) -> bool:
        """True once every transmitted event is delivered; raises
        :class:`EventDeliveryError` if one failed."""
        still = []
        for delivery in self._in_flight:
            if delivery.done():
                error = delivery.error()
                if error is not None:
                    raise EventDeliveryError(self.operator, self.subtask, error)
            else:
                still.append(delivery)
        self._in_flight = collections.deque(still)
        return not still
