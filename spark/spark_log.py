"""Spark's own file-sink log (``<path>/_spark_metadata``), kept as a mirror of the commit log.

The commit log (:mod:`raystream.spark.commit_log`) is the source of truth.
Next to it the Parquet sink keeps the log Spark's ``FileStreamSink`` writes,
so that Spark readers that know nothing of raystream see committed files
only: a plain ``spark.read.parquet(path)`` (Spark's ``MetadataLogFileIndex``)
and ``spark.readStream.parquet(path)`` (``FileStreamSource``, which follows
the log when ``_spark_metadata`` exists) list the files of this log, never
the directory.

Format (Spark 3.x ``FileStreamSinkLog``, version 1)::

    <path>/_spark_metadata/<batch id>            "v1", then one JSON line per file added
    <path>/_spark_metadata/<batch id>.compact    "v1", then every file of batches 0..id

    {"path": "file:///out/k=1/3-0-0-<uuid>.parquet", "size": 70211, "isDir": false,
     "modificationTime": 1732233600000, "blockReplication": 1, "blockSize": 33554432,
     "action": "add"}

Batch ids are dense (0, 1, 2, ...); every ``compact_interval``-th batch
(``(id + 1) % interval == 0``) is a compaction holding the whole file list.
Spark readers derive the interval from the ``.compact`` files they find, and
before the first one from their ``spark.sql.streaming.fileSink.log.compactInterval``
(default 10): the writer uses Spark's default and, on an existing log, the
interval Spark would derive from it. Paths are absolute URIs as Hadoop
prints them (``file:///...`` with ``%``-escapes), built from the sink's
path as configured.

How it mirrors the commit log
-----------------------------
* **One batch per commit.** After the committer writes the commit-log entry
  of (incarnation, checkpoint) it appends ONE batch with that entry's files
  (those Spark does not list yet): a batch appears whole (temp file + fsync +
  rename, or one PUT), so a Spark reader sees a checkpoint's files all at
  once or not at all, and never a file outside the commit log.
* **Repair on (re)start.** A crash between the entry and its batch leaves the
  Spark log behind; :meth:`SparkSinkLog.reconcile`, run whenever the
  committer starts, appends one batch per commit-log entry that Spark does
  not list yet, in commit order.
* **The directory exists before any data file.** ``FileStreamSource``
  decides once, on its first non-empty listing, whether a directory has a
  ``_spark_metadata``; the writers create it before their first file, so a
  streaming reader can never fall back to listing the directory.
* **Truncation.** Restoring an older checkpoint or savepoint removes the
  commit-log entries above it (their output is produced again, in other
  files). The Spark log follows: ``reconcile`` deletes, newest first, every
  batch from the first one listing a file the commit log no longer has, then
  appends what the commit log has beyond that point. Spark's format has no
  retraction (its "delete" action is gone since Spark 3.1), so rewriting the
  tail of the log is the only way a *later* reader gets exactly-once output.
  A reader that read before the restore has seen rows that will be produced
  again -- exactly like a reader of the commit log itself, and like a Flink
  file sink restored from an old savepoint (whose committed files stay): a
  Structured Streaming query that already consumed those files keeps them
  (its source remembers files by path) and will also see their replacement.
  Restoring an older snapshot into a directory that live readers follow is a
  reprocessing operation; point it at a new directory when that matters.

Only one job may write a sink directory at a time (as with Spark's sink).

Example:

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> out = tempfile.mkdtemp()
    >>> log = SparkSinkLog.of(out)
    >>> log.ensure_dir()
    >>> pq.write_table(pa.table({"x": [1, 2]}), f"{out}/1-0-0-a.parquet")
    >>> log.append([{"path": "1-0-0-a.parquet", "bytes": 0}])
    0
    >>> log.append([{"path": "1-0-0-a.parquet", "bytes": 0}])   # listed already: no batch
    >>> [f["path"].rsplit("/", 1)[1] for f in log.files()]
    ['1-0-0-a.parquet']
"""

from __future__ import annotations

import json
import os
import posixpath
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from raystream.checkpoint.storage import fsync_dir, publish_new_file
from raystream.spark.commit_log import Location, LogEntry

__all__ = ["SPARK_LOG_DIR", "SparkSinkLog", "DEFAULT_COMPACT_INTERVAL"]

SPARK_LOG_DIR = "_spark_metadata"
VERSION_LINE = "v1"
COMPACT_SUFFIX = ".compact"
# spark.sql.streaming.fileSink.log.compactInterval's default (Spark 2.x-3.5).
DEFAULT_COMPACT_INTERVAL = 10
# What Hadoop's local filesystem reports; only used by Spark to plan splits.
BLOCK_SIZE = 32 * 1024 * 1024


def spark_base_uri(path: str) -> str:
    """The sink's root as a URI Hadoop parses (``file:///...`` for a local path)."""
    if "://" in path:
        return path.rstrip("/")
    return "file://" + _quote(os.path.abspath(os.path.expanduser(path)))


def spark_base_path(path: str) -> str:
    """The sink's root as a Hadoop path string (not %-escaped: ``new Path(String)`` escapes)."""
    if "://" in path:
        return path.rstrip("/")
    return "file://" + os.path.abspath(os.path.expanduser(path))


def _quote(path: str) -> str:
    # The characters java.net.URI leaves unescaped in a path ("legal" ones): Hadoop's
    # Path.toUri prints the same, so Spark's own sink would write the same string.
    return urllib.parse.quote(path, safe="/@!~*'(),;:$&+=")


def compact_interval_of(compact_ids: list[int], default: int = DEFAULT_COMPACT_INTERVAL) -> int:
    """The interval Spark's ``CompactibleFileStreamLog`` derives from the ``.compact`` ids."""
    ids = sorted(compact_ids, reverse=True)
    if len(ids) >= 2:
        return ids[0] - ids[1]
    if len(ids) == 1:
        n = ids[0] + 1
        if n <= default:
            return n
        if default < n // 2:
            return next(i for i in [*range(default, n // 2 + 1), n] if n % i == 0)
        return n
    return default


@dataclass
class SparkSinkLog:
    """``<root>/_spark_metadata`` of one Parquet sink (see the module doc)."""

    loc: Location
    base_uri: str
    # (latest batch id, what Spark lists at it): a long job's appends do not read the whole
    # log again each time; invalid once anyone else changed the log (a newer latest batch)
    _view: tuple[int, list[dict]] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, path: str) -> "SparkSinkLog":
        return cls(Location.of(path), spark_base_uri(path))

    @property
    def directory(self) -> str:
        return self.loc.join(SPARK_LOG_DIR)

    def ensure_dir(self) -> None:
        """Create the log directory (before any data file: see the module doc)."""
        if self.loc.is_local:
            created = not os.path.isdir(self.directory)
            os.makedirs(self.directory, exist_ok=True)
            if created:
                fsync_dir(self.loc.root)
        else:
            self.loc.filesystem.create_dir(self.directory, recursive=True)

    def uri(self, relative: str) -> str:
        return f"{self.base_uri}/{_quote(relative)}"

    # -- reading ---------------------------------------------------------------------------

    def batches(self) -> dict[int, str]:
        """Batch id -> file name of every batch file."""
        infos = self.loc.filesystem.get_file_info(
            pafs.FileSelector(self.directory, allow_not_found=True))
        found = {}
        for info in infos:
            name = info.base_name
            digits = name[:-len(COMPACT_SUFFIX)] if name.endswith(COMPACT_SUFFIX) else name
            if info.type == pafs.FileType.File and digits.isdigit():
                found[int(digits)] = name
        return found

    def _read(self, name: str) -> list[dict]:
        with self.loc.filesystem.open_input_stream(posixpath.join(self.directory, name),
                                                   compression=None) as f:
            lines = f.read().decode("utf-8").split("\n")
        if lines[0] != VERSION_LINE:
            raise ValueError(f"{posixpath.join(self.directory, name)}: unsupported Spark "
                             f"file-sink log version {lines[0][:20]!r} (expected {VERSION_LINE!r})")
        return [json.loads(line) for line in lines[1:] if line]

    def _interval(self, batches: dict[int, str]) -> int:
        return compact_interval_of([i for i, n in batches.items() if n.endswith(COMPACT_SUFFIX)])

    def _view_at(self, batch_id: int, batches: dict[int, str], interval: int) -> list[dict]:
        """Every file Spark lists at ``batch_id`` (its ``allFiles``)."""
        if self._view is not None and self._view[0] == batch_id:
            return list(self._view[1])
        start = max(0, (batch_id + 1) // interval * interval - 1)
        missing = [i for i in range(start, batch_id + 1) if i not in batches]
        if missing:
            raise ValueError(f"{self.directory}: batches {missing} are missing (compact "
                             f"interval {interval}): Spark could not read this log either")
        return [f for i in range(start, batch_id + 1) for f in self._read(batches[i])]

    def files(self) -> list[dict]:
        """What a Spark reader lists now: the records of the latest batch's view."""
        batches = self.batches()
        if not batches:
            return []
        return self._view_at(max(batches), batches, self._interval(batches))

    # -- writing ---------------------------------------------------------------------------

    def _records(self, files: list[dict]) -> list[dict]:
        fs = self.loc.filesystem
        infos = fs.get_file_info([self.loc.join(f["path"]) for f in files])
        records = []
        for f, info in zip(files, infos):
            if info.type != pafs.FileType.File:
                raise FileNotFoundError(f"committed data file {info.path} is missing")
            records.append({"path": self.uri(f["path"]), "size": info.size, "isDir": False,
                            "modificationTime": (info.mtime_ns or time.time_ns()) // 1_000_000,
                            "blockReplication": 1, "blockSize": BLOCK_SIZE, "action": "add"})
        return records

    def _publish(self, batch_id: int, interval: int, batches: dict[int, str],
                 records: list[dict]) -> int:
        compaction = (batch_id + 1) % interval == 0
        view = (self._view_at(batch_id - 1, batches, interval) if batch_id > 0 else []) + records
        if compaction:
            records = view
        name = f"{batch_id}{COMPACT_SUFFIX}" if compaction else str(batch_id)
        body = "\n".join([VERSION_LINE, *(json.dumps(r, separators=(",", ":"))
                                          for r in records)]).encode("utf-8")
        if not publish_new_file(self.loc.filesystem, self.loc.is_local, self.directory, name,
                                body, temp_name=f".{name}.tmp-{uuid.uuid4().hex}"):
            raise RuntimeError(f"Spark file-sink log batch {batch_id} of {self.loc.root} was "
                               f"written by someone else: only one job may write a sink "
                               f"directory at a time")
        batches[batch_id] = name
        self._view = (batch_id, view)
        return batch_id

    def append(self, files: list[dict]) -> int | None:
        """Add one batch with those of ``files`` (commit-log file records) Spark does not
        list yet; returns its id, or None when there was nothing to add."""
        batches = self.batches()
        interval = self._interval(batches)
        listed = ({r["path"] for r in self._view_at(max(batches), batches, interval)}
                  if batches else set())
        new = [f for f in files if self.uri(f["path"]) not in listed]
        if not new:
            return None
        return self._publish(max(batches, default=-1) + 1, interval, batches, self._records(new))

    def reconcile(self, entries: list[LogEntry]) -> list[int]:
        """Make Spark list exactly the files of ``entries`` (the commit log, in commit order).

        Batches from the first one that lists a file no entry has are deleted,
        newest first; then one batch is appended per entry with files Spark
        does not list yet. Returns the ids of the deleted batches.
        """
        self.ensure_dir()
        committed = {self.uri(f["path"]) for e in entries for f in e.files}
        batches = self.batches()
        interval = self._interval(batches)
        dropped = self._truncate_to(committed, batches, interval)
        interval = self._interval(batches)  # a deleted .compact may change Spark's derivation
        listed = ({r["path"] for r in self._view_at(max(batches), batches, interval)}
                  if batches else set())
        for entry in entries:
            new = [f for f in entry.files if self.uri(f["path"]) not in listed]
            if new:
                self._publish(max(batches, default=-1) + 1, interval, batches, self._records(new))
                listed.update(self.uri(f["path"]) for f in new)
        return dropped

    def _truncate_to(self, committed: set[str], batches: dict[int, str],
                     interval: int) -> list[int]:
        """Delete the batches from the first one whose view leaves ``committed``."""
        if not batches:
            return []
        ids = sorted(batches)
        latest = ids[-1]
        if all(r["path"] in committed for r in self._view_at(latest, batches, interval)):
            return []
        # The newest compaction whose whole list is still committed (or none), then its deltas.
        first_bad = 0
        compactions = sorted((i for i in ids if batches[i].endswith(COMPACT_SUFFIX)), reverse=True)
        for c in compactions:
            if all(r["path"] in committed for r in self._read(batches[c])):
                first_bad = c + 1
                break
        while first_bad in batches and all(r["path"] in committed
                                          for r in self._read(batches[first_bad])):
            first_bad += 1
        dropped = [i for i in sorted(batches, reverse=True) if i >= first_bad]
        self._view = None
        for batch_id in dropped:  # newest first: the log stays a prefix if this is interrupted
            try:
                self.loc.filesystem.delete_file(posixpath.join(self.directory, batches[batch_id]))
            except FileNotFoundError:
                pass
            del batches[batch_id]
        if self.loc.is_local:
            fsync_dir(self.directory)
        return sorted(dropped)
