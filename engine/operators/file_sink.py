"""Exactly-once Parquet (or Avro) output on the Sink V2 API (:mod:`~raystream.engine.operators.two_phase`).

``stream.sink_to_parquet(path)`` is ``sink_exactly_once(ParquetWriter, ParquetCommitter)``;
``stream.sink_to_avro(path, schema)`` is the same with Avro container files
(``.avro``, fastavro, deflate by default) of the given record schema in place of
Parquet files:

* :class:`ParquetWriter` (at the stream's parallelism) writes incoming
  batches to Parquet files under ``path`` (a local directory or a
  ``pyarrow.fs`` URI) with final, unique names
  ``<checkpoint>-<subtask>-<attempt>-<uuid>.parquet`` — ``checkpoint`` being
  the next checkpoint the data belongs to — in hive-style ``col=value/``
  directories when ``partition_by`` is given, rolling to a new file after
  ``max_rows_per_file`` rows or about ``max_bytes_per_file`` bytes.
  Timestamps are written as microseconds (Spark 3.5 rejects nanoseconds).
  Before every barrier it closes its open files, makes them durable
  (``fsync`` of file and directories on local disk) and hands over one
  committable per file: path, rows, bytes, checkpoint, subtask, attempt,
  partition. A file still open when an attempt fails is never committed.
* :class:`ParquetCommitter` commits by writing ONE entry
  ``(incarnation, checkpoint id)`` to the commit log (see
  :mod:`raystream.spark.commit_log`); on restore it removes its entries
  above the restored checkpoint. Readers see committed files only:
  ``rs.spark.read_committed(path)``, ``rs.spark.read(spark, path)``.
* Spark's own file-sink log ``<path>/_spark_metadata`` mirrors the commit
  log (:mod:`raystream.spark.spark_log`): the writers create it before their
  first file, the committer appends one Spark batch per commit and repairs
  or rolls it back when it starts, so a plain ``spark.read.parquet(path)`` or
  ``spark.readStream.parquet(path)`` sees committed files only too.

Files left by failed attempts or aborted checkpoints stay on disk, unlisted;
compaction and clean-up of such files are for later.
"""

from __future__ import annotations

import enum
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from raystream.checkpoint.storage import fsync_dir
from raystream.engine.formats import Avro, FormatError, Json, lines_buffer
from raystream.engine.sink_handle import SinkHandle
from raystream.engine.operators.two_phase import Committer, SinkContext, SinkWriter
from raystream.spark import commit_log
from raystream.spark.commit_log import Location
from raystream.spark.spark_log import SPARK_LOG_DIR, SparkSinkLog

DEFAULT_MAX_BYTES_PER_FILE = 128 * 1024 * 1024
# Batches are buffered into row groups of about this size before they are encoded.
ROW_GROUP_ROWS = 128 * 1024
ROW_GROUP_BYTES = 16 * 1024 * 1024



class FileFormat(enum.Enum):
    """What the files are; each is committed alike (module doc)."""

    PARQUET = ".parquet"
    AVRO = ".avro"  # container files (sink_to_avro)
    CSV = ".csv"  # without a header (SQL's filesystem connector, as Flink's csv)
    JSON = ".json"  # JSON lines (SQL's filesystem connector, as Flink's json)


@dataclass(frozen=True)
class ParquetSinkConfig:
    path: str
    partition_by: tuple[str, ...] = ()
    max_rows_per_file: int | None = None
    max_bytes_per_file: int | None = DEFAULT_MAX_BYTES_PER_FILE
    compression: str = "snappy"
    # Avro container files of this schema instead of Parquet (sink_to_avro), with this codec
    avro: Avro | None = None
    avro_codec: str = "deflate"
    format: FileFormat = FileFormat.PARQUET  # AVRO when ``avro`` is given
    csv_delimiter: str = ","

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError("sink_to_parquet: path must be a non-empty string")
        if self.avro is not None:
            object.__setattr__(self, "format", FileFormat.AVRO)
        elif self.format is FileFormat.AVRO:
            raise ValueError("an Avro file sink needs its schema (sink_to_avro)")
        if self.avro is not None and self.avro_codec not in ("null", "deflate"):
            raise ValueError(f"sink_to_avro: codec must be 'deflate' or 'null' (the codecs "
                             f"fastavro writes without extras), not {self.avro_codec!r}")
        for what, value in (("max_rows_per_file", self.max_rows_per_file),
                            ("max_bytes_per_file", self.max_bytes_per_file)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"sink_to_parquet: {what} must be a positive int or None")
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ValueError("sink_to_parquet: partition_by names a column twice")

    @property
    def extension(self) -> str:
        return self.format.value

    @classmethod
    def of(cls, path: str, partition_by: str | list[str] | tuple[str, ...] | None,
           max_rows_per_file: int | None, max_bytes_per_file: int | None, *,
           avro: Avro | None = None, avro_codec: str = "deflate",
           format: FileFormat = FileFormat.PARQUET,
           csv_delimiter: str = ",") -> "ParquetSinkConfig":
        if partition_by is None:
            columns: tuple[str, ...] = ()
        elif isinstance(partition_by, str):
            columns = (partition_by,)
        else:
            columns = tuple(partition_by)
        if isinstance(path, str) and path and "://" not in path:
            path = os.path.abspath(os.path.expanduser(path))  # workers may run elsewhere
        return cls(path, columns, max_rows_per_file, max_bytes_per_file, avro=avro,
                   avro_codec=avro_codec, format=format, csv_delimiter=csv_delimiter)


class ParquetSinkHandle(SinkHandle):
    """Names a Parquet (or Avro) file sink; reads what it committed."""

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
    """One Parquet file being written: batches are buffered into row groups. Its
    subclasses write the other formats with the same buffering."""

    def __init__(self, loc: Location, relative: str, schema: pa.Schema, checkpoint: int,
                 partition: list, partition_schema: str | None,
                 config: ParquetSinkConfig) -> None:
        self.relative, self.full = relative, loc.join(relative)
        self.schema, self.checkpoint = schema, checkpoint
        self.partition, self.partition_schema = partition, partition_schema
        self.stream = loc.filesystem.open_output_stream(self.full, compression=None)
        self.writer: Any = self._writer(config)
        self.rows = 0
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_rows = 0
        self.buffered_bytes = 0

    def _writer(self, config: ParquetSinkConfig) -> Any:
        return pq.ParquetWriter(self.stream, self.schema, compression=config.compression,
                                coerce_timestamps="us", allow_truncated_timestamps=True)

    def add(self, batch: pa.RecordBatch) -> None:
        self.buffered.append(batch)
        self.rows += batch.num_rows
        self.buffered_rows += batch.num_rows
        self.buffered_bytes += batch.nbytes
        if self.buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.buffered:
            self.write(pa.Table.from_batches(self.buffered, self.schema))
            self.buffered, self.buffered_rows, self.buffered_bytes = [], 0, 0

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)

    def size_estimate(self) -> int:
        return self.stream.tell() + self.buffered_bytes

    def _finish(self) -> None:
        """End the file's content (a Parquet footer), not the stream it is written to."""
        self.writer.close()

    def close(self) -> int:
        """Write what is buffered, end the file and close it; returns the file's size."""
        self.flush()
        self._finish()
        size = self.stream.tell()
        self.stream.close()
        return size

    def abandon(self, loc: Location) -> None:
        """Close and delete: the file was never emitted, so it can never be committed."""
        for step in (self._finish, self.stream.close,
                     lambda: loc.filesystem.delete_file(self.full)):
            try:
                step()
            except Exception:
                pass

    def committable(self) -> dict:
        """What a reader of the committed file needs besides its path (none: Parquet and
        Avro files carry their schema)."""
        return {}


class _OpenAvroFile(_OpenFile):
    """One Avro container file being written (fastavro): each flush appends the
    buffered rows as Avro blocks."""

    def _writer(self, config: ParquetSinkConfig) -> Any:
        from fastavro.write import Writer

        assert config.avro is not None
        self.avro = config.avro
        return Writer(self.stream, config.avro.parsed, codec=config.avro_codec)

    def write(self, table: pa.Table) -> None:
        write = self.writer.write
        for batch in table.to_batches():
            for i, record in enumerate(self.avro.records(batch, where="sink_to_avro")):
                try:
                    write(record)  # fastavro writes a record a call
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    raise FormatError(f"sink_to_avro: a row does not fit the Avro schema "
                                      f"{self.avro.parsed['name']}: {type(exc).__name__}: "
                                      f"{exc} (row: {record})") from None
        self.writer.flush()

    def _finish(self) -> None:
        self.writer.flush()


class _OpenCsvFile(_OpenFile):
    """One CSV file being written, without a header (as Flink's ``csv`` format writes):
    its committable carries the columns and their types, to read it back."""

    def _writer(self, config: ParquetSinkConfig) -> Any:
        self.delimiter = config.csv_delimiter
        return pacsv.CSVWriter(self.stream, self.schema, write_options=pacsv.WriteOptions(
            include_header=False, delimiter=config.csv_delimiter))

    def committable(self) -> dict:
        return {"schema": commit_log.encode_schema(self.schema), "delimiter": self.delimiter}


class _OpenJsonFile(_OpenFile):
    """One JSON-lines file being written (an object per row, :mod:`raystream.engine.json_lines`),
    timestamps as SQL's ``yyyy-MM-dd HH:mm:ss.SSS`` text (as Flink's ``json`` format writes
    them, and as pyarrow's JSON reader reads them back)."""

    def _writer(self, config: ParquetSinkConfig) -> Any:
        return None  # (it writes to the stream itself)

    def _finish(self) -> None:
        pass

    def write(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.stream.write(lines_buffer(_JSON.encode(batch, where="filesystem sink")))

    def committable(self) -> dict:
        return {"schema": commit_log.encode_schema(self.schema)}


_JSON = Json(timestamps_as_text=True)
_OPEN_FILE: dict[FileFormat, type[_OpenFile]] = {
    FileFormat.PARQUET: _OpenFile, FileFormat.AVRO: _OpenAvroFile,
    FileFormat.CSV: _OpenCsvFile, FileFormat.JSON: _OpenJsonFile}


class ParquetWriter(SinkWriter):
    """Writes Parquet files; hands over one committable per closed file (see module doc)."""

    def __init__(self, config: ParquetSinkConfig) -> None:
        self.config = config
        self.files: dict[tuple, _OpenFile] = {}
        self.closed: list[dict] = []  # committables of closed files, not handed over yet
        self.loc: Location | None = None
        self._dirs: set[str] = set()  # directories known to exist
        self._unsynced_dirs: set[str] = set()  # local: directories with new entries

    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        self.loc = Location.of(self.config.path)
        self._ensure_dir(self.loc.root)
        # Before any data file: Spark's file stream source decides once whether the
        # directory has a log to follow (see raystream.spark.spark_log).
        self._ensure_dir(self.loc.join(SPARK_LOG_DIR))

    def _location(self) -> Location:
        if self.loc is None:
            raise RuntimeError(f"Parquet sink at {self.config.path}: used before open()")
        return self.loc

    # -- data -----------------------------------------------------------------------------
    def write(self, batch: pa.RecordBatch) -> None:
        for values, partition_schema, part in self._split(batch):
            self._append(values, partition_schema, part)

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
        runtime, checkpoint = self.ctx.runtime, self.ctx.next_checkpoint_id
        name = (f"{checkpoint}-{runtime.subtask_index}-{runtime.attempt}-{uuid.uuid4().hex}"
                f"{self.config.extension}")
        directory = commit_log.partition_dir(self.config.partition_by, values) if values else ""
        if directory:
            self._ensure_dir(self._location().join(directory))
        relative = posixpath.join(directory, name) if directory else name
        partition = [[c, v] for c, v in zip(self.config.partition_by, values)]
        encoded = commit_log.encode_schema(partition_schema) if partition_schema else None
        f = _OPEN_FILE[self.config.format](self._location(), relative, schema, checkpoint,
                                           partition, encoded, self.config)
        self.files[values] = f
        return f

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._dirs:
            return
        loc = self._location()
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
        if self._location().is_local:
            fd = os.open(f.full, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._unsynced_dirs.add(posixpath.dirname(f.full))
        runtime = self.ctx.runtime
        committable = {"path": f.relative, "rows": f.rows, "bytes": size,
                       "checkpoint": f.checkpoint, "subtask": runtime.subtask_index,
                       "attempt": runtime.attempt, **f.committable()}
        if f.partition:
            committable["partition"] = f.partition
            committable["partition_schema"] = f.partition_schema
        self.closed.append(committable)

    def prepare_commit(self, checkpoint_id: int | None) -> list[dict]:
        """Close every open file and make it durable; one committable per file."""
        for values in list(self.files):
            self._close(values)
        if self.loc is not None and self.loc.is_local:
            for d in sorted(self._unsynced_dirs, key=len, reverse=True):  # deepest first
                fsync_dir(d)
            self._unsynced_dirs.clear()
        closed, self.closed = self.closed, []
        return closed

    def abort(self) -> None:
        for f in self.files.values():  # a failure: these files are never committed
            f.abandon(self._location())
        self.files.clear()


class ParquetCommitter(Committer):
    """Lists the writers' files in the commit log, one entry per checkpoint (module doc)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        self.loc = Location.of(self.path)
        self.spark_log = SparkSinkLog.of(self.path)
        # Catch up with commits a crash kept out of Spark's log.
        self.spark_log.reconcile(commit_log.list_entries(self.loc))

    def commit(self, incarnation: str, checkpoint_id: int, committables: list[dict]) -> None:
        written = commit_log.write_entry(self.loc, incarnation, checkpoint_id, committables,
                                         before_publish=lambda: self.ctx.failpoint("mid_commit"))
        if written:
            self.spark_log.append(committables)  # one Spark batch for this checkpoint
        else:  # committed before: Spark's log follows the commit log, not these committables
            self.spark_log.reconcile(commit_log.list_entries(self.loc))

    def committed_ids(self, incarnation: str) -> set[str]:
        return {f["path"] for e in commit_log.list_entries(self.loc, incarnation)
                for f in e.files}

    def truncate(self, incarnation: str, above: int) -> list[int]:
        dropped = commit_log.truncate_entries(self.loc, incarnation, above=above)
        if dropped:  # roll Spark's log back too (see raystream.spark.spark_log)
            self.spark_log.reconcile(commit_log.list_entries(self.loc))
        return dropped

    def committable_id(self, committable: dict) -> str:
        return committable["path"]
