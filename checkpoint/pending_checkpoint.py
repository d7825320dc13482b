"""A checkpoint triggered and not yet complete (Flink's ``PendingCheckpoint``): the
subtasks it waits for, what the others wrote, and its figures so far; and what an
acknowledgement did (Flink's ``TaskAcknowledgeResult``). The checkpoint coordinator
(:mod:`raystream.checkpoint.coordinator`) keeps one per checkpoint in flight."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from raystream.checkpoint.barrier import Barrier, SnapshotKind
from raystream.checkpoint.handles import OperatorSubtaskState
from raystream.checkpoint.metadata import RowCounts
from raystream.checkpoint.snapshot_stats import SnapshotStats
from raystream.checkpoint.storage import StateHandle

SubtaskKey = tuple[int, int]  # (vertex id, subtask index)


class AcknowledgeResult(enum.Enum):
    """What an acknowledgement did (Flink's ``TaskAcknowledgeResult``): counted by the
    coordinator, and logged when it shows a protocol error (a duplicate, or a subtask
    the checkpoint does not wait for)."""

    SUCCESS = "success"  # the subtask's state is part of the checkpoint now
    DUPLICATE = "duplicate"  # the subtask had acknowledged it already
    UNKNOWN = "unknown"  # no such checkpoint, or not a subtask it waits for
    DISCARDED = "discarded"  # the checkpoint was aborted, subsumed or completed, or of an
    # older attempt


@dataclass
class PendingCheckpoint:
    """A checkpoint triggered and not yet complete: the subtasks it waits for, what the
    others wrote, and its figures so far."""

    checkpoint_id: int
    trigger_ts_ms: int
    started: float
    waiting: set[SubtaskKey]
    written: dict[SubtaskKey, dict[str, OperatorSubtaskState]] = field(default_factory=dict)
    watermarks: dict[SubtaskKey, list[list[int]]] = field(default_factory=dict)  # runs per subtask
    size: int = 0
    alignment_s: float = 0.0  # the longest any subtask waited for the barrier on all inputs
    start_delay_s: float = 0.0  # the longest from the trigger to a subtask's first barrier
    sync_s: float = 0.0  # the longest synchronous snapshot of a subtask
    async_s: float = 0.0  # the longest asynchronous write of a subtask
    kind: SnapshotKind = SnapshotKind.CHECKPOINT
    savepoint_target: str | None = None  # a savepoint kind's directory
    channel_state: dict[str, StateHandle] = field(default_factory=dict)  # subtask key -> handle
    channel_state_bytes: int = 0
    unaligned: bool = False
    rows: RowCounts = RowCounts()  # the attempt's sources' and sinks' at their barriers
    rows_of: dict[SubtaskKey, RowCounts] = field(default_factory=dict)  # ... by subtask
    coordinators: dict[str, StateHandle] = field(default_factory=dict)  # operator -> its state
    barrier: Barrier | None = None  # not sent yet: waiting for operator events' delivery

    @property
    def fully_acknowledged(self) -> bool:
        return not self.waiting

    def acknowledge(self, subtask: SubtaskKey, written: dict[str, OperatorSubtaskState],
                    stats: SnapshotStats) -> AcknowledgeResult:
        """Take ``subtask``'s state and figures (Flink's ``acknowledgeTask``): the
        checkpoint's phases are its slowest subtask's, its sizes the sum."""
        if subtask in self.written:
            return AcknowledgeResult.DUPLICATE
        if subtask not in self.waiting:
            return AcknowledgeResult.UNKNOWN
        self.waiting.discard(subtask)
        self.written[subtask] = written
        if stats.watermarks is not None:
            self.watermarks[subtask] = stats.watermarks
        self.size += stats.size
        self.alignment_s = max(self.alignment_s, stats.alignment_s)
        self.start_delay_s = max(self.start_delay_s, stats.start_delay_s)
        self.sync_s = max(self.sync_s, stats.sync_s)
        self.async_s = max(self.async_s, stats.async_s)
        self.channel_state_bytes += stats.channel_state_bytes
        self.rows += stats.rows
        self.rows_of[subtask] = stats.rows
        self.unaligned = self.unaligned or stats.unaligned
        if stats.channel_state is not None and stats.channel_state_key is not None:
            self.channel_state[stats.channel_state_key] = stats.channel_state
        return AcknowledgeResult.SUCCESS
