"""Exactly-once Parquet sink in Flink's Sink V2 shape: a writer and one committer.

``stream.sink_to_parquet(path)`` adds two operators:

* :class:`ParquetWriterOperator` (a ``SinkWriter``, at the stream's
  parallelism) writes incoming batches to Parquet files under ``path`` (a
  local directory or a ``pyarrow.fs`` URI) with final, unique names
  ``<checkpoint>-<subtask>-<attempt>-<uuid>.parquet`` — ``checkpoint`` being
  the next checkpoint the data belongs to — in hive-style ``col=value/``
  directories when ``partition_by`` is given, rolling to a new file after
  ``max_rows_per_file`` rows or about ``max_bytes_per_file`` bytes.
  Timestamps are written as microseconds (Spark 3.5 rejects nanoseconds).
  In ``prepare_snapshot_pre_barrier(n)`` it closes its open files, makes them
  durable (``fsync`` of file and directories on local disk) and *emits* their
  committables — one row per file: path, rows, bytes, checkpoint, subtask,
  attempt, partition — so they travel before barrier ``n``. It keeps no
  state: a file still open when an attempt fails is never committed.
* :class:`ParquetCommitterOperator` (a ``Committer``, parallelism 1, fed by
  every writer) keeps the committables it received; its checkpointed
  operator state (JSON) holds those not committed yet, grouped by the
  checkpoint whose snapshot first held them. On ``notify_checkpoint_complete(n)``
  it commits every pending committable of checkpoints ``<= n`` by writing ONE
  entry ``(incarnation, n)`` to the commit log (see
  :mod:`raystream.spark.commit_log`). Restored with checkpoint ``k``, it
  first deletes log entries of its incarnation above ``k`` (output that will
  be produced again), then commits its restored committables again under
  ``k`` — skipping files already in the log — which is how a checkpoint that
  completed without its notification arriving gets committed. A commit is
  idempotent per (incarnation, checkpoint id).

Readers see committed files only: ``rs.spark.read_committed(path)``.

Without checkpoints (``ctx.checkpointing`` false), writers close their files
and emit committables at ``finish()`` (end of input), and the committer commits
them all as one entry in its own ``finish()`` — so the output of a bounded job
appears when the job finishes, and a job that fails commits nothing.

Files left by failed attempts or aborted checkpoints stay on disk, unlisted;
compaction and clean-up of such files are for later.

The incarnation (``<job name>-<12 hex>``) is created by the committer on a
fresh start and kept in its state, so it is the same across failovers and
restores of a run and differs between runs.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raystream.checkpoint.storage import _fsync_dir
from raystream.engine.datastream import SinkHandle
from raystream.engine.operators.base import Operator, OperatorSnapshot, RestoredState
from raystream.engine.operators.sinks import SinkOperator
from raystream.spark import commit_log
from raystream.spark.commit_log import Location

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES_PER_FILE = 128 * 1024 * 1024
# Batches are buffered into row groups of about this size before they are encoded.
ROW_GROUP_ROWS = 128 * 1024
ROW_GROUP_BYTES = 16 * 1024 * 1024
STATE_FORMAT = 1

COMMITTABLE_SCHEMA = pa.schema([
    ("checkpoint", pa.int64()), ("subtask", pa.int32()), ("attempt", pa.int32()),
    ("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
    ("partition", pa.string()),  # JSON [[column, value-as-text or null], ...] or null
    ("partition_schema", pa.string()),  # base64 Arrow schema of the partition columns, or null
])


@dataclass(frozen=True)
class ParquetSinkConfig:
    path: str
    partition_by: tuple[str, ...] = ()
    max_rows_per_file: int | None = None
    max_bytes_per_file: int | None = DEFAULT_MAX_BYTES_PER_FILE
    compression: str = "snappy"

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError("sink_to_parquet: path must be a non-empty string")
        for what, value in (("max_rows_per_file", self.max_rows_per_file),
                            ("max_bytes_per_file", self.max_bytes_per_file)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"sink_to_parquet: {what} must be a positive int or None")
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError("sink_to_parquet: partition_by names a column twice")

    @classmethod
    def of(cls, path: str, partition_by: str | list[str] | tuple[str, ...] | None,
           max_rows_per_file: int | None, max_bytes_per_file: int | None) -> "ParquetSinkConfig":
        if partition_by is None:
            columns: tuple[str, ...] = ()
        elif isinstance(partition_by, str):
            columns = (partition_by,)
        else:
            columns = tuple(partition_by)
        if isinstance(path, str) and path and "://" not in path:
            path = os.path.abspath(os.path.expanduser(path))  # workers may run elsewhere
        return cls(path, columns, max_rows_per_file, max_bytes_per_file)


class ParquetSinkHandle(SinkHandle):
    """Names a Parquet sink; reads what it committed."""

    def __init__(self, transformation_id: int, name: str, path: str) -> None:
        super().__init__(transformation_id, name)
        self.path = path

    def committed_files(self) -> list[str]:
        return commit_log.committed_files(self.path)

    def read(self) -> pa.Table:
        return commit_log.read_committed(self.path)

    def __repr__(self) -> str:
        return f"ParquetSinkHandle({self.name!r}, {self.path!r})"


# -- the writer ---------------------------------------------------------------------------


class _OpenFile:
    """One Parquet file being written: batches are buffered into row groups."""

    def __init__(self, loc: Location, relative: str, schema: pa.Schema, checkpoint: int,
                 partition: list, partition_schema: str | None, compression: str) -> None:
        self.relative, self.full = relative, loc.join(relative)
        self.schema, self.checkpoint = schema, checkpoint
        self.partition, self.partition_schema = partition, partition_schema
        self.stream = loc.filesystem.open_output_stream(self.full, compression=None)
        self.writer = pq.ParquetWriter(self.stream, schema, compression=compression,
                                       coerce_timestamps="us", allow_truncated_timestamps=True)
        self.rows = 0
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_rows = 0
        self.buffered_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.buffered.append(batch)
        self.rows += batch.num_rows
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffered:
            self.writer.write_table(pa.Table.from_batches(self.buffered, self.schema))
            self.buffered, self.buffered_rows, self.buffered_bytes = [], 0, 0

    def size_estimate(self) -> int:
        return self.stream.tell() + self.buffered_bytes

    def close(self) -> int:
        """Write the footer and close; returns the file's size."""
        self.flush()
        self.writer.close()
        size = self.stream.tell()
        self.stream.close()
        return size

    def abandon(self, loc: Location) -> None:
        """Close and delete: the file was never emitted, so it can never be committed."""
        for step in (self.writer.close, self.stream.close,
                     lambda: loc.filesystem.delete_file(self.full)):
            try:
                step()
            except Exception:
                pass


class ParquetWriterOperator(Operator):
    """Writes Parquet files; emits their committables before each barrier (see module doc)."""

    def __init__(self, name: str, config: ParquetSinkConfig) -> None:
        super().__init__(name)
        self.config = config
        self.files: dict[tuple, _OpenFile] = {}
        self.closed: list[dict] = []  # committables of closed files, not emitted yet
        self.last_checkpoint = 0
        self.loc: Location | None = None
        self._dirs: set[str] = set()  # directories known to exist
        self._unsynced_dirs: set[str] = set()  # local: directories with new entries

    def initialize_state(self, restored: RestoredState | None) -> None:
        self.last_checkpoint = restored.checkpoint_id if restored is not None else 0

    def open(self) -> None:
        self.loc = Location.of(self.config.path)
        self._ensure_dir(self.loc.root)

    # -- data -----------------------------------------------------------------------------
    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        if batch.num_rows == 0:
            return
        for values, partition_schema, part in self._split(batch):
            self._append(values, partition_schema, part)

    def process_watermark(self, watermark: int) -> None:
        pass  # the committer has no use for event time

    def _split(self, batch: pa.RecordBatch):
        """(partition values as text, partition schema, rows without the partition columns)."""
        columns = self.config.partition_by
        if not columns:
            yield (), None, batch
            return
        missing = [c for c in columns if c not in batch.schema.names]
        if missing:
            raise KeyError(f"partition_by column(s) {missing} not in the stream's columns "
                           f"{batch.schema.names}")
        partition_schema = pa.schema([batch.schema.field(c) for c in columns])
        data = batch.select([c for c in batch.schema.names if c not in columns])
        keys = pa.table([batch.column(c) for c in columns] +
                        [pa.array(np.arange(batch.num_rows, dtype=np.int64))],
                        names=[*columns, "__rs_row"])
        groups = keys.group_by(list(columns), use_threads=False).aggregate([("__rs_row", "list")])
        texts = [groups.column(c).cast(pa.string()).to_pylist() for c in columns]
        rows = groups.column("__rs_row_list")
        for i in range(groups.num_rows):
            values = tuple(text[i] for text in texts)
            part = data if groups.num_rows == 1 else data.take(rows[i].values)
            yield values, partition_schema, part

    def _append(self, values: tuple, partition_schema: pa.Schema | None,
                batch: pa.RecordBatch) -> None:
        config = self.config
        f = self.files.get(values)
        if f is not None and not f.schema.equals(batch.schema, check_metadata=False):
            self._close(values)  # a new schema starts a new file
        offset = 0
        while offset < batch.num_rows:
            f = self.files.get(values) or self._open(values, partition_schema, batch.schema)
            take = batch.num_rows - offset
            if config.max_rows_per_file is not None:
                take = min(take, config.max_rows_per_file - f.rows)
            f.add(batch.slice(offset, take) if take < batch.num_rows else batch)
            offset += take
            if ((config.max_rows_per_file is not None and f.rows >= config.max_rows_per_file)
                    or (config.max_bytes_per_file is not None
                        and f.size_estimate() >= config.max_bytes_per_file)):
                self._close(values)

    def _open(self, values: tuple, partition_schema: pa.Schema | None,
              schema: pa.Schema) -> _OpenFile:
        ctx, checkpoint = self.ctx, self.last_checkpoint + 1
        name = f"{checkpoint}-{ctx.subtask_index}-{ctx.attempt}-{uuid.uuid4().hex}.parquet"
        directory = commit_log.partition_dir(self.config.partition_by, values) if values else ""
        if directory:
            self._ensure_dir(self.loc.join(directory))
        relative = posixpath.join(directory, name) if directory else name
        partition = [[c, v] for c, v in zip(self.config.partition_by, values)]
        f = _OpenFile(self.loc, relative, schema, checkpoint, partition,
                      commit_log.encode_schema(partition_schema) if partition_schema else None,
                      self.config.compression)
        self.files[values] = f
        return f

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._dirs:
            return
        loc = self.loc
        if loc.is_local:
            # Every directory created on the way must be fsync-ed in its parent.
            d = directory
            while not os.path.isdir(d):
                self._unsynced_dirs.add(posixpath.dirname(d))
                d = posixpath.dirname(d)
            os.makedirs(directory, exist_ok=True)
        else:
            loc.filesystem.create_dir(directory, recursive=True)
        self._dirs.add(directory)

    def _close(self, values: tuple) -> None:
        f = self.files.pop(values)
        size = f.close()
        if self.loc.is_local:
            fd = os.open(f.full, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._unsynced_dirs.add(posixpath.dirname(f.full))
        self.closed.append({
            "checkpoint": f.checkpoint, "subtask": self.ctx.subtask_index,
            "attempt": self.ctx.attempt, "path": f.relative, "rows": f.rows, "bytes": size,
            "partition": json.dumps(f.partition) if f.partition else None,
            "partition_schema": f.partition_schema})

    def _close_all_and_emit(self) -> None:
        for values in list(self.files):
            self._close(values)
        if self.loc is not None and self.loc.is_local:
            for d in sorted(self._unsynced_dirs, key=len, reverse=True):  # deepest first
                _fsync_dir(d)
            self._unsynced_dirs.clear()
        if self.closed:
            batch = pa.RecordBatch.from_pylist(self.closed, schema=COMMITTABLE_SCHEMA)
            self.closed = []
            self.output.emit(batch)

    # -- checkpoints and the end -------------------------------------------------------------
    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self._close_all_and_emit()  # the committables travel before barrier n
        self.last_checkpoint = max(self.last_checkpoint, checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.last_checkpoint = max(self.last_checkpoint, checkpoint_id)

    def finish(self) -> None:
        # End of input: emit while the output channels are still open (the
        # final checkpoint's barrier comes after end-of-input on them).
        self._close_all_and_emit()

    def close(self) -> None:
        for f in self.files.values():  # a failure: these files are never committed
            f.abandon(self.loc)
        self.files.clear()


# -- the committer --------------------------------------------------------------------------


def _committables(batch: pa.RecordBatch) -> list[dict]:
    out = []
    for row in batch.to_pylist():  # one row per file, not per record
        entry = {"path": row["path"], "rows": row["rows"], "bytes": row["bytes"],
                 "checkpoint": row["checkpoint"], "subtask": row["subtask"],
                 "attempt": row["attempt"]}
        if row.get("partition"):
            entry["partition"] = json.loads(row["partition"])
            entry["partition_schema"] = row["partition_schema"]
        out.append(entry)
    return out


class ParquetCommitterOperator(SinkOperator):
    """Commits the writers' files to the commit log when a checkpoint completes (module doc)."""

    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self.path = path
        self.loc: Location | None = None
        self.incarnation: str | None = None
        self.pending: dict[int, list[dict]] = {}  # checkpoint id -> committables
        self.incoming: list[dict] = []  # received since the last snapshot
        self.commits = 0  # entries written by this instance

    def initialize_state(self, restored: RestoredState | None) -> None:
        self.loc = Location.of(self.path)
        states = [json.loads(s) for s in (restored.operator_states if restored else []) if s]
        if not states:
            self.incarnation = commit_log.new_incarnation(self.ctx.job_name)
            return
        for state in states:
            if state.get("format") != STATE_FORMAT:
                raise ValueError(f"unknown Parquet committer state format {state.get('format')!r}")
        self.incarnation = states[0]["incarnation"]
        for state in states:
            for checkpoint_id, files in state["pending"]:
                self.pending.setdefault(int(checkpoint_id), []).extend(files)
        k = restored.checkpoint_id
        dropped = commit_log.truncate_entries(self.loc, self.incarnation, above=k)
        if dropped:
            log.warning("%s: restored checkpoint %d; removed newer commit-log entries %s of %s",
                        self.name, k, dropped, self.incarnation)
        # Committed already (under this or an earlier id): not again.
        done = {f["path"] for e in commit_log.list_entries(self.loc, self.incarnation)
                for f in e.files}
        for checkpoint_id in list(self.pending):
            left = [f for f in self.pending[checkpoint_id] if f["path"] not in done]
            if left:
                self.pending[checkpoint_id] = left
            else:
                del self.pending[checkpoint_id]
        # Checkpoint k completed: what its state holds may be committed now
        # (its notification may never have arrived).
        self._commit_upto(k)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.incoming.extend(_committables(batch))

    def snapshot_state(self, checkpoint_id: int) -> OperatorSnapshot | None:
        if self.incoming:
            self.pending.setdefault(checkpoint_id, []).extend(self.incoming)
            self.incoming = []
        data = json.dumps({"format": STATE_FORMAT, "incarnation": self.incarnation,
                           "pending": [[c, files] for c, files in sorted(self.pending.items())]},
                          sort_keys=True, separators=(",", ":")).encode()
        return OperatorSnapshot(operator_state=lambda: data)  # serialized now: consistent

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit_upto(checkpoint_id)

    def finish(self) -> None:
        if not self.ctx.checkpointing:  # a bounded job without checkpoints commits at its end
            if self.incoming:
                self.pending.setdefault(0, []).extend(self.incoming)
                self.incoming = []
            self._commit_upto(0)

    def _commit_upto(self, checkpoint_id: int) -> None:
        ids = sorted(c for c in self.pending if c <= checkpoint_id)
        if not ids:
            return
        files = [f for c in ids for f in self.pending[c]]
        if commit_log.write_entry(self.loc, self.incarnation, checkpoint_id, files,
                                  before_publish=self._mid_commit):
            self.commits += 1
        for c in ids:
            del self.pending[c]

    def _mid_commit(self) -> None:
        if self.failpoints is not None:
            self.failpoints.hit("mid_commit")
