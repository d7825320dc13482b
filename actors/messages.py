"""What travels between subtasks.

Every in-band message on a channel (a data batch, a watermark, end of input)
takes the next number of that channel's sequence space, so the receiver can
put them back in order whatever order Ray delivers the calls in. Every
message carries the job attempt that sent it; a receiver drops messages of
another attempt (left over from before a failover).

Data batches are ``ray.put`` once by the sender; the message carries the
object ref inside a list so that Ray hands the ref to the receiver's data
lane without fetching the object first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Watermark meaning "no more data will ever come" (Flink: Watermark.MAX_WATERMARK).
MAX_WATERMARK = (1 << 63) - 1
# Watermark before any was seen.
MIN_WATERMARK = -(1 << 63)


class Kind(enum.IntEnum):
    DATA = 0
    WATERMARK = 1
    END_OF_INPUT = 2


@dataclass(frozen=True, slots=True)
class ChannelId:
    """A logical channel: one edge between an upstream and a downstream subtask.

    ``edge`` numbers the job edge (one per connection between two chained
    vertices), ``upstream`` is the sending subtask's index, ``downstream`` the
    receiving one's.
    """

    edge: int
    upstream: int
    downstream: int

    def __str__(self) -> str:
        return f"edge {self.edge} [{self.upstream}->{self.downstream}]"


@dataclass(slots=True)
class Envelope:
    """One in-band message of a channel.

    ``payload`` is ``[ObjectRef]`` for DATA (the list keeps Ray from resolving
    the ref before the call), the watermark timestamp for WATERMARK, and
    ``None`` for END_OF_INPUT. ``rows`` and ``nbytes`` are the batch's row
    count and size (for the sender's metrics, without fetching the batch).

    ``epoch`` is the id of the last barrier the sender forwarded on this
    channel before this message. Barriers travel on the control lane, so a
    message can overtake its barrier; a receiver that has not seen barrier
    ``epoch`` yet must wait for it before consuming the message, or the
    message's effect would land in the checkpoint before it.
    """

    channel: ChannelId
    seq: int
    attempt: int
    kind: Kind
    payload: object = None
    rows: int = 0
    epoch: int = 0
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier ``checkpoint_id``; travels on the control lane.

    It is sent to each downstream channel with ``upto``: the sequence number of
    the last in-band message its sender put on that channel before the barrier
    (-1 if none). The receiver treats the barrier as *arrived* on the channel
    once it has consumed every message up to ``upto`` — exactly where an
    in-band barrier would have been — so aligned checkpoints keep Flink's
    semantics while the barrier itself never waits for credit.
    """

    checkpoint_id: int
    attempt: int
    trigger_ts_ms: int
    savepoint_target: str | None = None  # a savepoint's state goes here, not to checkpoint storage
    stop: bool = False  # stop-with-savepoint: sources emit nothing after this barrier

    @property
    def is_savepoint(self) -> bool:
        return self.savepoint_target is not None
