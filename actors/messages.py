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
from typing import Any

# Watermark before any was seen (kept with the watermark floors, the lowest layer using it).
from raystream.checkpoint.watermark_floors import MIN_WATERMARK as MIN_WATERMARK

# Watermark meaning "no more data will ever come" (Flink: Watermark.MAX_WATERMARK).
MAX_WATERMARK = (1 << 63) - 1
# Sequence number of a message replayed from restored channel state: it belongs
# to no sequence of this attempt and cost its sender no credit.
REPLAYED_SEQ = -1


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

    ``announced`` is how many barrier announcements the sender had made on
    this channel when it *transmitted* the message (stamped at transmission,
    not when the message was queued for credit). Barriers travel on the
    control lane, so a message can overtake an announcement made before it;
    a receiver that has not seen that many announcements must wait for them
    before consuming the message, or the message's effect could land in a
    checkpoint before its barrier. An unaligned barrier overtakes the data
    still queued at its sender, so that data is transmitted after the
    announcement and carries it.

    ``seq`` is ``REPLAYED_SEQ`` for a message replayed from a restored
    checkpoint's channel state (it costs no credit).
    """

    channel: ChannelId
    seq: int
    attempt: int
    kind: Kind
    payload: Any = None  # its type depends on kind (see above)
    rows: int = 0
    announced: int = 0
    nbytes: int = 0
