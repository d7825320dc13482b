"""The control messages a subtask's mailbox holds (Flink: the mailbox's mails).

The actor's control lane only posts one of these and returns; the mailbox
loop takes them in order, ahead of any input. Checkpoint triggers and aborts
are posted as the barrier handler's own events
(:class:`~raystream.actors.barrier_handler.TriggerReceived`,
:class:`~raystream.actors.barrier_handler.CheckpointAborted`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Union

from raystream.actors.barrier_handler import CheckpointAborted, TriggerReceived
from raystream.actors.messages import ChannelId
from raystream.checkpoint.barrier import Barrier


@dataclass(frozen=True, slots=True)
class Credit:
    """The receiver of ``channel`` processed ``n`` more of its batches."""

    channel: ChannelId
    n: int


@dataclass(frozen=True, slots=True)
class OperatorEvent:
    """An event from ``operator``'s coordinator, handled before any later barrier."""

    operator: str
    event: Any


@dataclass(frozen=True, slots=True)
class BarrierReceived:
    """Announcement number ``index`` of ``channel``'s sender: ``barrier`` sits after
    message ``upto``."""

    channel: ChannelId
    barrier: Barrier
    upto: int
    index: int


@dataclass(frozen=True, slots=True)
class CheckpointCompleted:
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class UpstreamRestarted:
    """A region failover restored the senders of ``upstreams`` (channel -> the actor of
    its new sender) to ``checkpoint_id`` as ``attempt``; ``reply`` is set once the
    channels are open to it (True), or refused (False: the input had ended)."""

    upstreams: dict[ChannelId, Any]
    attempt: int
    checkpoint_id: int
    reply: UpstreamReply


class UpstreamReply:
    """The answer to :class:`UpstreamRestarted`, for the control lane that waits for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.accepted = False

    def answer(self, accepted: bool) -> None:
        self.accepted = accepted
        self.done.set()


@dataclass(frozen=True, slots=True)
class Drain:
    """Stop-with-savepoint, draining: a source ends its input now."""


@dataclass(frozen=True, slots=True)
class Stop:
    """End a finished subtask (after the final checkpoint)."""


@dataclass(frozen=True, slots=True)
class Cancel:
    pass


Mail = Union[Credit, OperatorEvent, TriggerReceived, BarrierReceived, CheckpointCompleted,
             CheckpointAborted, UpstreamRestarted, Drain, Stop, Cancel]
