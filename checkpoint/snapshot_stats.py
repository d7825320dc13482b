"""What a subtask reports with its acknowledgement of a checkpoint.

    >>> from raystream.checkpoint.storage import StateHandle
    >>> stats = SnapshotStats(size=1200, duration_s=0.05,
    ...                       channel_state=StateHandle("c", 200, "0" * 64))
    >>> stats.channel_state_bytes
    200
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raystream.checkpoint.metadata import RowCounts
from raystream.checkpoint.storage import StateHandle
from raystream.checkpoint.watermark_floors import Runs


# where a checkpoint's time goes, in order (SnapshotStats' and CheckpointStats' fields)
PHASES = ("start_delay_s", "alignment_s", "sync_s", "async_s")


@dataclass(frozen=True)
class SnapshotStats:
    """One subtask's figures for one checkpoint (the coordinator sums and keeps them).

    ``size``: bytes it wrote, its channel state included; ``duration_s``: from the
    barrier to the acknowledgement; ``alignment_s``: how long it waited for
    barriers; ``start_delay_s``: from the trigger until the checkpoint's first
    barrier reached it (a source: until it took the trigger), Flink's "start
    delay"; ``sync_s`` and ``async_s``: its synchronous snapshot (the mailbox
    paused) and the asynchronous write (until the acknowledgement) — the fields
    of :data:`PHASES`; ``unaligned``: its snapshot recorded data in flight;
    ``channel_state``: the handle of that recording, if it wrote one, under
    ``channel_state_key``; ``watermarks``: its event time per key-group run, so a
    restore never goes back in event time.
    """

    size: int = 0
    duration_s: float = 0.0
    alignment_s: float = 0.0
    start_delay_s: float = 0.0
    sync_s: float = 0.0
    async_s: float = 0.0
    unaligned: bool = False
    channel_state: StateHandle | None = None
    channel_state_key: str | None = None
    watermarks: Runs | None = field(default=None)
    rows: RowCounts = RowCounts()  # its sources' and sinks' in this attempt, at the barrier

    @property
    def channel_state_bytes(self) -> int:
        return self.channel_state.size if self.channel_state is not None else 0
