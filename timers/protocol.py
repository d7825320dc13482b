"""What a keyed operator asks of its timer service, on either state backend.

Two services implement it: :class:`~raystream.timers.service.TimerService` (timer heaps
on the heap, snapshotted as sections of their own) and
:class:`~raystream.timers.disk_service.DiskTimerService` (timers in the disk backend's
RocksDB, snapshotted with its entries). An operator holds a :class:`Timers` and reaches
the disk service's extras (emptying its key table, key codes) only through
``_KeyedOperator.disk_timers``.

A timer is (timestamp, key id, namespace), unique on all three; the namespace is an
int64 chosen by the caller (0 = none; window operators use the window start). A pop
(:meth:`Timers.advance_watermark`, :meth:`Timers.fire_processing_time`) deletes and
returns the due timers in (timestamp, key id, namespace) order as three aligned arrays;
the disk service returns at most its firing limit at a time, so callers pop until
nothing comes.

    >>> import numpy as np
    >>> from raystream.timers.service import TimerService
    >>> timers: Timers = TimerService(max_parallelism=8, key_groups=range(8))
    >>> kid = timers.key_id("a", 3)
    >>> timers.register_event_time_timers(np.array([kid]), np.array([0]), np.array([10]))
    >>> [a.tolist() for a in timers.advance_watermark(10)]
    [[10], [0], [0]]
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Iterable, Mapping, Protocol

import numpy as np

Popped = tuple[np.ndarray, np.ndarray, np.ndarray]  # timestamps, key ids, namespaces


class TimeDomain(Enum):
    """The clock a timer follows: the watermark (event time) or the wall clock."""

    EVENT_TIME = "event time"
    PROCESSING_TIME = "processing time"


class Timers(Protocol):
    """A keyed operator subtask's timers and the key table their key ids index."""

    # -- the key table --------------------------------------------------------------
    def key_id(self, key: Any, key_group: int) -> int: ...

    def key_ids(self, keys: list, key_groups: np.ndarray) -> np.ndarray: ...

    def key(self, key_id: int) -> Any: ...

    def keys(self, key_ids: np.ndarray) -> list: ...

    def key_group(self, key_id: int) -> int: ...

    def key_groups_of(self, key_ids: np.ndarray) -> np.ndarray: ...

    @property
    def num_keys(self) -> int: ...

    # -- event time -------------------------------------------------------------------
    def register_event_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        ...

    def register_event_time_timers(self, key_ids: np.ndarray, namespaces: np.ndarray,
                                   timestamps: np.ndarray) -> None: ...

    def delete_event_time_timer(self, key_id: int, namespace: int, timestamp: int) -> None:
        ...

    def advance_watermark(self, watermark: int) -> Popped: ...

    def next_event_time(self) -> int | None: ...

    @property
    def num_event_time_timers(self) -> int: ...

    # -- processing time --------------------------------------------------------------
    def register_processing_time_timer(self, key_id: int, namespace: int,
                                       timestamp: int) -> None: ...

    def register_processing_time_timers(self, key_ids: np.ndarray, namespaces: np.ndarray,
                                        timestamps: np.ndarray) -> None: ...

    def delete_processing_time_timer(self, key_id: int, namespace: int,
                                     timestamp: int) -> None: ...

    def next_processing_time(self) -> int | None: ...

    def fire_processing_time(self, now_ms: int) -> Popped: ...

    @property
    def num_processing_time_timers(self) -> int: ...

    # -- checkpoints ------------------------------------------------------------------
    def snapshot(self) -> Callable[[], dict[int, bytes]]:
        """The synchronous part: call the result (on any thread) for the timer sections
        by key group (none on the disk backend: its timers are in the state's)."""
        ...

    def restore(self, sections: Iterable[tuple[int, bytes]] | Mapping[int, bytes]) -> None:
        """Restore a heap job's timer sections (on the disk backend: into RocksDB)."""
        ...
