"""Durable checkpoint storage over ``pyarrow.fs``.

Layout, under the storage root (a local directory or any ``pyarrow.fs`` URI)::

    <root>/<job_key>/chk-<id>/<state files>    written by the subtasks (``write_state``)
    <root>/<job_key>/chk-<id>/_metadata        written last by the coordinator (``write_metadata``)
    <root>/<job_key>/shared/<id>-<name>        files of incremental checkpoints, which later
                                               checkpoints reference too (``write_shared_file``)

Every file is checksummed (SHA-256). A state file's size and checksum travel in
its :class:`StateHandle`, which the coordinator records in the checkpoint's
metadata; the metadata file embeds the checksum of its own payload::

    {"format": 1, "sha256": "<hex of the canonical JSON of payload>", "payload": {...}}

The canonical JSON is ``json.dumps(payload, sort_keys=True, separators=(",", ":"),
allow_nan=False)``. Metadata is JSON, never pickle: reading a checkpoint must
not execute code from storage.

Durability protocol
-------------------
``_metadata`` is the commit point: a checkpoint is *complete* once that file
exists with a valid checksum, and never before. It must therefore never be
seen half-written, and must be durable before ``notify_checkpoint_complete``
lets any side effect be committed.

* **Local filesystem.** State files are written, flushed and ``os.fsync``-ed
  before their handle is returned (the subtask acknowledges only then). The
  metadata goes to a temporary file in the checkpoint directory, is flushed
  and ``fsync``-ed, then ``os.rename``-d to ``_metadata`` (atomic on POSIX:
  readers see no file or the whole file), and finally the checkpoint
  directory, the job directory and the root are ``fsync``-ed so that the
  rename and the directory entries of the state files and of ``chk-<id>``
  survive a power loss. Without the file fsync the rename could reach disk
  before the data (a renamed but empty file); without the directory fsync
  the rename itself could be lost.
* **Object stores and other filesystems** (S3, GCS, ...). Output streams
  cannot be fsync-ed and there is no atomic rename (a "rename" is copy plus
  delete). An object becomes visible only when its upload completes, so the
  metadata is one PUT of the final key (``open_output_stream`` + ``close``);
  durability is the store's on acknowledgement of that PUT.
* On any filesystem where a partially written file could become visible
  (HDFS, a crash mid-write of a state file), the checksums catch it:
  :meth:`CheckpointStorage.read_metadata`, :meth:`~CheckpointStorage.read_state`
  and :meth:`~CheckpointStorage.latest_valid_checkpoint` refuse what does not
  verify, with a :class:`CorruptCheckpointError` naming the file.

Leftover temporary metadata files of a crashed write are never mistaken for
``_metadata``. Falling back past a corrupt checkpoint is only correct when no
output was committed for it; the caller says so through ``must_not_skip``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import mmap
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow.fs as pafs

from raystream.checkpoint.metadata import CheckpointMetadata
from raystream.core.errors import RaystreamError

__all__ = ["StateHandle", "CorruptCheckpointError", "CheckpointStorage", "METADATA_FILE"]

logger = logging.getLogger(__name__)

METADATA_FILE = "_metadata"
SAVEPOINT_JOB_KEY = "savepoint"  # a savepoint at URI u is <u>/savepoint/chk-<id>/
OUTPUT_DIR = "output"  # committed sink output, outside every chk-<id>
SHARED_DIR = "shared"  # files of incremental checkpoints, referenced by several chk-<id>
METADATA_FORMAT = 1
_TMP_PREFIX = "_metadata.inprogress-"
_CHK_PREFIX = "chk-"
# Only canonical decimal ids ("chk-7", never "chk-007"), so that an id read
# back from a listing names the same directory as checkpoint_dir(id).
_CHK_RE = re.compile(r"chk-(0|[1-9][0-9]*)")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_SHARED_RE = re.compile(r"(0|[1-9][0-9]*)-.+")
_CHUNK = 8 << 20  # bytes per write/hash step of large state


@dataclass(frozen=True)
class StateHandle:
    """Where one written state file is: its full path in the filesystem, size and SHA-256."""

    path: str
    size: int
    sha256: str

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: dict) -> "StateHandle":
        try:
            path, size, sha = d["path"], d["size"], d["sha256"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a state handle: {d!r}") from e
        if not isinstance(path, str) or not path:
            raise ValueError(f"state handle path must be a non-empty string: {d!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"state handle size must be a non-negative int: {d!r}")
        if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
            raise ValueError(f"state handle sha256 must be 64 lowercase hex digits: {d!r}")
        return cls(path, size, sha)


def snapshot_destination(storage: "CheckpointStorage", job_key: str,
                         savepoint_target: str | None) -> tuple["CheckpointStorage", str]:
    """Where a snapshot's files go: the job's checkpoint storage, or a savepoint's own
    directory (which the job never deletes)."""
    if savepoint_target is None:
        return storage, job_key
    return CheckpointStorage(savepoint_target), SAVEPOINT_JOB_KEY


class CorruptCheckpointError(RaystreamError):
    """A checkpoint file is missing, truncated, unparsable or fails its checksum.

    ``path`` names the file, ``reason`` says what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt checkpoint file {path!r}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):  # survives pickling (Ray ships exceptions between processes)
        return (type(self), (self.path, self.reason))


class StorageUnavailableError(OSError):
    """The checkpoint storage itself cannot be reached (its root is gone or is not a
    directory): nothing can be said about the files in it. Unlike corruption this
    may pass; a restore that meets it is retried under the restart strategy."""


class CheckpointStorage:
    """Checkpoint files of jobs under one root directory or ``pyarrow.fs`` URI.

    Example:
        >>> import tempfile
        >>> storage = CheckpointStorage(tempfile.mkdtemp())
        >>> h = storage.write_state("job", 1, "op-0.state", b"hello")
        >>> h.size, h.sha256 == hashlib.sha256(b"hello").hexdigest()
        (5, True)
        >>> _ = storage.write_metadata("job", 1, {"handles": [h.to_json()]})
        >>> storage.completed_checkpoint_ids("job")
        [1]
        >>> cid, meta = storage.latest_valid_checkpoint("job")
        >>> cid, storage.read_state(StateHandle.from_json(meta["handles"][0]))
        (1, b'hello')
        >>> storage.highest_checkpoint_id("job"), storage.highest_checkpoint_id("other")
        (1, 0)
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        if "://" in uri:
            fs, root = pafs.FileSystem.from_uri(uri)
        else:
            fs, root = pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(uri))
        self.filesystem: pafs.FileSystem = fs
        self.root: str = root if root == "/" else root.rstrip("/")
        self.is_local: bool = isinstance(fs, pafs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.uri!r})"

    # -- paths ---------------------------------------------------------------

    def _join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts) if base else posixpath.join(*parts)

    def job_dir(self, job_key: str) -> str:
        if (not isinstance(job_key, str) or not job_key or job_key in (".", "..")
                or "/" in job_key or "\\" in job_key):
            raise ValueError(f"job_key must be one non-empty path segment, got {job_key!r}")
        return self._join(self.root, job_key)

    def checkpoint_dir(self, job_key: str, checkpoint_id: int) -> str:
        if not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool) or checkpoint_id < 0:
            raise ValueError(f"checkpoint_id must be a non-negative int, got {checkpoint_id!r}")
        return self._join(self.job_dir(job_key), f"{_CHK_PREFIX}{checkpoint_id}")

    def _metadata_path(self, job_key: str, checkpoint_id: int) -> str:
        return self._join(self.checkpoint_dir(job_key, checkpoint_id), METADATA_FILE)

    def check_writable(self, job_key: str | None = None) -> None:
        """Create the job's directory (None: the storage's own) and a probe file in it,
        then delete the probe; raises ``OSError`` naming the path and the cause where that
        fails (checked when a job starts, so it fails at once rather than at every
        checkpoint)."""
        job_dir = self.root if job_key is None else self.job_dir(job_key)
        probe = self._join(job_dir, f".write-probe-{uuid.uuid4().hex}")
        try:
            self.filesystem.create_dir(job_dir, recursive=True)
            with self.filesystem.open_output_stream(probe, compression=None):
                pass
            self.filesystem.delete_file(probe)
        except OSError as exc:
            raise OSError(f"checkpoint storage {self.uri} is not writable: could not create "
                          f"{probe}: {type(exc).__name__}: {exc}") from exc

    # -- state files ---------------------------------------------------------

    def write_state(self, job_key: str, checkpoint_id: int, name: str,
                    data: bytes | bytearray | memoryview) -> StateHandle:
        """Write ``data`` to ``<checkpoint_dir>/<name>`` (``name`` may contain ``/``).

        Streams in chunks, hashing as it writes, without copying ``data``.
        Raises ``OSError`` when the location is not writable.
        """
        chk = self.checkpoint_dir(job_key, checkpoint_id)
        # chk-<id> itself is fsync-ed by write_metadata.
        return self._write_file(chk, self._checked_name(name), data)

    def write_output(self, job_key: str, name: str,
                     data: bytes | bytearray | memoryview) -> StateHandle:
        """Write a sink's output file to ``<job_dir>/output/<name>``.

        Output lives outside the ``chk-<id>`` directories because it stays
        committed after the checkpoint that committed it is deleted by
        retention (the collect sink's files and commit log).

        An output file is written once and never rewritten: a sink may write the
        same bytes under the same name again (a retry), and rewriting a committed
        file in place could corrupt it if the process died midway. It appears
        whole (temporary file, fsync, rename; one PUT on object stores) or not at
        all.
        """
        output = self._join(self.job_dir(job_key), OUTPUT_DIR)
        path = self._join(output, self._checked_name(name))
        body = bytes(data)
        publish_new_file(self.filesystem, self.is_local, posixpath.dirname(path),
                         posixpath.basename(path), body,
                         temp_name=f".{posixpath.basename(path)}.tmp-{uuid.uuid4().hex}",
                         fsync_dirs=(output,) if self.is_local else ())
        return StateHandle(path, len(body), hashlib.sha256(body).hexdigest())

    def shared_dir(self, job_key: str) -> str:
        return self._join(self.job_dir(job_key), SHARED_DIR)

    def write_shared_file(self, job_key: str, checkpoint_id: int, name: str,
                          local_path: str) -> StateHandle:
        """Copy the local file ``local_path`` to ``<job_dir>/shared/<checkpoint_id>-<name>``
        (an incremental checkpoint's file that later checkpoints may reference too; the
        id says which checkpoint uploaded it). Streams: the file is mapped, not read."""
        target = f"{checkpoint_id}-{self._checked_name(name)}"
        with open(local_path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return self._write_file(self.shared_dir(job_key), target, b"")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, \
                    memoryview(mapped) as view:
                return self._write_file(self.shared_dir(job_key), target, view)

    def write_shared(self, job_key: str, checkpoint_id: int, name: str,
                     data: bytes | bytearray | memoryview) -> StateHandle:
        """Write ``data`` to ``<job_dir>/shared/<checkpoint_id>-<name>``, as
        :meth:`write_shared_file` does a local file (the heap backend's increments)."""
        return self._write_file(self.shared_dir(job_key),
                                f"{checkpoint_id}-{self._checked_name(name)}", data)

    @staticmethod
    def shared_file_checkpoint(path: str) -> int | None:
        """The id of the checkpoint that uploaded the shared file ``path`` (None: not one).

        >>> CheckpointStorage.shared_file_checkpoint("/s/job/shared/12-000009.sst")
        12
        """
        m = _SHARED_RE.fullmatch(posixpath.basename(path))
        return int(m.group(1)) if m else None

    def shared_files(self, job_key: str) -> list[str]:
        """Paths of every file in the job's shared directory."""
        infos = self.filesystem.get_file_info(
            pafs.FileSelector(self.shared_dir(job_key), allow_not_found=True, recursive=False))
        return sorted(info.path for info in infos if info.type == pafs.FileType.File)

    def delete_file(self, path: str) -> None:
        """Delete one file; a missing one is fine."""
        try:
            self.filesystem.delete_file(path)
        except FileNotFoundError:
            pass

    def download(self, handle: StateHandle, local_path: str) -> None:
        """Copy the file of ``handle`` to ``local_path``, in chunks, checking its size and
        SHA-256 (:class:`CorruptCheckpointError` naming the file if they differ)."""
        digest, size = hashlib.sha256(), 0
        try:
            with self._open_for_read(handle.path) as f, open(local_path, "wb") as out:
                while size <= handle.size:
                    chunk = f.read(_CHUNK)
                    if not chunk:
                        break
                    size += len(chunk)
                    digest.update(chunk)
                    out.write(chunk)
            _check_size(handle.path, size, handle.size)
            if digest.hexdigest() != handle.sha256:
                raise CorruptCheckpointError(
                    handle.path, f"checksum mismatch: expected sha256 {handle.sha256}, "
                                 f"got {digest.hexdigest()}")
        except BaseException:
            _remove_quietly(local_path)
            raise

    @staticmethod
    def _checked_name(name: str) -> str:
        segments = name.split("/") if isinstance(name, str) else [""]
        if (any(s in ("", ".", "..") or "\\" in s for s in segments)
                or segments[0] == METADATA_FILE or segments[0].startswith(_TMP_PREFIX)):
            raise ValueError(f"invalid state file name {name!r}")
        return name

    def _write_file(self, base: str, name: str,
                    data: bytes | bytearray | memoryview) -> StateHandle:
        path = self._join(base, name)
        view = memoryview(data)
        if view.ndim != 1 or view.format not in ("B", "b", "c"):
            view = view.cast("B")  # raises TypeError for non-contiguous buffers
        digest = hashlib.sha256()
        parent = posixpath.dirname(path)
        if self.is_local:
            os.makedirs(parent, exist_ok=True)
            try:
                with open(path, "wb") as f:
                    for i in range(0, view.nbytes, _CHUNK):
                        chunk = view[i:i + _CHUNK]
                        digest.update(chunk)
                        f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                _remove_quietly(path)
                raise
            # A nested name created directories below ``base``: make their entries durable.
            d = parent
            while d != base and d.startswith(base + "/"):
                fsync_dir(d)
                d = posixpath.dirname(d)
        else:
            self.filesystem.create_dir(parent, recursive=True)
            with self.filesystem.open_output_stream(path, compression=None) as out:
                for i in range(0, view.nbytes, _CHUNK):
                    chunk = view[i:i + _CHUNK]
                    digest.update(chunk)
                    out.write(chunk)
        return StateHandle(path, view.nbytes, digest.hexdigest())

    def read_state(self, handle: StateHandle) -> bytes:
        """The file's bytes, after checking its size and SHA-256 against ``handle``."""
        data = self._read_file(handle.path, expected_size=handle.size)
        _check_size(handle.path, len(data), handle.size)
        actual = hashlib.sha256(data).hexdigest()
        if actual != handle.sha256:
            raise CorruptCheckpointError(
                handle.path, f"checksum mismatch: expected sha256 {handle.sha256}, got {actual}")
        return data

    def _verify_state(self, handle: StateHandle) -> None:
        """Like read_state, but streams: never holds the whole file in memory."""
        digest, size = hashlib.sha256(), 0
        with self._open_for_read(handle.path) as f:
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > handle.size:
                    break
                digest.update(chunk)
        _check_size(handle.path, size, handle.size)
        if digest.hexdigest() != handle.sha256:
            raise CorruptCheckpointError(
                handle.path,
                f"checksum mismatch: expected sha256 {handle.sha256}, got {digest.hexdigest()}")

    def _open_for_read(self, path: str):
        try:
            return self.filesystem.open_input_stream(path, compression=None)
        except FileNotFoundError:
            raise self._missing(path) from None
        except OSError:
            # Some filesystems report a missing object as a plain OSError.
            if self.filesystem.get_file_info(path).type == pafs.FileType.NotFound:
                raise self._missing(path) from None
            raise

    def _missing(self, path: str) -> Exception:
        """A file that is not there is corruption only if the storage itself is."""
        if self.is_local and self.filesystem.get_file_info(self.root).type != pafs.FileType.Directory:
            return StorageUnavailableError(
                f"checkpoint storage {self.root!r} is not reachable (not a directory), so "
                f"{path!r} cannot be read")
        return CorruptCheckpointError(path, "missing")

    def _read_file(self, path: str, expected_size: int | None = None) -> bytes:
        with self._open_for_read(path) as f:
            if expected_size is None:
                return f.read()
            # read(n) fills one bytes object directly; ask for one byte more to see overlong files.
            data = f.read(expected_size + 1)
            if len(data) < expected_size + 1:
                rest = f.read()  # a short read before EOF (rare on streams): take the rest
                if rest:
                    data += rest
            return data

    # -- metadata (the commit point) -----------------------------------------

    def write_metadata(self, job_key: str, checkpoint_id: int, metadata: dict) -> StateHandle:
        """Atomically write the checkpoint's ``_metadata`` (see the module docstring).

        ``metadata`` must be JSON data with string keys (tuples read back as lists).
        Refuses (``FileExistsError``) to replace an existing ``_metadata``.
        """
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
        _check_string_keys(metadata, "metadata")
        body = checksummed_json(metadata, METADATA_FORMAT)
        chk = self.checkpoint_dir(job_key, checkpoint_id)
        final = self._join(chk, METADATA_FILE)
        if not publish_new_file(self.filesystem, self.is_local, chk, METADATA_FILE, body,
                                temp_name=f"{_TMP_PREFIX}{uuid.uuid4().hex}",
                                fsync_dirs=(posixpath.dirname(chk), self.root)):
            raise FileExistsError(errno.EEXIST, "checkpoint metadata already exists", final)
        return StateHandle(final, len(body), hashlib.sha256(body).hexdigest())

    def read_metadata(self, job_key: str, checkpoint_id: int) -> dict:
        """The payload of ``_metadata``, after checking its embedded checksum."""
        path = self._metadata_path(job_key, checkpoint_id)
        try:
            return verify_checksummed_json(self._read_file(path), METADATA_FORMAT)
        except ValueError as e:
            raise CorruptCheckpointError(path, str(e)) from None

    # -- listing, choosing, discarding ---------------------------------------

    def checkpoint_dir_ids(self, job_key: str) -> list[int]:
        """Ascending ids of every ``chk-<id>`` directory, complete or not."""
        infos = self.filesystem.get_file_info(
            pafs.FileSelector(self.job_dir(job_key), allow_not_found=True, recursive=False))
        ids = []
        for info in infos:
            m = _CHK_RE.fullmatch(info.base_name)
            if m and info.type == pafs.FileType.Directory:
                ids.append(int(m.group(1)))
        return sorted(ids)

    def completed_checkpoint_ids(self, job_key: str) -> list[int]:
        """Ascending ids of ``chk-<id>`` directories holding a ``_metadata`` (not verified)."""
        ids = self.checkpoint_dir_ids(job_key)
        if not ids:
            return []
        infos = self.filesystem.get_file_info([self._metadata_path(job_key, i) for i in ids])
        return [i for i, info in zip(ids, infos) if info.type == pafs.FileType.File]

    def highest_checkpoint_id(self, job_key: str) -> int:
        """The highest id of any ``chk-<id>`` directory, complete or not; 0 if none."""
        ids = self.checkpoint_dir_ids(job_key)
        return ids[-1] if ids else 0

    def latest_valid_checkpoint(
        self, job_key: str, must_not_skip: Callable[[int], bool] = lambda _id: False,
        skipped: list[CorruptCheckpointError] | None = None,
    ) -> tuple[int, dict] | None:
        """The newest checkpoint whose metadata and every state file in ``metadata["handles"]`` verify.

        Walks down from the highest ``chk-<id>`` directory. An id that is not a
        valid complete checkpoint (corrupt, truncated or missing metadata or
        state, or no directory at all) is skipped with a warning, unless
        ``must_not_skip(id)`` is true (output was committed for it): then this
        raises :class:`CorruptCheckpointError` instead of falling back past it.
        Errors that are not corruption (permissions, network) propagate.
        Returns ``(id, metadata)`` or ``None`` when no valid checkpoint exists;
        the corruption of each complete checkpoint it skipped goes to ``skipped``.
        """
        completed = set(self.completed_checkpoint_ids(job_key))
        for cid in range(self.highest_checkpoint_id(job_key), -1, -1):
            try:
                if cid not in completed:
                    # In progress, aborted or discarded: normal, unless it was committed.
                    if must_not_skip(cid):
                        raise CorruptCheckpointError(self._metadata_path(job_key, cid), "missing")
                    logger.debug("checkpoint %d of job %r is not complete; looking further", cid, job_key)
                    continue
                return cid, self.verified_metadata(job_key, cid)
            except CorruptCheckpointError as e:
                if must_not_skip(cid):
                    raise CorruptCheckpointError(
                        e.path, f"{e.reason}; checkpoint {cid} of job {job_key!r} must not be "
                                f"skipped (output was committed for it)") from e
                logger.warning("skipping checkpoint %d of job %r: %s", cid, job_key, e)
                if skipped is not None:
                    skipped.append(e)
        return None

    def verified_metadata(self, job_key: str, checkpoint_id: int) -> dict:
        """The checkpoint's metadata, once it and every state file it lists verify;
        else :class:`CorruptCheckpointError` naming the file."""
        metadata = self.read_metadata(job_key, checkpoint_id)
        self._verify_handles(self._metadata_path(job_key, checkpoint_id), metadata)
        return metadata

    def _verify_handles(self, metadata_path: str, metadata: dict) -> None:
        handles = metadata.get("handles", [])
        if not isinstance(handles, list):
            raise CorruptCheckpointError(metadata_path, "'handles' is not a list")
        for d in handles:
            try:
                handle = StateHandle.from_json(d)
            except ValueError as e:
                raise CorruptCheckpointError(metadata_path, f"bad state handle: {e}") from None
            self._verify_state(handle)

    def newest_checkpoint_of_job(self, job_name: str) -> tuple[str, int] | None:
        """``(job_key, checkpoint_id)`` of the newest valid checkpoint (by trigger time)
        that any run of the job named ``job_name`` left in this storage; None if none.

        Runs are the job directories ``<name>-<id>`` whose checkpoints' metadata
        names the job (what ``env.execute(name, resume=True)`` resumes from).
        """
        prefix = f"{job_name}-"
        infos = self.filesystem.get_file_info(
            pafs.FileSelector(self.root, allow_not_found=True, recursive=False))
        newest: tuple[int, str, int] | None = None
        for info in infos:
            if info.type != pafs.FileType.Directory or not info.base_name.startswith(prefix):
                continue
            found = self.latest_valid_checkpoint(info.base_name)
            if found is None:
                continue
            try:
                metadata = CheckpointMetadata.from_json(found[1])
            except ValueError:  # not a checkpoint of a job (a stray directory)
                continue
            if metadata.job != job_name:
                continue
            candidate = (metadata.trigger_ts_ms, info.base_name, found[0])
            newest = candidate if newest is None or candidate > newest else newest
        return None if newest is None else (newest[1], newest[2])

    def discard(self, job_key: str, checkpoint_id: int) -> None:
        """Delete ``chk-<id>`` and everything in it; a missing directory is fine."""
        path = self.checkpoint_dir(job_key, checkpoint_id)
        if self.filesystem.get_file_info(path).type == pafs.FileType.NotFound:
            return
        try:
            self.filesystem.delete_dir(path)
        except FileNotFoundError:
            pass


# -- helpers -----------------------------------------------------------------


def checksummed_json(payload: dict, format_version: int) -> bytes:
    """``{"format", "sha256" of the canonical JSON of payload, "payload"}``, compact.

    Used for checkpoint metadata and commit-log entries; read back with
    :func:`verify_checksummed_json`.
    """
    canonical = _canonical_json(payload)
    doc = {"format": format_version, "sha256": hashlib.sha256(canonical).hexdigest(),
           "payload": json.loads(canonical)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def safe_name(name: str) -> str:
    """``name`` (an operator's) as one path segment."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def verify_checksummed_json(raw: bytes, format_version: int) -> dict:
    """The payload of a :func:`checksummed_json` document; ``ValueError`` saying what is wrong."""
    try:
        doc = json.loads(raw)
    except ValueError as e:  # invalid UTF-8 or JSON
        reason = "truncated (no complete JSON document)" if _looks_truncated(raw) else "unparsable JSON"
        raise ValueError(f"{reason}: {e}") from None
    if not isinstance(doc, dict) or not {"format", "sha256", "payload"} <= doc.keys():
        raise ValueError("not a checksummed document")
    if doc["format"] != format_version:
        raise ValueError(f"unsupported format {doc['format']!r}")
    payload = doc["payload"]
    if not isinstance(payload, dict):
        raise ValueError("payload is not an object")
    try:
        actual = hashlib.sha256(_canonical_json(payload)).hexdigest()
    except ValueError as e:  # e.g. NaN smuggled in by a bit flip of a number
        raise ValueError(f"unparsable payload: {e}") from None
    if actual != doc["sha256"]:
        raise ValueError(f"checksum mismatch: expected sha256 {doc['sha256']}, got {actual}")
    return payload


def publish_new_file(filesystem: pafs.FileSystem, is_local: bool, directory: str, name: str,
                     body: bytes, *, temp_name: str, fsync_dirs: tuple[str, ...] = (),
                     before_publish: Callable[[], None] | None = None) -> bool:
    """Make ``directory/name`` appear whole, with ``body``, never replacing a file.

    Locally: a temp file in ``directory``, written, fsync-ed, renamed into
    place, then ``directory`` and ``fsync_dirs`` fsync-ed. Elsewhere a single
    PUT of the final key (object stores cannot rename atomically or fsync).
    ``before_publish`` runs once the bytes are durable and before they become
    visible. Returns False, writing nothing, if the file exists already.
    """
    final = posixpath.join(directory, name)
    if not is_local:
        filesystem.create_dir(directory, recursive=True)
        if filesystem.get_file_info(final).type != pafs.FileType.NotFound:
            return False
        if before_publish is not None:
            before_publish()
        with filesystem.open_output_stream(final, compression=None) as out:
            out.write(body)  # one PUT: the object appears whole or not at all
        return True
    os.makedirs(directory, exist_ok=True)
    if os.path.lexists(final):
        return False
    tmp = posixpath.join(directory, temp_name)
    try:
        with open(tmp, "xb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        if before_publish is not None:
            before_publish()
        if os.path.lexists(final):  # a concurrent writer of the same name won
            _remove_quietly(tmp)
            return False
        os.rename(tmp, final)
    except BaseException:
        _remove_quietly(tmp)
        raise
    for d in (directory, *fsync_dirs):
        fsync_dir(d)
    return True


def _canonical_json(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _check_string_keys(value: Any, where: str) -> None:
    # json.dumps would turn {1: x} into {"1": x}: the payload read back would differ
    # from the one written (and int keys sort differently from their strings).
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a non-string key {k!r}: metadata keys must be strings")
            _check_string_keys(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_string_keys(v, f"{where}[{i}]")


def _check_size(path: str, actual: int, expected: int) -> None:
    if actual < expected:
        raise CorruptCheckpointError(path, f"truncated: {actual} bytes, expected {expected}")
    if actual > expected:
        raise CorruptCheckpointError(path, f"size mismatch: more than {expected} bytes expected")


def _looks_truncated(raw: bytes) -> bool:
    text = raw.rstrip()
    return not text or not text.endswith(b"}")


def fsync_dir(path: str) -> None:
    """Make a directory's entries (creations, renames) durable. POSIX only."""
    if os.name == "nt":  # Windows cannot open a directory for fsync
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # a filesystem without directory fsync
            raise
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
