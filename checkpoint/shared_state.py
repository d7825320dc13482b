"""Which retained checkpoints reference each shared file (Flink's ``SharedStateRegistry``).

Incremental checkpoints of the disk backend (:mod:`raystream.checkpoint.disk_incremental`)
upload RocksDB files to ``<job>/shared/<checkpoint id>-<uuid>.sst`` and later
checkpoints reference them again. The coordinator keeps this registry of the
job's own shared files (another job's, read by a restore, are never touched):

* a checkpoint that completes **registers** the shared files it references;
* a checkpoint that retention (or subsumption by retention) discards is
  **released**: a file no retained checkpoint references any more is deleted;
* after each completion a **sweep** deletes what aborted checkpoints uploaded
  and no completed one references: every unregistered file uploaded by a
  checkpoint older than the newest completed one (a pending checkpoint is
  newer, or was aborted as subsumed);
* before a checkpoint completes, the files it reuses must still be registered
  (:meth:`SharedStateRegistry.unknown`): a subtask that had not heard of a
  newer completion yet may reuse a file retention has deleted meanwhile, and
  such a checkpoint is aborted rather than completed with a hole.

A job master that takes a job over rebuilds the registry from the checkpoint it
adopts; files of older checkpoints then go with the next sweep.
"""

from __future__ import annotations

import logging

from raystream.checkpoint.disk_incremental import db_handle_files
from raystream.checkpoint.metadata import CheckpointMetadata
from raystream.checkpoint.storage import CheckpointStorage

log = logging.getLogger(__name__)


class SharedStateRegistry:
    """Shared files of one job's retained checkpoints, with the checkpoints using each."""

    def __init__(self, storage: CheckpointStorage, job_key: str) -> None:
        self.storage, self.job_key = storage, job_key
        self._prefix = storage.shared_dir(job_key) + "/"
        self._users: dict[str, set[int]] = {}  # shared file -> checkpoints referencing it
        self._files: dict[int, set[str]] = {}  # checkpoint -> shared files it references

    def shared_files_of(self, metadata: CheckpointMetadata) -> set[str]:
        """This job's shared files that ``metadata`` references."""
        return {h["path"] for files in metadata.operators.values() for db in files.keyed_db
                for h in db_handle_files(db) if h["path"].startswith(self._prefix)}

    def referenced(self) -> set[str]:
        """Every shared file some registered checkpoint references."""
        return set(self._users)

    def unknown(self, checkpoint_id: int, metadata: CheckpointMetadata) -> list[str]:
        """Shared files the checkpoint references that it did not upload itself and that
        no retained checkpoint references (deleted, or to be deleted by a sweep)."""
        return sorted(p for p in self.shared_files_of(metadata)
                      if p not in self._users
                      and self.storage.shared_file_checkpoint(p) != checkpoint_id)

    def register(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        files = self.shared_files_of(metadata)
        self._files[checkpoint_id] = files
        for path in files:
            self._users.setdefault(path, set()).add(checkpoint_id)

    def release(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is discarded: delete the files only it used."""
        for path in sorted(self._files.pop(checkpoint_id, ())):
            users = self._users.get(path)
            if users is None:
                continue
            users.discard(checkpoint_id)
            if not users:
                del self._users[path]
                self._delete(path)

    def sweep(self, newest_completed: int) -> None:
        """Delete unregistered shared files uploaded by checkpoints older than
        ``newest_completed`` (aborted ones' uploads, deletions that failed before)."""
        try:
            paths = self.storage.shared_files(self.job_key)
        except OSError as exc:
            log.warning("could not list the shared files of %s: %s", self.job_key, exc)
            return
        for path in paths:
            uploader = self.storage.shared_file_checkpoint(path)
            if path not in self._users and uploader is not None and uploader < newest_completed:
                self._delete(path)

    def _delete(self, path: str) -> None:
        try:
            self.storage.delete_file(path)
        except OSError as exc:  # unregistered: the next sweep tries again
            log.warning("could not delete shared checkpoint file %s: %s", path, exc)
