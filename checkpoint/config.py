"""How a job checkpoints and how it restarts after a failure.

    >>> import raystream as rs
    >>> config = rs.CheckpointConfig(interval_s=1.0, storage="/tmp/raystream-checkpoints")
    >>> config.max_concurrent, config.retained, str(config.alignment)
    (1, 3, 'aligned')
    >>> rs.CheckpointConfig(unaligned=True).alignment, rs.CheckpointConfig(mode="unaligned").unaligned
    (<AlignmentMode.UNALIGNED: 'unaligned'>, True)
    >>> print(rs.CheckpointConfig(aligned_timeout=0.2).alignment)
    aligned_timeout
    >>> rs.CheckpointConfig(state_backend="rocks")
    Traceback (most recent call last):
    ...
    ValueError: unknown state backend 'rocks': choose one of 'heap', 'disk'
    >>> rs.CheckpointConfig(state_backend="disk").state_backend
    <StateBackend.DISK: 'disk'>
    >>> rs.RestartStrategy.fixed_delay(attempts=3, delay_s=0.5).delay_before(2)
    0.5
    >>> rs.RestartStrategy.exponential_backoff(attempts=5, initial_s=0.1, max_s=1.0).delay_before(4)
    0.8
"""

from __future__ import annotations

import enum
import os
import tempfile
from dataclasses import dataclass, field

from raystream.checkpoint.disk_db import DiskStateOptions
from raystream.checkpoint.heap_changelog import HeapStateOptions
from raystream.checkpoint.state_backend import normalize_state_backend


def _default_storage() -> str:
    return os.path.join(tempfile.gettempdir(), "raystream-checkpoints")


class AlignmentMode(enum.StrEnum):
    """How a job's checkpoints align barriers (a StrEnum: it prints as plain text)."""

    ALIGNED = "aligned"  # a subtask waits for the barrier on every input
    UNALIGNED = "unaligned"  # barriers overtake data in flight, which is recorded (FLIP-76)
    ALIGNED_TIMEOUT = "aligned_timeout"  # aligned, unaligned after aligned_timeout


@dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpoints (Flink's ``CheckpointConfig``).

    Args:
        interval_s: time between checkpoint triggers.
        min_pause_s: least time between the end of one checkpoint and the
            start of the next (so slow checkpoints do not back up).
        timeout_s: a checkpoint not complete after this is aborted.
        max_concurrent: checkpoints in flight at once.
        retained: completed checkpoints kept in storage; older ones are deleted.
        storage: a local directory or any ``pyarrow.fs`` URI (``s3://...``).
        tolerable_failures: checkpoints that may fail in a row before the job
            fails over (declines, timeouts and unwritable storage count;
            savepoints do not, their failure goes to the caller). The default,
            3, rides out a passing hiccup but not storage that stays broken:
            a job that cannot checkpoint commits nothing, so it should fail
            (and restart, or stop with the cause) rather than run on silently.
        unaligned: unaligned checkpoints (Flink FLIP-76): barriers overtake
            the data in flight, which becomes part of the checkpoint (channel
            state), so a checkpoint does not wait for backpressured queues to
            drain. Runs with ``max_concurrent=1``; savepoints stay aligned. A
            job restores channel state at the same parallelism only.
        aligned_timeout: seconds; a checkpoint starts aligned and turns
            unaligned wherever it is still aligning this long after it was
            triggered (Flink's ``alignedCheckpointTimeout``). Implies
            unaligned checkpoints, ``max_concurrent=1``; 0 means unaligned
            at once.
        mode: ``"aligned"`` or ``"unaligned"``, another way to say ``unaligned``.
        state_backend: where keyed operators keep their state: ``"heap"`` (Python
            objects in the subtask's memory, the default) or ``"disk"`` (an
            embedded RocksDB per operator instance, for state larger than
            memory; keyed process functions and keyed reduce, not windows yet);
            ``DiskStateOptions(memory_mb=..., local_dir=...)`` selects the disk
            backend with its memory budget per subtask (default 64 MB).
            The heap backend's checkpoints are incremental (a full snapshot,
            then the entries changed since); ``HeapStateOptions(incremental=False)``
            makes every one full.
    """

    interval_s: float = 1.0
    min_pause_s: float = 0.0
    timeout_s: float = 60.0
    max_concurrent: int = 1
    retained: int = 3
    storage: str = field(default_factory=_default_storage)
    tolerable_failures: int = 3
    unaligned: bool = False
    aligned_timeout: float | None = None
    mode: str | None = None
    state_backend: str | DiskStateOptions | HeapStateOptions = "heap"

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        if self.max_concurrent < 1 or self.retained < 1:
            raise ValueError("max_concurrent and retained must be >= 1")
        if self.mode is not None:
            if self.mode not in ("aligned", "unaligned"):
                raise ValueError(f"mode must be 'aligned' or 'unaligned', got {self.mode!r}")
            if self.mode == "aligned" and self.unaligned:
                raise ValueError("mode='aligned' contradicts unaligned=True")
            object.__setattr__(self, "unaligned", self.mode == "unaligned")
        object.__setattr__(self, "state_backend", normalize_state_backend(self.state_backend))
        if self.aligned_timeout is not None and self.aligned_timeout < 0:
            raise ValueError(f"aligned_timeout must be >= 0 seconds, got {self.aligned_timeout}")
        if self.alignment is not AlignmentMode.ALIGNED and self.max_concurrent != 1:
            raise ValueError(f"unaligned checkpoints (and aligned_timeout) run one at a time: "
                             f"max_concurrent must be 1, got {self.max_concurrent}")

    @property
    def alignment(self) -> AlignmentMode:
        """How the job's checkpoints align their barriers."""
        if self.aligned_timeout is not None:
            return AlignmentMode.ALIGNED_TIMEOUT
        return AlignmentMode.UNALIGNED if self.unaligned else AlignmentMode.ALIGNED


@dataclass(frozen=True)
class RestartStrategy:
    """How often and after what delay a failed job restarts from its latest checkpoint."""

    attempts: int = 0
    initial_delay_s: float = 0.0
    backoff: float = 1.0
    max_delay_s: float = 0.0

    @classmethod
    def none(cls) -> "RestartStrategy":
        return cls(0)

    @classmethod
    def fixed_delay(cls, attempts: int, delay_s: float = 1.0) -> "RestartStrategy":
        return cls(attempts, delay_s, 1.0, delay_s)

    @classmethod
    def exponential_backoff(cls, attempts: int, initial_s: float = 0.1,
                            max_s: float = 10.0, multiplier: float = 2.0) -> "RestartStrategy":
        return cls(attempts, initial_s, multiplier, max_s)

    def delay_before(self, restart: int) -> float:
        """Delay before restart number ``restart`` (1-based)."""
        return min(self.initial_delay_s * self.backoff ** (restart - 1), self.max_delay_s)
