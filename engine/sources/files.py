"""Parquet, CSV and JSON-lines files as a split-based source, bounded or continuous.

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
Flink expect); names starting with ``_`` or ``.`` are skipped.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raystream.engine.sources.base import Source, SplitReader
from raystream.engine.sources.split_enumerator import SplitEnumerator, SplitEnumeratorContext

FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".json", ".ndjson")}


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
    """

    def __init__(self, path: str, *, format: str = "parquet", batch_size: int = 65536,
                 schema: pa.Schema | None = None,
                 monitor_interval_s: float | None = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {sorted(FORMATS)}, not {format!r}")
        if monitor_interval_s is not None and monitor_interval_s <= 0:
            raise ValueError(f"monitor_interval_s must be > 0, not {monitor_interval_s}")
        self.path = path
        self.format = format
        self.batch_size = batch_size
        self.schema = schema
        self.monitor_interval_s = monitor_interval_s
        self._files: list[str] | None = None
        self._unified: pa.Schema | None = None

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        return pafs.FileSystem.from_uri(self.path) if "://" in self.path else (
            pafs.LocalFileSystem(), self.path)

    def list_files(self) -> list[str]:
        """The files of ``format`` under ``path`` now, in name order."""
        fs, root = self._filesystem()
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"file source: {self.path} does not exist")
        if info.type == pafs.FileType.File:
            return [root]
        selector = pafs.FileSelector(root, recursive=True)
        return sorted(i.path for i in fs.get_file_info(selector)
                      if i.type == pafs.FileType.File
                      and i.path.lower().endswith(FORMATS[self.format])
                      and not i.base_name.startswith(("_", ".")))

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
                groups = pq.ParquetFile(path, filesystem=fs).num_row_groups
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
        is double everywhere.
        """
        if self.schema is not None or self._unified is not None:
            return self.schema or self._unified
        fs, _ = self._filesystem()
        schemas = []
        for path in self.splits():
            if fs.get_file_info(path).size == 0:
                continue
            if self.format == "parquet":
                schemas.append(pq.ParquetFile(path, filesystem=fs).schema_arrow)
                continue
            with fs.open_input_stream(path) as stream:
                opener = pacsv.open_csv if self.format == "csv" else pajson.open_json
                schemas.append(opener(stream).schema)
        self._unified = pa.unify_schemas(schemas, promote_options="permissive") if schemas else None
        return self._unified


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
        if self.bounded:
            while self.waiting:
                self.context.signal_no_more_splits(self.waiting.pop(0))
        else:
            self.context.call_later(self.source.monitor_interval_s, self._list)

    def add_reader(self, subtask: int) -> None:
        pass  # it asks for splits when it needs them

    def handle_split_request(self, subtask: int) -> None:
        if self.pending:
            self.context.assign_split(self.pending.pop(0), subtask)
        elif self.listed:
            self.context.signal_no_more_splits(subtask)
        elif subtask not in self.waiting:
            self.waiting.append(subtask)

    def snapshot_state(self, checkpoint_id: int) -> dict:
        return {"seen": sorted(self.seen), "pending": list(self.pending)}


class FileReader(SplitReader):
    def __init__(self, source: Files, split: str | dict, position: int) -> None:
        self.source = source
        self.path = split if isinstance(split, str) else split["path"]
        self.row_groups = None if isinstance(split, str) else [split["row_group"]]
        self.position = position
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._stream = None

    def _open(self) -> Iterator[pa.RecordBatch]:
        fs, _ = self.source._filesystem()
        if fs.get_file_info(self.path).size == 0:
            return iter(())  # an empty file is a split without rows, not an error
        fmt, size = self.source.format, self.source.batch_size
        schema = self.source.unified_schema()
        if fmt == "parquet":
            batches = pq.ParquetFile(self.path, filesystem=fs).iter_batches(
                batch_size=size, row_groups=self.row_groups)
            if schema is not None:
                batches = (_conform(b, schema) for b in batches)
        else:
            self._stream = fs.open_input_stream(self.path)
            if fmt == "csv":
                convert = pacsv.ConvertOptions(column_types=schema) if schema else None
                read = pacsv.ReadOptions(block_size=max(size * 64, 1 << 16))
                batches = iter(pacsv.open_csv(self._stream, read_options=read,
                                              convert_options=convert))
            else:
                parse = pajson.ParseOptions(explicit_schema=schema) if schema else None
                batches = iter(pajson.read_json(self._stream, parse_options=parse).to_batches(size))
        return _skip_rows(batches, self.position)

    def next_batch(self) -> pa.RecordBatch | None:
        if self._batches is None:
            self._batches = self._open()
        for batch in self._batches:
            if batch.num_rows:
                self.position += batch.num_rows
                return batch
        self.close()
        return None

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns and types (missing columns are null)."""
    if batch.schema.equals(schema):
        return batch
    columns = [batch.column(f.name).cast(f.type) if f.name in batch.schema.names
               else pa.nulls(batch.num_rows, f.type) for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _skip_rows(batches: Iterator[pa.RecordBatch], skip: int) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        yield batch.slice(skip) if skip else batch
        skip = 0
