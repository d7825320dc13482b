"""A disk job's savepoint restored into a heap job: the operator's own disk layouts, read
back through a scratch database.

The disk backend's sections of a window, count window or join hold the operator's own
layouts (panes, sessions, entries, join buckets: :mod:`raystream.checkpoint.disk_layout`),
which only that layout's disk store decodes. So a heap subtask restoring them loads its
key groups' sections into a scratch RocksDB in the temp directory, opens the disk store
of the operator's layout over it, and asks it for the heap store's sections
(``WindowSection`` and the like), which the heap store restores as it restores a heap
savepoint. The scratch database is removed once the operator is restored. It holds one
subtask's share of the state once, as the disk job did; the heap job then holds it in
memory, as it would have from a heap savepoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.timers.disk_service import DiskTimerService


@dataclass(frozen=True)
class MovedDiskState:
    """A scratch disk backend holding restored sections, with its timer service (whose key
    table names the keys the disk stores read back)."""

    backend: DiskKeyedStateBackend
    timers: DiskTimerService

    @classmethod
    def load(cls, sections: Iterable[tuple[int, bytes]], *, max_parallelism: int,
             key_groups: range) -> MovedDiskState:
        backend = DiskKeyedStateBackend(max_parallelism=max_parallelism, key_groups=key_groups)
        try:
            backend.restore(sections)
            return cls(backend, DiskTimerService(backend))
        except BaseException:
            backend.close()
            raise

    def close(self) -> None:
        self.backend.close()  # (removes its directory)
