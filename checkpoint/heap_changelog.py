"""Incremental checkpoints of the heap keyed state backend: a full snapshot and the changes since.

A heap snapshot pickles every entry of the state; with a million keys that is
most of what a checkpoint costs, although a second's input changes only some of
them. So, as Flink's changelog state backend does (FLIP-158) but at the
granularity of entries:

* While checkpoints are on, each of the backend's maps (one state, one key
  group) records which entries changed since the previous snapshot: written
  (with the value written), removed, or handed to the caller as a mutable object
  it may change in place.
* A snapshot's synchronous part moves those records into the :class:`ChangeLog`,
  under the snapshot's version (an O(states x key groups) swap).
* Its asynchronous part (:meth:`HeapIncrementalSnapshot.upload`) writes either a
  *full* snapshot, or the *changes* since the newest completed checkpoint of
  this backend (the *base*): per key group, every entry changed since then with
  its value as of this snapshot, and the keys removed. The file goes to the
  job's shared directory (``<job>/shared/<checkpoint id>-<uuid>.heap``); the
  checkpoint's handle lists its *chain*, the base's files and then its own,
  the full snapshot first. Only completed checkpoints are bases (the backend
  hears of them through ``notify_checkpoint_complete``, :class:`ChainTracker`),
  so no chain holds a file an aborted checkpoint wrote.
* Changes are written while the chain's changes add up to no more than
  ``max_changes_ratio`` times the entries of its full snapshot; past that, the
  snapshot is full and starts a new chain. So a restore reads at most
  ``1 + max_changes_ratio`` times the state, and the changes held in memory
  stay below that share of its keys.
* A restore reads each chain's files in order: the full sections restore, the
  changes apply (:meth:`HeapKeyedStateBackend.restore` takes both). A restore at
  another parallelism reads the chains of every old subtask whose key groups
  overlap its own. After a failover (the job's own checkpoint, the same key
  groups: :func:`restored_chain`) the next checkpoint extends the restored
  chain; after a rescale, or a restore of another job's checkpoint (whose files
  that job may delete), the next checkpoint is full.
* A savepoint is always full: the same snapshot, asked for its sections instead.

The coordinator counts references to the shared files
(:mod:`raystream.checkpoint.shared_state`), so a file lives as long as a
retained checkpoint's chain holds it.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from raystream.checkpoint.sections import encode_sections
from raystream.checkpoint.handles import CHAIN_FORMAT, is_heap_chain
from raystream.checkpoint.storage import CheckpointStorage

__all__ = ["Chain", "ChainTracker", "ChangeLog", "Changes", "HeapIncrementalSnapshot",
           "HeapStateOptions", "is_heap_chain", "restored_chain"]


# the entries changed, per state name, per key group (index into the backend's range):
# entry key -> the value last written, or a marker of its removal (checkpoint/state.py)
Changes = dict[str, list[dict]]


@dataclass(frozen=True)
class HeapStateOptions:
    """The heap backend with its settings, for ``CheckpointConfig(state_backend=...)``.

    Args:
        incremental: a checkpoint writes only the entries that changed since the
            previous completed one, until those add up to ``max_changes_ratio``
            times the state (see :mod:`raystream.checkpoint.heap_changelog`).
            On by default; savepoints stay full.
        max_changes_ratio: how much a restore may read beyond the state itself.

    >>> HeapStateOptions(max_changes_ratio=0.25).kind
    'heap'
    >>> HeapStateOptions(max_changes_ratio=-1)
    Traceback (most recent call last):
    ...
    ValueError: heap state backend: max_changes_ratio must be >= 0, got -1
    """

    incremental: bool = True
    max_changes_ratio: float = 0.5

    def __post_init__(self) -> None:
        if not self.max_changes_ratio >= 0:
            raise ValueError(f"heap state backend: max_changes_ratio must be >= 0, "
                             f"got {self.max_changes_ratio}")

    @property
    def kind(self) -> str:
        return "heap"


@dataclass(frozen=True)
class Chain:
    """The files of one checkpoint of a backend, oldest first: a full snapshot, then changes.

    ``version``: the backend version of the newest snapshot in it; ``full_entries``:
    the entries of its full snapshot; ``changed_entries``: the entries its changes
    wrote, all together."""

    files: tuple[dict, ...]
    version: int
    full_entries: int
    changed_entries: int

    def room(self, ratio: float) -> float:
        """How many more changed entries the chain may take."""
        return ratio * max(self.full_entries, 1) - self.changed_entries


class ChainTracker:
    """Which chain the next checkpoint of one backend may extend.

    ``uploaded(n, chain)`` records what checkpoint ``n`` wrote; once ``n``
    completes (``complete(n)``) its chain is the base of later ones. ``forget(v)``:
    a full snapshot at version ``v`` dropped the change log before it, so no chain
    older than that may be a base any more. Uploads run on the snapshot thread,
    the rest on the processing thread.

    >>> tracker = ChainTracker()
    >>> tracker.uploaded(4, Chain(({"path": "a"},), version=0, full_entries=10, changed_entries=0))
    >>> tracker.complete(4).files
    ({'path': 'a'},)
    >>> tracker.forget(1)
    >>> tracker.base() is None
    True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Chain] = {}
        self._confirmed: Chain | None = None
        self._floor = 0  # chains of versions below this are no base

    def base(self) -> Chain | None:
        with self._lock:
            return self._confirmed

    def uploaded(self, checkpoint_id: int, chain: Chain) -> None:
        with self._lock:
            self._pending[checkpoint_id] = chain

    def complete(self, checkpoint_id: int) -> Chain | None:
        """Checkpoint ``checkpoint_id`` completed: its chain if it is the new base."""
        with self._lock:
            chain = self._pending.pop(checkpoint_id, None)
            for n in [n for n in self._pending if n < checkpoint_id]:  # subsumed
                del self._pending[n]
            if chain is None or chain.version < self._floor:
                return None
            self._confirmed = chain
            return chain

    def restored(self, chain: Chain) -> None:
        """The backend restored ``chain`` whole (nothing else): it is the base of the
        next checkpoint."""
        with self._lock:
            self._confirmed = chain

    def forget(self, version: int) -> None:
        with self._lock:
            self._confirmed = None
            self._floor = version


class ChangeLog:
    """The changes of the snapshots taken since the base, by snapshot version.
    Logged changes are never changed (the maps record into new dicts)."""

    def __init__(self) -> None:
        self._logs: list[tuple[int, Changes]] = []

    def add(self, version: int, changes: Changes) -> None:
        self._logs.append((version, changes))

    def since(self, version: int) -> list[Changes]:
        """The changes of every snapshot after ``version``."""
        return [changes for v, changes in self._logs if v > version]

    def size_since(self, version: int) -> int:
        """An upper bound of the entries changed since ``version``."""
        return sum(len(s) for v, changes in self._logs if v > version
                   for sets in changes.values() for s in sets)

    def drop_upto(self, version: int) -> None:
        self._logs = [(v, changes) for v, changes in self._logs if v > version]

    def clear(self) -> None:
        self._logs = []


def union(logged: list[Changes]) -> Changes:
    """One dict per state and key group of every entry changed in ``logged`` (oldest
    first), with its newest change. Logged changes are never changed: one alone is
    returned as it is."""
    if len(logged) == 1:
        return logged[0]
    out: Changes = {}
    for changes in logged:
        for name, dicts in changes.items():
            merged = out.get(name)
            if merged is None:
                out[name] = [dict(d) for d in dicts]
                continue
            merged.extend({} for _ in range(len(dicts) - len(merged)))
            for i, d in enumerate(dicts):
                if d:
                    merged[i].update(d)
    return out


class HeapIncrementalSnapshot:
    """The asynchronous part of an incremental heap snapshot (see the module docstring).

    ``upload`` writes it to the job's shared directory, as a full snapshot or as
    the changes since ``base``; calling it gives the full sections instead (a
    savepoint), or ``{}`` once it was uploaded."""

    def __init__(self, *, full: Callable[[], dict[int, bytes]],
                 changed: Callable[[Changes], tuple[dict[int, bytes], int]],
                 base: Chain | None, logged: list[Changes],
                 version: int, entries: int, tracker: ChainTracker,
                 key_groups: range) -> None:
        self._full, self._changed = full, changed
        self.base = base  # None: a full snapshot
        self._logged = logged
        self._version, self._entries = version, entries
        self._tracker = tracker
        self._key_groups = key_groups
        self._uploaded = False

    def upload(self, storage: CheckpointStorage, job_key: str, checkpoint_id: int,
               stem: str) -> dict[str, Any]:
        """Write checkpoint ``checkpoint_id``'s file; the chain's handle (JSON)."""
        self._uploaded = True
        base = self.base
        if base is None:
            sections, entries = self._full(), 0
        else:
            sections, entries = self._changed(union(self._logged))
        self._logged = []
        if base is not None and not sections:  # nothing changed: the base's files again
            chain = Chain(base.files, self._version, base.full_entries, base.changed_entries)
            uploaded = 0
        else:
            handle = storage.write_shared(job_key, checkpoint_id,
                                          f"{stem}-{uuid.uuid4().hex}.heap",
                                          encode_sections(sections)).to_json()
            uploaded = handle["size"]
            chain = (Chain((handle,), self._version, self._entries, 0) if base is None else
                     Chain((*base.files, handle), self._version, base.full_entries,
                           base.changed_entries + entries))
        self._tracker.uploaded(checkpoint_id, chain)
        return {**chain.files[-1], "format": CHAIN_FORMAT,
                "key_groups": [self._key_groups.start, self._key_groups.stop],
                "files": list(chain.files), "uploaded": uploaded,
                "entries": [chain.full_entries, chain.changed_entries]}

    def __call__(self) -> dict[int, bytes]:
        return {} if self._uploaded else self._full()


def restored_chain(handle: Mapping[str, Any], *, key_groups: range,
                   own_shared_dir: str | None) -> Chain | None:
    """The chain of ``handle`` as the base of the restoring backend's next checkpoint,
    or None (that checkpoint is full): only where the backend restores exactly this
    chain (``key_groups`` are the handle's) from its own job's shared directory
    (``own_shared_dir``; None: not the job's own storage).

    Its version is -1: every snapshot after the restore (versions from 0) changed
    the state after it.

    >>> files = [{"path": "/s/job/shared/3-sum-0-aa.heap"}, {"path": "/s/job/shared/4-sum-0-bb.heap"}]
    >>> handle = {"format": CHAIN_FORMAT, "key_groups": [0, 64], "files": files, "entries": [900, 120]}
    >>> restored_chain(handle, key_groups=range(0, 64), own_shared_dir="/s/job/shared")
    Chain(files=({'path': '/s/job/shared/3-sum-0-aa.heap'}, {'path': '/s/job/shared/4-sum-0-bb.heap'}), version=-1, full_entries=900, changed_entries=120)
    >>> restored_chain(handle, key_groups=range(0, 32), own_shared_dir="/s/job/shared") is None
    True
    """
    if own_shared_dir is None or "entries" not in handle:  # (a handle written before them)
        return None
    if list(handle["key_groups"]) != [key_groups.start, key_groups.stop]:
        return None
    files = tuple(handle["files"])
    if not all(f["path"].startswith(own_shared_dir + "/") for f in files):
        return None
    full_entries, changed_entries = handle["entries"]
    return Chain(files, -1, int(full_entries), int(changed_entries))
