"""Local recovery: a subtask's own checkpoint files kept in its process's memory, so a
restore on the same actor reads them from there instead of from checkpoint storage.

Flink's ``state.backend.local-recovery`` keeps a secondary copy of each snapshot where
the task runs. Here a failover hosts the next attempt of a subtask on the same actor
where it is still alive (engine/deployment.py), so the copy lives in the actor's
process, beside the subtask, in one :class:`LocalStateCopy` per process:

* every file a subtask writes into its job's checkpoint storage (operator state, keyed
  state, the heap backend's chain files, channel state) is kept with its handle
  (:meth:`LocalStateCopy.record`); a savepoint's files and the disk backend's RocksDB
  files are not (a savepoint never serves failover, and RocksDB restores from its
  files);
* the subtask's acknowledgement of checkpoint ``n`` names the files its state needs
  (:meth:`~LocalStateCopy.acknowledged`, the files of earlier checkpoints a chain
  still references included); once ``n`` completes only those and the files of
  checkpoints after ``n`` stay (:meth:`~LocalStateCopy.completed`): the copy is *as of
  the newest completed checkpoint*, at most one of them;
* a restore reads a handle from the copy when the handle's path, size and SHA-256 are
  the copy's (:meth:`~LocalStateCopy.lookup`): the bytes are then those the checkpoint
  holds, whichever attempt wrote them. It uses the copy only where the subtask is the
  same one (job, chain, index, storage) with the same key groups; a rescaled restore
  or another job's reads storage, and the copy is dropped. So is the copy of a job
  that ended, when its actors go back to the driver's pool (:meth:`~LocalStateCopy.clear`).

What a survivor processed after the checkpoint is never restored: the next attempt's
operators are new, and the copy holds files, as of a checkpoint. Files of a
checkpoint that did not complete (the survivor was ahead of it) are dropped at the
restore (:meth:`~LocalStateCopy.restored`).

    >>> import hashlib
    >>> copy = LocalStateCopy()
    >>> key = SubtaskIdentity("file:///c", "job", "sum", 0, range(0, 64))
    >>> copy.bind(key)
    >>> h = StateHandle("/c/job/chk-1/sum-0.op", 2, hashlib.sha256(b"ab").hexdigest())
    >>> copy.record(1, h, b"ab")
    >>> copy.acknowledged(1, [h])
    >>> copy.completed(1)
    >>> copy.lookup(h), copy.lookup(StateHandle(h.path, 2, "0" * 64))
    (b'ab', None)
    >>> copy.own_files(1) == frozenset([h.path])
    True
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from raystream.checkpoint.storage import CheckpointStorage, StateHandle


class StateOrigin(enum.Enum):
    """Where a subtask's restored state came from."""

    NONE = "none"  # nothing to restore: a fresh start
    STORAGE = "storage"  # read from checkpoint storage
    LOCAL = "local"  # its own files from the copy in its process (others' from storage)


@dataclass(frozen=True)
class SubtaskIdentity:
    """Which subtask a local copy belongs to; a copy serves only the same one."""

    storage_uri: str
    job_key: str
    chain: str
    index: int
    key_groups: range


class LocalStateCopy:
    """The checkpoint files of one subtask, in memory (see the module docstring).

    Thread-safe: the snapshot thread records, the mailbox thread completes and restores,
    and an ended attempt's snapshot thread may still record while the next one restores.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._identity: SubtaskIdentity | None = None
        self._files: dict[str, tuple[StateHandle, bytes]] = {}  # path -> (handle, bytes)
        self._written: dict[int, set[str]] = {}  # checkpoint id -> paths it wrote
        self._own: dict[int, frozenset[str]] = {}  # checkpoint id -> the files its state needs
        self._completed: int | None = None  # the newest completed checkpoint known here

    def bind(self, identity: SubtaskIdentity) -> None:
        """A subtask of ``identity`` runs in this process now: a copy of another one's
        state (the actor hosted another subtask, job or key groups) is dropped."""
        with self._lock:
            if identity != self._identity:
                self._clear()
                self._identity = identity

    def _clear(self) -> None:
        self._files, self._written, self._own, self._completed = {}, {}, {}, None

    def clear(self) -> None:
        """The job is over: hold nothing (an idle actor of the driver's pool keeps no
        state of a job that ended)."""
        with self._lock:
            self._clear()
            self._identity = None

    def record(self, checkpoint_id: int, handle: StateHandle,
               data: bytes | bytearray | memoryview) -> None:
        """The subtask wrote ``data`` as ``handle`` for checkpoint ``checkpoint_id``."""
        with self._lock:
            if self._completed is not None and checkpoint_id <= self._completed:
                return  # of a checkpoint subsumed already (a late write of an old attempt)
            # (bytes as written: a bytearray or a view of one could change later)
            self._files[handle.path] = (handle, data if isinstance(data, bytes) else bytes(data))
            self._written.setdefault(checkpoint_id, set()).add(handle.path)

    def acknowledged(self, checkpoint_id: int, handles: Iterable[StateHandle]) -> None:
        """Checkpoint ``checkpoint_id``'s state of the subtask needs exactly ``handles``."""
        with self._lock:
            if self._completed is None or checkpoint_id > self._completed:
                self._own[checkpoint_id] = frozenset(h.path for h in handles)

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: keep its files and those of later ones
        (still pending), nothing older."""
        with self._lock:
            if self._completed is not None and checkpoint_id <= self._completed:
                return
            self._completed = checkpoint_id
            self._keep_from(checkpoint_id)

    def restored(self, checkpoint_id: int, local: bool,
                 read: Iterable[tuple[StateHandle, bytes]] = ()) -> None:
        """The subtask restored ``checkpoint_id`` (``local``: its own files from here).
        Files of later checkpoints (which did not complete) go; so does the whole copy if
        the restore read storage (it holds none of the restored checkpoint), but for
        ``read``: files it read from storage that the next checkpoints' state will need
        (a heap chain they extend). They are kept as any file a later checkpoint needs,
        not as ``checkpoint_id``'s own: a restore of ``checkpoint_id`` again reads storage."""
        with self._lock:
            if not local:
                identity = self._identity
                self._clear()
                self._identity = identity
                self._files = {handle.path: (handle, data) for handle, data in read}
                if self._files:
                    self._completed = checkpoint_id  # (older writes are not wanted)
                return
            self._completed = checkpoint_id
            self._written = {n: p for n, p in self._written.items() if n <= checkpoint_id}
            self._own = {n: p for n, p in self._own.items() if n <= checkpoint_id}
            self._keep_from(checkpoint_id)

    def _keep_from(self, checkpoint_id: int) -> None:
        """Under the lock: drop what neither ``checkpoint_id`` nor a later one needs."""
        later = [n for n in self._written if n > checkpoint_id]
        keep = set(self._own.get(checkpoint_id, ()))
        for n in later:
            keep |= self._written[n] | self._own.get(n, frozenset())
        self._files = {p: f for p, f in self._files.items() if p in keep}
        self._written = {n: self._written[n] for n in later}
        self._own = {n: p for n, p in self._own.items() if n >= checkpoint_id}

    def own_files(self, checkpoint_id: int) -> frozenset[str] | None:
        """The files checkpoint ``checkpoint_id``'s state of the subtask needs, if all are
        here (None: not known, or some missing)."""
        with self._lock:
            own = self._own.get(checkpoint_id)
            if own is None or not own.issubset(self._files):
                return None
            return own

    def lookup(self, handle: StateHandle) -> bytes | None:
        """The bytes of ``handle`` if the copy has that file with its size and checksum."""
        with self._lock:
            kept = self._files.get(handle.path)
        if kept is None or kept[0] != handle:
            return None
        return kept[1]

    @property
    def size(self) -> int:
        """Bytes held."""
        with self._lock:
            return sum(len(data) for _, data in self._files.values())


class RecordingStorage(CheckpointStorage):
    """Checkpoint storage that also keeps every state file it writes in ``copy``."""

    def __init__(self, uri: str, copy: LocalStateCopy) -> None:
        super().__init__(uri)
        self.copy = copy

    def write_state(self, job_key: str, checkpoint_id: int, name: str,
                    data: bytes | bytearray | memoryview) -> StateHandle:
        handle = super().write_state(job_key, checkpoint_id, name, data)
        self.copy.record(checkpoint_id, handle, data)
        return handle

    def write_shared(self, job_key: str, checkpoint_id: int, name: str,
                     data: bytes | bytearray | memoryview) -> StateHandle:
        handle = super().write_shared(job_key, checkpoint_id, name, data)
        self.copy.record(checkpoint_id, handle, data)
        return handle


# The copy of the subtask this process hosts (a subtask actor hosts one at a time).
PROCESS_COPY = LocalStateCopy()
