"""How a job checkpoints and how it restarts after a failure.

    >>> import raystream as rs
    >>> config = rs.CheckpointConfig(interval_s=1.0, storage="/tmp/raystream-checkpoints")
    >>> config.max_concurrent, config.retained
    (1, 3)
    >>> rs.RestartStrategy.fixed_delay(attempts=3, delay_s=0.5).delay_before(2)
    0.5
    >>> rs.RestartStrategy.exponential_backoff(attempts=5, initial_s=0.1, max_s=1.0).delay_before(4)
    0.8
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field


def _default_storage() -> str:
    return os.path.join(tempfile.gettempdir(), "raystream-checkpoints")


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
            fails over (declines and timeouts count; the job keeps running
            while below this number).
    """

    interval_s: float = 1.0
    min_pause_s: float = 0.0
    timeout_s: float = 60.0
    max_concurrent: int = 1
    retained: int = 3
    storage: str = field(default_factory=_default_storage)
    tolerable_failures: int = 1_000_000

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        if self.max_concurrent < 1 or self.retained < 1:
            raise ValueError("max_concurrent and retained must be >= 1")


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
