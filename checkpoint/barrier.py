"""The checkpoint barrier: what the coordinator triggers and subtasks pass on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier ``checkpoint_id``; travels on the control lane.

    It is announced to each downstream channel with ``upto``: the sequence
    number of the last in-band message logically before the barrier on that
    channel (-1 if none). An *aligned* barrier sits behind everything its
    sender had put on the channel, sent or still waiting for credit; the
    receiver treats it as arrived once it has consumed every message up to
    ``upto`` — exactly where an in-band barrier would have been — so aligned
    checkpoints keep Flink's semantics while the barrier itself never waits
    for credit. An *unaligned* barrier (``unaligned=True``, Flink FLIP-76)
    overtakes the data its sender had not yet transmitted: ``upto`` is then
    the last sequence number *sent*, and the untransmitted rest is the
    sender's output channel state.

    ``aligned_timeout_ms``: the checkpoint starts aligned and turns unaligned
    wherever it is still in progress ``aligned_timeout_ms`` after
    ``trigger_ts_ms``. Savepoints are always aligned (both fields unset).
    """

    checkpoint_id: int
    attempt: int
    trigger_ts_ms: int
    savepoint_target: str | None = None  # a savepoint's state goes here, not to checkpoint storage
    stop: bool = False  # stop-with-savepoint: sources emit nothing after this barrier
    unaligned: bool = False
    aligned_timeout_ms: int | None = None
    final: bool = False  # the final checkpoint, after every subtask's end of input (FLIP-147)

    @property
    def timeout_at_ms(self) -> int | None:
        """Wall-clock ms at which this aligned checkpoint turns unaligned, if ever."""
        if self.aligned_timeout_ms is None:
            return None
        return self.trigger_ts_ms + self.aligned_timeout_ms

    @property
    def is_savepoint(self) -> bool:
        return self.savepoint_target is not None
