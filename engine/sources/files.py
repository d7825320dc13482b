"""Parquet, CSV, JSON-lines and Avro files as a split-based source, bounded or continuous.

Paths may be local paths or any ``pyarrow.fs`` URI (``file://``, ``s3://``,
``gs://``, ``hdfs://``). A file is a split; a Parquet file with several row
groups is a split per row group. :class:`FileSplitEnumerator` (in the job
master) lists the directory -- once (bounded: the job ends when every file
that was there is read) or every ``monitor_interval_s`` seconds (continuous:
new files are picked up while the job runs) -- and hands the splits of new
files, in file-name order, to readers that ask. It checkpoints the files it
has seen and the splits not handed out; each reader checkpoints its position
in its splits, so after a failure every row of every file is read exactly
once. Files must appear whole (written elsewhere and moved in, as Spark and
Flink expect); names starting with ``_`` or ``.``, and what is under such
directories, are skipped. Of a directory a raystream file sink writes (it has a
commit log, ``_raystream_log``), only the committed files are read.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from enum import Enum
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raystream.engine.errors import FilePosition, FileReadError, JobSetupError, choice
from raystream.spark import commit_log
from raystream.core.avro import AvroFileError, avro_file_batches, avro_file_schema
from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.sources.split_enumerator import SplitEnumerator, SplitEnumeratorContext

FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".json", ".ndjson"),
           "avro": (".avro",)}  # Avro container files (any codec fastavro reads)

# What pyarrow raises for a file it cannot parse or decode (a corrupt Parquet page is an
# OSError); MemoryError and ArrowMemoryError are not a file's fault.
PARSE_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError)
# The one row describing a split skipped under errors="dead_letter".
DEAD_LETTER_SCHEMA = pa.schema([("path", pa.string()), ("row_group", pa.int64()),
                                ("error", pa.string())])
# A JSON line is located by parsing prefixes of the file (binary search): not for huge files.
LOCATE_JSON_LINE_MAX_BYTES = 256 << 20
# pyarrow's "in row N" counts records within one read block: not a place in the file.
JSON_BLOCK_ROW = re.compile(r" in row \d+$")


@dataclass(frozen=True)
class CsvLayout:
    """How CSV files are laid out: a header line naming the columns (the default), or
    none (``header=False``: the columns are the given schema's, in order, as Flink's
    ``csv`` format writes them), and the field ``delimiter``.

        >>> CsvLayout(header=False, delimiter=";")
        CsvLayout(header=False, delimiter=';')
    """

    header: bool = True
    delimiter: str = ","


class OnError(Enum):
    """What a file source does with a file (or Parquet row group) it cannot read."""

    FAIL = "fail"  # the job fails with a FileReadError naming the file
    DEAD_LETTER = "dead_letter"  # no row of it is read; one row describes it on DEAD_LETTERS

    @classmethod
    def of(cls, value: "OnError | str") -> "OnError":
        return choice(cls, value, "errors")


class Files(Source):
    """Rows of every file of ``format`` under ``path`` (a file, a directory or a URI).

    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> d = tempfile.mkdtemp(); pq.write_table(pa.table({"x": [1, 2, 3]}), os.path.join(d, "a.parquet"))
    >>> src = Files(d, format="parquet"); [s.rsplit("/", 1)[-1] for s in src.splits()]
    ['a.parquet']
    >>> src.reader(src.splits()[0], position=1).next_batch().to_pydict()
    {'x': [2, 3]}

    ``monitor_interval_s`` makes it continuous: the directory is listed again
    at that interval and new files are read as they appear (give ``schema``
    when the first files may not show every column).

    A file that cannot be read fails the job with a :class:`FileReadError`
    naming it (and the row group, CSV row, JSON line or Avro record where known). With
    ``errors="dead_letter"`` such a split is skipped whole instead: it is
    parsed completely before its first row is emitted, and one row (``path``,
    ``row_group``, ``error``) describes it on side output ``DEAD_LETTERS``.
    """

    def __init__(self, path: str, *, format: str = "parquet", batch_size: int = 65536,
                 schema: pa.Schema | None = None,
                 monitor_interval_s: float | None = None,
                 errors: OnError | str = OnError.FAIL, csv: CsvLayout = CsvLayout()) -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {sorted(FORMATS)}, not {format!r}")
        if not csv.header and schema is None:
            raise ValueError("CSV files without a header need the schema of their columns")
        if monitor_interval_s is not None and monitor_interval_s <= 0:
            raise ValueError(f"monitor_interval_s must be > 0, not {monitor_interval_s}")
        self.path = path
        self.format = format
        self.batch_size = batch_size
        self.schema = schema
        self.monitor_interval_s = monitor_interval_s
        self.errors = OnError.of(errors)
        self.csv = csv
        self._files: list[str] | None = None
        # the files' common schema, and the files whose schema could not be read or merged
        self._unified: tuple[pa.Schema | None, dict[str, FileReadError]] | None = None

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        return pafs.FileSystem.from_uri(self.path) if "://" in self.path else (
            pafs.LocalFileSystem(), self.path)

    def preflight(self) -> None:
        """The path exists (a directory that is monitored too: Flink's continuous file
        source fails likewise)."""
        fs, root = self._filesystem()
        try:
            missing = fs.get_file_info(root).type == pafs.FileType.NotFound
        except OSError as exc:
            raise JobSetupError(f"read_files({self.path!r}): {type(exc).__name__}: {exc}") from exc
        if missing:
            raise JobSetupError(f"read_files({self.path!r}): {self.path} does not exist")

    def list_files(self) -> list[str]:
        """The files of ``format`` under ``path`` now, in name order."""
        fs, root = self._filesystem()
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"file source: {self.path} does not exist")
        if info.type == pafs.FileType.File:
            return [root]
        extensions = FORMATS[self.format]
        if fs.get_file_info(posixpath.join(root, commit_log.LOG_DIR)).type == pafs.FileType.Directory:
            # a raystream file sink's directory: its committed files only (the others are
            # a failed attempt's or an aborted checkpoint's, never to be read)
            loc = commit_log.Location.of(self.path)
            return sorted(loc.join(f["path"]) for f in commit_log.committed_file_entries(loc)
                          if f["path"].lower().endswith(extensions))
        selector = pafs.FileSelector(root, recursive=True)
        return sorted(i.path for i in fs.get_file_info(selector)
                      if i.type == pafs.FileType.File and i.path.lower().endswith(extensions)
                      and not any(part.startswith(("_", ".")) for part in
                                  posixpath.relpath(i.path, root).split("/")))

    def splits(self) -> list[str]:
        """The files there were when first asked (what a bounded read reads)."""
        if self._files is None:
            self._files = self.list_files()
        return list(self._files)

    def splits_of(self, path: str) -> list[str | dict]:
        """A file's splits: the file, or each row group of a Parquet file with several."""
        if self.format == "parquet":
            fs, _ = self._filesystem()
            if fs.get_file_info(path).size:
                try:
                    groups = pq.ParquetFile(path, filesystem=fs).num_row_groups
                except PARSE_ERRORS:
                    return [path]  # an unreadable footer: its reader reports it
                if groups > 1:
                    return [{"path": path, "row_group": k} for k in range(groups)]
        return [path]

    def split_id(self, split: str | dict) -> str:
        return split if isinstance(split, str) else f"{split['path']}#{split['row_group']}"

    def create_enumerator(self, context: SplitEnumeratorContext,
                          state: dict | None) -> "FileSplitEnumerator":
        return FileSplitEnumerator(context, self, state)

    def reader(self, split: str | dict, position: int = 0) -> "FileReader":
        return FileReader(self, split, position)

    def unified_schema(self) -> pa.Schema | None:
        """One schema for every file, so all batches agree downstream.

        The given ``schema``, or each non-empty file's schema (CSV and JSON
        inferred from its first block) unified with numeric promotion: a
        column that is whole numbers in one CSV file and decimals in another
        is double everywhere. A file whose schema cannot be read is left out
        (reading it fails); one whose schema does not unify with the files
        before it (in name order) too, and is in :meth:`schema_errors`.
        """
        return self.schema if self.schema is not None else self._unify()[0]

    def schema_errors(self) -> dict[str, FileReadError]:
        """The files left out of :meth:`unified_schema`, with why."""
        return {} if self.schema is not None else self._unify()[1]

    def _unify(self) -> tuple[pa.Schema | None, dict[str, FileReadError]]:
        if self._unified is not None:
            return self._unified
        fs, _ = self._filesystem()
        unified, errors = None, {}
        for path in self.splits():
            if fs.get_file_info(path).size == 0:
                continue
            try:
                schema = self._file_schema(fs, path)
            except PARSE_ERRORS:
                continue  # unreadable: reading it fails the same way, and says where
            try:
                unified = schema if unified is None else pa.unify_schemas(
                    [unified, schema], promote_options="permissive")
            except PARSE_ERRORS as exc:
                errors[path] = FileReadError(
                    path, exc, context="its schema does not unify with the files before it: ")
        self._unified = unified, errors
        return self._unified

    def _file_schema(self, fs: pafs.FileSystem, path: str) -> pa.Schema:
        if self.format == "parquet":
            return pq.ParquetFile(path, filesystem=fs).schema_arrow
        with fs.open_input_stream(path) as stream:
            if self.format == "avro":
                return avro_file_schema(stream)
            if self.format == "csv":
                parse = pacsv.ParseOptions(delimiter=self.csv.delimiter)
                return pacsv.open_csv(stream, parse_options=parse).schema
            return pajson.open_json(stream).schema


class FileSplitEnumerator(SplitEnumerator):
    """Discovers files (once, or every ``monitor_interval_s``) and hands their splits to
    readers that ask, in file-name order; its state is the files it has seen and the
    splits not handed out yet.

    Listing the directory and reading Parquet footers (for the row groups) run on a
    worker thread (``context.call_async``), so a slow file system never stalls the job
    master's event thread; a reader that asks meanwhile waits for the listing.
    """

    def __init__(self, context: SplitEnumeratorContext, source: Files,
                 state: dict | None = None) -> None:
        self.context, self.source = context, source
        self.seen: set[str] = set(state["seen"]) if state else set()
        self.pending: list[str | dict] = list(state["pending"]) if state else []
        self.waiting: list[int] = []  # readers that asked while nothing was pending
        self.bounded = source.monitor_interval_s is None
        # a bounded read restored after its listing: what it had listed is all there is
        self.listed = self.bounded and bool(self.seen)

    def start(self) -> None:
        if not self.listed:
            self._list()

    def _list(self) -> None:
        source, seen = self.source, frozenset(self.seen)

        def new_files() -> list[tuple[str, list[str | dict]]]:  # on a worker thread
            paths = source.splits() if self.bounded else source.list_files()
            return [(path, source.splits_of(path)) for path in paths if path not in seen]
        self.context.call_async(new_files, self._on_listed)

    def _on_listed(self, found: list[tuple[str, list[str | dict]]] | None,
                   error: BaseException | None) -> None:
        if error is not None:
            raise RuntimeError(f"file source: listing {self.source.path} failed: "
                               f"{type(error).__name__}: {error}") from error
        for path, splits in found or []:
            if path not in self.seen:
                self.seen.add(path)
                self.pending.extend(splits)
        self.listed = self.bounded
        while self.waiting and self.pending:
            self.context.assign_split(self.pending.pop(0), self.waiting.pop(0))
        interval = self.source.monitor_interval_s
        if interval is None:  # bounded
            while self.waiting:
                self.context.signal_no_more_splits(self.waiting.pop(0))
        else:
            self.context.call_later(interval, self._list)

    def add_reader(self, subtask: int) -> None:
        pass  # it asks for splits when it needs them

    def handle_split_request(self, subtask: int) -> None:
        if self.pending:
            self.context.assign_split(self.pending.pop(0), subtask)
        elif self.listed:
            self.context.signal_no_more_splits(subtask)
        elif subtask not in self.waiting:
            self.waiting.append(subtask)

    def add_splits_back(self, splits: list[str | dict], subtask: int) -> None:
        self.pending[:0] = splits  # first in line: the reader asks again once registered
        self.waiting = [w for w in self.waiting if w != subtask]  # its failed attempt's ask

    def snapshot_state(self, checkpoint_id: int) -> dict:
        return {"seen": sorted(self.seen), "pending": list(self.pending)}


class FileReader(SplitReader):
    """Reads one file, or one row group of a Parquet file.

    A parse error becomes a :class:`FileReadError` naming the file and where
    in it; under ``errors="dead_letter"`` the split is parsed whole before
    its first row is emitted, so an unreadable one emits no row, only its
    ``dead_letter``, and the same one on every re-read after a failover.
    """

    def __init__(self, source: Files, split: str | dict, position: int) -> None:
        self.source = source
        self.path = split if isinstance(split, str) else split["path"]
        self.row_group: int | None = None if isinstance(split, str) else split["row_group"]
        self.position = position
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._stream = None

    def _open(self) -> Iterator[pa.RecordBatch]:
        # Failing to open (a vanished file, a flaky store) fails the job in any mode: a
        # dead letter must be decided by the file's bytes, the same on every re-read.
        # (Parquet reads lazily: on an object store a failed read of its footer or of a
        # page cannot be told from a corrupt one and counts as unreadable.)
        fs, _ = self.source._filesystem()
        try:
            if fs.get_file_info(self.path).size == 0:
                return iter(())  # an empty file is a split without rows, not an error
            if self.source.format != "parquet":
                self._stream = fs.open_input_stream(self.path)
        except OSError as exc:
            raise FileReadError(self.path, exc)
        try:
            batches = self._parse(fs)
            if self.source.errors is OnError.DEAD_LETTER:
                batches = iter(list(batches))  # every row parsed before the first is emitted
        except (*PARSE_ERRORS, FileReadError) as exc:
            error = self._read_error(exc)
            if self.source.errors is OnError.FAIL:
                raise error
            self.dead_letter = pa.record_batch(
                [[self.path], [self.row_group], [str(error)]], schema=DEAD_LETTER_SCHEMA)
            return iter(())
        return _skip_rows(batches, self.position)

    def _parse(self, fs: pafs.FileSystem) -> Iterator[pa.RecordBatch]:
        source = self.source
        fmt, size = source.format, source.batch_size
        schema = source.unified_schema()
        mismatch = source.schema_errors().get(self.path)
        if mismatch is not None:
            raise mismatch
        if fmt == "parquet":
            row_groups = None if self.row_group is None else [self.row_group]
            batches = pq.ParquetFile(self.path, filesystem=fs).iter_batches(
                batch_size=size, row_groups=row_groups)
            return batches if schema is None else (_conform(b, schema) for b in batches)
        if fmt == "avro":
            batches = avro_file_batches(self._stream, size)
            return batches if schema is None else (_conform(b, schema) for b in batches)
        if fmt == "csv":
            return iter(pacsv.open_csv(self._stream, read_options=self._csv_read_options(),
                                       parse_options=self._csv_parse_options(),
                                       convert_options=self._csv_convert_options()))
        return iter(pajson.read_json(self._stream,
                                     parse_options=self._json_parse_options()).to_batches(size))

    def _csv_read_options(self, use_threads: bool = True) -> pacsv.ReadOptions:
        schema = self.source.unified_schema()
        names = schema.names if not self.source.csv.header and schema is not None else None
        return pacsv.ReadOptions(block_size=max(self.source.batch_size * 64, 1 << 16),
                                 use_threads=use_threads, column_names=names)

    def _csv_parse_options(self) -> pacsv.ParseOptions:
        return pacsv.ParseOptions(delimiter=self.source.csv.delimiter)

    def _csv_convert_options(self) -> pacsv.ConvertOptions | None:
        schema = self.source.unified_schema()
        return pacsv.ConvertOptions(column_types=schema) if schema else None

    def _json_parse_options(self) -> pajson.ParseOptions | None:
        schema = self.source.unified_schema()
        return pajson.ParseOptions(explicit_schema=schema) if schema else None

    def next_batch(self) -> pa.RecordBatch | None:
        if self._batches is None:
            self._batches = self._open()
        try:
            for batch in self._batches:
                if batch.num_rows:
                    self.position += batch.num_rows
                    return batch
        except PARSE_ERRORS as exc:  # further into a file streamed under errors="fail"
            raise self._read_error(exc)
        self.close()
        return None

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _read_error(self, exc: BaseException) -> FileReadError:
        """``exc`` as a FileReadError (its ``__cause__``), with where in the file it happened
        when that can be known (found on this error path only: reads stay as they are)."""
        if isinstance(exc, FileReadError):
            return exc
        fs, _ = self.source._filesystem()
        if self.source.format == "csv":
            position = _csv_position(exc) or self._locate_csv_row(fs)
        elif self.source.format == "avro":
            position = FilePosition(row=exc.row if isinstance(exc, AvroFileError) else None)
        elif self.source.format == "jsonl":
            return FileReadError(self.path, exc, self._locate_json_line(fs) or FilePosition(),
                                 detail=JSON_BLOCK_ROW.sub("", str(exc)))
        else:
            position = FilePosition(row_group=self.row_group)
        return FileReadError(self.path, exc, position or FilePosition())

    def _locate_csv_row(self, fs: pafs.FileSystem) -> FilePosition | None:
        # pyarrow numbers the failing row only when it reads on one thread
        try:
            with fs.open_input_stream(self.path) as stream:
                for _ in pacsv.open_csv(stream, read_options=self._csv_read_options(False),
                                        parse_options=self._csv_parse_options(),
                                        convert_options=self._csv_convert_options()):
                    pass
        except PARSE_ERRORS as exc:
            return _csv_position(exc)
        return None

    def _locate_json_line(self, fs: pafs.FileSystem) -> FilePosition | None:
        """The first line at which the file's lines so far stop parsing (pyarrow's own
        "row" counts records within a block, blank lines not included)."""
        if fs.get_file_info(self.path).size > LOCATE_JSON_LINE_MAX_BYTES:
            return None
        with fs.open_input_file(self.path) as f:
            data = f.read()
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n")) + 1
        if not len(ends) or ends[-1] != len(data):
            ends = np.append(ends, len(data))
        options = self._json_parse_options()

        def parses(lines: int) -> bool:
            try:
                pajson.read_json(pa.BufferReader(data[:ends[lines - 1]]), parse_options=options)
                return True
            except PARSE_ERRORS:
                return False

        if parses(len(ends)):
            return None
        lo, hi = 1, len(ends)  # the first `hi` lines do not parse
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if parses(mid) else (lo, mid)
        return FilePosition(line=hi, offset=int(ends[hi - 2]) if hi > 1 else 0)


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns and types (missing columns are null)."""
    if batch.schema.equals(schema):
        return batch
    return pa.RecordBatch.from_arrays([_conform_column(batch, f) for f in schema], schema=schema)


def _conform_column(batch: pa.RecordBatch, field: pa.Field) -> pa.Array:
    if field.name not in batch.schema.names:
        return pa.nulls(batch.num_rows, field.type)
    column = batch.column(field.name)
    try:
        return column.cast(field.type)
    except PARSE_ERRORS as exc:  # pyarrow's message does not say which column
        raise type(exc)(f"column '{field.name}' ({column.type}) does not cast to "
                        f"{field.type}: {exc}") from exc


def _csv_position(exc: BaseException) -> FilePosition | None:
    """The row pyarrow names in a CSV error ("Row #N", counting the header), if any."""
    found = re.search(r"Row #(\d+)", str(exc))
    return FilePosition(row=int(found.group(1))) if found else None


def _skip_rows(batches: Iterator[pa.RecordBatch], skip: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        yield batch.slice(skip) if skip else batch
        skip = 0
