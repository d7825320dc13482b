"""Bounded reads of Parquet, CSV and JSON-lines files (one file = one split).

Paths may be local paths or any ``pyarrow.fs`` URI (``file://``, ``s3://``,
``gs://``, ``hdfs://``). A directory is read in file-name order.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raystream.engine.sources.base import Source, SplitReader

FORMATS = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "jsonl": (".jsonl", ".json", ".ndjson")}


class Files(Source):
    """Rows of every file of ``format`` under ``path`` (a file, a directory or a URI).

    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> d = tempfile.mkdtemp(); pq.write_table(pa.table({"x": [1, 2, 3]}), os.path.join(d, "a.parquet"))
    >>> src = Files(d, format="parquet"); [s.rsplit("/", 1)[-1] for s in src.splits()]
    ['a.parquet']
    >>> src.reader(src.splits()[0], position=1).next_batch().to_pydict()
    {'x': [2, 3]}
    """

    def __init__(self, path: str, *, format: str = "parquet", batch_size: int = 65536,
                 schema: pa.Schema | None = None) -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {sorted(FORMATS)}, not {format!r}")
        self.path = path
        self.format = format
        self.batch_size = batch_size
        self.schema = schema
        self._files: list[str] | None = None
        self._unified: pa.Schema | None = None

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        return pafs.FileSystem.from_uri(self.path) if "://" in self.path else (
            pafs.LocalFileSystem(), self.path)

    def splits(self) -> list[str]:
        if self._files is None:
            fs, root = self._filesystem()
            info = fs.get_file_info(root)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"file source: {self.path} does not exist")
            if info.type == pafs.FileType.File:
                files = [root]
            else:
                selector = pafs.FileSelector(root, recursive=True)
                files = sorted(i.path for i in fs.get_file_info(selector)
                               if i.type == pafs.FileType.File
                               and i.path.lower().endswith(FORMATS[self.format])
                               and not i.base_name.startswith(("_", ".")))
            self._files = files
        return list(self._files)

    def reader(self, split: str, position: int = 0) -> "FileReader":
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


class FileReader(SplitReader):
    def __init__(self, source: Files, path: str, position: int) -> None:
        self.source = source
        self.path = path
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
            batches = pq.ParquetFile(self.path, filesystem=fs).iter_batches(batch_size=size)
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
