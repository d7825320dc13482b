"""Incremental checkpoints of the disk keyed state backend (Flink's
``RocksIncrementalSnapshotStrategy``).

RocksDB never changes a file once written: new data goes to new SST files and
compaction replaces old ones by new ones. So a checkpoint of a database is its
set of live files, and a checkpoint after another one needs to upload only the
SST files the other did not have.

* **Synchronous part** (on the processing thread): flush the memtable and make
  a RocksDB checkpoint of the database in a local directory (hard links: no
  copying).
* **Asynchronous part** (:meth:`IncrementalSnapshot.upload`): every SST file of
  that directory that the backend's newest *completed* checkpoint had uploaded
  already is referenced again by its handle; the others go to the job's shared
  directory (``<job>/shared/<checkpoint id>-<uuid>.sst``); the small private
  files (``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*``, ...) go into the
  checkpoint's own directory; and a :class:`DbManifest` (JSON) lists them all,
  with the backend's key-group range and state names. Only files of a
  checkpoint that completed are reused (the backend learns of completions
  through ``notify_checkpoint_complete``, :class:`UploadTracker`), so no
  checkpoint references a file an aborted one uploaded.

The keyed-state handle of such a checkpoint is the manifest's handle plus
``key_groups`` and ``files`` (every file it references, so the coordinator can
verify them and count references: :mod:`raystream.checkpoint.shared_state`)
and ``uploaded`` (bytes this checkpoint wrote). A restore downloads a
manifest's files into a fresh directory and opens the database from them
(:class:`RestoredDb`); see ``DiskKeyedStateBackend.restore_db``. After a
restore of the job's own checkpoint at the same key groups (a failover), the
next checkpoint references the restored files again; after a rescale, or a
restore from another job's checkpoint (whose files that job may delete), the
next checkpoint uploads everything once (Flink's "no claim" mode).

A savepoint is always full: the same snapshot, asked for its sections
instead (:meth:`IncrementalSnapshot.__call__`), writes every entry in the
section format either backend restores.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from raystream.checkpoint.storage import CheckpointStorage, CorruptCheckpointError, StateHandle

__all__ = ["DbManifest", "IncrementalSnapshot", "RestoredDb", "UploadTracker",
           "db_handle_files"]

MANIFEST_FORMAT = 1
_SST = ".sst"


@dataclass(frozen=True)
class DbManifest:
    """One operator instance's database in one checkpoint: its files by local name.

    ``states``: ``[[state id, name, kind], ...]`` (state ids are the ones in the keys).

    >>> m = DbManifest(128, range(0, 64), [[0, "count", "value"]],
    ...                {"CURRENT": StateHandle("/c/CURRENT", 16, "0" * 64)})
    >>> DbManifest.from_bytes(m.to_bytes()) == m
    True
    """

    max_parallelism: int
    key_groups: range
    states: list[list[Any]]
    files: Mapping[str, StateHandle]

    def to_bytes(self) -> bytes:
        return json.dumps({
            "format": MANIFEST_FORMAT, "max_parallelism": self.max_parallelism,
            "key_groups": [self.key_groups.start, self.key_groups.stop],
            "states": self.states,
            "files": {name: h.to_json() for name, h in sorted(self.files.items())}},
            sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> DbManifest:
        """Parse a manifest; ``ValueError`` if it is not one."""
        try:
            doc = json.loads(data)
            if doc["format"] != MANIFEST_FORMAT:
                raise ValueError(f"unsupported database manifest format {doc['format']!r}")
            start, stop = doc["key_groups"]
            files = {}
            for name, handle in doc["files"].items():
                if not name or "/" in name or name in (".", ".."):
                    raise ValueError(f"bad file name {name!r}")
                files[name] = StateHandle.from_json(handle)
            return cls(doc["max_parallelism"], range(start, stop), doc["states"], files)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a database manifest ({type(exc).__name__}: {exc})") from None


def db_handle_files(handle: Mapping[str, Any]) -> list[dict]:
    """Handles (JSON) of every file a keyed-database handle references."""
    return list(handle.get("files", ()))


class UploadTracker:
    """Which local SST files of one database are in checkpoint storage, and where.

    ``uploaded(n, files)`` records what checkpoint ``n`` referenced; once ``n``
    completes (``complete(n)``) those become the files later checkpoints reuse.
    Uploads run on the snapshot thread, notifications on the processing thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, StateHandle]] = {}
        self._confirmed: dict[str, StateHandle] = {}

    def confirmed(self) -> dict[str, StateHandle]:
        with self._lock:
            return dict(self._confirmed)

    def restored(self, files: dict[str, StateHandle]) -> None:
        """The database was restored from these files (of a completed checkpoint)."""
        with self._lock:
            self._confirmed = dict(files)

    def uploaded(self, checkpoint_id: int, files: dict[str, StateHandle]) -> None:
        with self._lock:
            self._pending[checkpoint_id] = files

    def complete(self, checkpoint_id: int) -> None:
        with self._lock:
            files = self._pending.pop(checkpoint_id, None)
            if files is not None:
                self._confirmed = files
            for n in [n for n in self._pending if n < checkpoint_id]:  # subsumed
                del self._pending[n]


class IncrementalSnapshot:
    """The asynchronous part of an incremental disk snapshot (see the module docstring).

    ``upload`` writes it as an incremental checkpoint; calling it gives the
    full sections instead (a savepoint), or ``{}`` once it was uploaded (the
    operator's other parts still go into sections). Either way the local
    checkpoint directory is removed after.
    """

    def __init__(self, *, local_dir: str, full: Callable[[], dict[int, bytes]],
                 release_full: Callable[[], None], tracker: UploadTracker,
                 max_parallelism: int, key_groups: range, states: list[list[Any]]) -> None:
        self.local_dir = local_dir
        self._full, self._release_full = full, release_full
        self._tracker = tracker
        self._manifest = (max_parallelism, key_groups, states)
        self._uploaded = False
        self._finalizer = weakref.finalize(self, shutil.rmtree, local_dir, True)

    def upload(self, storage: CheckpointStorage, job_key: str, checkpoint_id: int,
               stem: str) -> dict[str, Any]:
        """Write checkpoint ``checkpoint_id``'s files; the keyed-database handle (JSON)."""
        self._release_full()  # the full iterator is not needed: let RocksDB unpin its files
        reuse = self._tracker.confirmed()
        files: dict[str, StateHandle] = {}
        uploaded = 0
        for name in sorted(os.listdir(self.local_dir)):
            local = os.path.join(self.local_dir, name)
            if name.endswith(_SST):
                handle = reuse.get(name)
                if handle is None:
                    handle = storage.write_shared_file(job_key, checkpoint_id,
                                                       f"{uuid.uuid4().hex}{_SST}", local)
                    uploaded += handle.size
            else:  # MANIFEST, CURRENT, OPTIONS, ...: small, and they change every time
                with open(local, "rb") as f:
                    handle = storage.write_state(job_key, checkpoint_id, f"{stem}.db/{name}",
                                                 f.read())
                uploaded += handle.size
            files[name] = handle
        max_parallelism, key_groups, states = self._manifest
        manifest = storage.write_state(
            job_key, checkpoint_id, f"{stem}.keyed-db",
            DbManifest(max_parallelism, key_groups, states, files).to_bytes())
        self._tracker.uploaded(checkpoint_id, {n: h for n, h in files.items()
                                               if n.endswith(_SST)})
        self._uploaded = True
        self._finalizer()
        return {**manifest.to_json(), "key_groups": [key_groups.start, key_groups.stop],
                "files": [h.to_json() for _, h in sorted(files.items())],
                "uploaded": uploaded + manifest.size}

    def __call__(self) -> dict[int, bytes]:
        try:
            return {} if self._uploaded else self._full()
        finally:
            self._finalizer()


@dataclass(frozen=True)
class RestoredDb:
    """A database of a checkpoint a job restores from: its manifest and where its files are."""

    manifest: DbManifest
    storage: CheckpointStorage
    # its SST files are the restoring job's own shared files: the next checkpoint may
    # reference them again (another job's files never are: that job may delete them)
    reusable: bool = False

    @classmethod
    def read(cls, storage: CheckpointStorage, handle: Mapping[str, Any],
             own_shared_dir: str | None = None) -> RestoredDb:
        """The manifest of ``handle`` (the JSON :meth:`IncrementalSnapshot.upload` gave;
        verified, ``CorruptCheckpointError`` naming it); ``own_shared_dir``: the restoring
        job's shared directory."""
        state = StateHandle.from_json(dict(handle))
        try:
            manifest = DbManifest.from_bytes(storage.read_state(state))
        except ValueError as exc:
            raise CorruptCheckpointError(state.path, str(exc)) from None
        reusable = own_shared_dir is not None and all(
            h.path.startswith(own_shared_dir + "/")
            for name, h in manifest.files.items() if name.endswith(_SST))
        return cls(manifest, storage, reusable)

    def shared_files(self) -> dict[str, StateHandle]:
        """Its SST files by local name."""
        return {n: h for n, h in self.manifest.files.items() if n.endswith(_SST)}

    def download(self, directory: str) -> None:
        """Copy every file into ``directory`` (created), each checked against its handle."""
        os.makedirs(directory, exist_ok=True)
        for name, handle in self.manifest.files.items():
            self.storage.download(handle, os.path.join(directory, name))
