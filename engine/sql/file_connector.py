"""The ``filesystem`` SQL connector: files under a path as a table, read as
``env.read_files`` reads them and written exactly once as ``stream.sink_to_files`` writes
them (Flink's ``filesystem`` connector, with its options' names).

* ``'path'``: a file, a directory (every file of the format under it) or a URI
  (``file:///data/bids/``, ``s3://...``); ``'format'``: ``parquet``, ``csv`` (no header:
  the columns in the order declared, as Flink's ``csv`` format; ``'csv.field-delimiter'``),
  ``json`` (JSON lines) or ``avro`` (read only).
* ``PARTITIONED BY (dt, hm)``: a sink writes Hive-style ``dt=.../hm=.../`` directories
  (the partition columns are in the directory names, not the files); a scan takes their
  values from the directory names of each file.
* A scan with ``'source.monitor-interval'`` is continuous: the path is listed again at
  that interval and new files are read (Flink's option); without it, bounded.
* A sink rolls files at every checkpoint and at ``'sink.rolling-policy.file-size'``;
  its files become visible (in the commit log that ``rs.spark.read_committed`` and
  Spark's ``_spark_metadata`` follow) when the checkpoint that holds them completes,
  exactly once. Flink's rolling-policy intervals and partition-commit options (the
  ``success-file`` policy, the ``partition-time`` trigger and its delay, the time
  extractor) are accepted so that jobs written for Flink run unchanged, but a partition
  is committed file by file with its checkpoints, and no ``_SUCCESS`` file is written.

    >>> import raystream as rs, tempfile
    >>> env = rs.StreamEnvironment(parallelism=1)
    >>> out = tempfile.mkdtemp()
    >>> env.sql(f'''CREATE TABLE totals (user_id BIGINT, total BIGINT)
    ...             WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv')''')
    SqlResult(sinks=[])
"""

from __future__ import annotations

import dataclasses
import posixpath
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
from sqlglot import exp

from raystream.engine.errors import SqlError
from raystream.engine.sources.files import CsvLayout, Files
from raystream.engine.sql.catalog import TableEntry
from raystream.engine.sql.connector_base import Connector, ScanSpec, duration_ms, memory_bytes
from raystream.engine.sql.scan_source import ShapedSource, SqlWatermark, TableShape
from raystream.spark.commit_log import HIVE_NULL

if TYPE_CHECKING:
    from raystream.engine.datastream import DataStream
    from raystream.engine.environment import StreamEnvironment
    from raystream.engine.sink_handle import SinkHandle

# the format names of Flink's filesystem connector -> raystream's file sources'
_READ_FORMATS = {"parquet": "parquet", "csv": "csv", "json": "jsonl", "avro": "avro"}
_WRITE_FORMATS = ("parquet", "csv", "json")
_ACCEPTED = frozenset({  # Flink's options a job written for Flink carries (module doc)
    "sink.rolling-policy.rollover-interval", "sink.rolling-policy.check-interval",
    "sink.rolling-policy.inactivity-interval", "sink.partition-commit.trigger",
    "sink.partition-commit.delay", "sink.partition-commit.policy.kind",
    "sink.partition-commit.success-file.name", "sink.partition-commit.watermark-time-zone",
    "partition.time-extractor.timestamp-pattern", "partition.time-extractor.timestamp-formatter",
    "partition.time-extractor.kind"})


# Flink's legacy option names (its connector descriptors; Nexmark's q13 has them)
LEGACY = {"connector.path": "path", "format.type": "format"}


def _option(table: TableEntry, key: str) -> str | None:
    """Option ``key``, or its legacy name's value."""
    legacy = next((old for old, new in LEGACY.items() if new == key), None)
    value = table.definition.option(key)
    return value if value is not None or legacy is None else table.definition.option(legacy)


class Filesystem(Connector):
    name = "filesystem"
    options = frozenset({"path", "format", "csv.field-delimiter", "source.monitor-interval",
                         "sink.rolling-policy.file-size"}) | _ACCEPTED | set(LEGACY)

    def check(self, table: TableEntry) -> None:
        super().check(table)
        where = f"CREATE TABLE {table.name}"
        for key in ("path", "format"):
            if _option(table, key) is None:
                raise SqlError(f"{where}: connector 'filesystem' needs option {key!r}")
        format = _option(table, "format")
        if format not in _READ_FORMATS:
            raise SqlError(f"{where}: the filesystem connector reads formats "
                           f"{', '.join(_READ_FORMATS)}, not {format!r}")
        delimiter = table.definition.option("csv.field-delimiter", ",")
        if delimiter is None or len(delimiter) != 1:
            raise SqlError(f"{where}: 'csv.field-delimiter' is one character, not {delimiter!r}")
        names = {f.name for f in table.physical.fields}
        for column in table.definition.partitioned_by:
            if column not in names:
                raise SqlError(f"{where}: PARTITIONED BY ({column}): no such physical column")
        _options(table)

    def scan(self, table: TableEntry, conditions: tuple[exp.Expr, ...]) -> ScanSpec:
        options = _options(table)
        partitions = table.definition.partitioned_by
        # the files hold the physical columns but the partition ones, typed as declared
        in_files = pa.schema([pa.field(f.name, f.type) for f in table.physical.fields
                              if f.name not in partitions])
        shape = TableShape.of(table)
        rowtime, delay = table.schema.rowtime, table.watermark_delay_ms
        format = _option(table, "format") or ""
        files = Files(options.path, format=_READ_FORMATS[format], schema=in_files,
                      monitor_interval_s=options.monitor_interval_s,
                      csv=CsvLayout(header=False, delimiter=options.delimiter))
        source = _FileTableSource(files, shape, table.schema.names, partitions)

        def build(env: StreamEnvironment) -> DataStream:
            watermarks = None if rowtime is None else SqlWatermark(rowtime, delay_ms=delay or 0)
            return env.from_source(source, name=table.name, watermarks=watermarks)
        how = "continuous" if options.monitor_interval_s else "bounded"
        return ScanSpec(table.schema, build, f"filesystem {table.name} ({format} files under "
                                             f"{options.path}, {how})",
                        lookup=None if options.monitor_interval_s else source)

    def check_sink(self, table: TableEntry) -> None:
        format = _option(table, "format")
        if format not in _WRITE_FORMATS:
            raise SqlError(f"INSERT INTO {table.name}: the filesystem connector writes formats "
                           f"{', '.join(_WRITE_FORMATS)}, not {format!r}")

    def sink(self, table: TableEntry, stream: "DataStream") -> "SinkHandle":
        format = _option(table, "format") or ""
        options = _options(table)
        partitions = list(table.definition.partitioned_by) or None
        return stream.sink_to_files(options.path, format=format, partition_by=partitions,
                                    max_bytes_per_file=options.file_size,
                                    csv_delimiter=options.delimiter, name=table.name)


@dataclass(frozen=True)
class _Options:
    path: str
    delimiter: str
    monitor_interval_s: float | None
    file_size: int


def _options(table: TableEntry) -> _Options:
    definition, where = table.definition, f"CREATE TABLE {table.name}"
    path = _option(table, "path") or ""
    if path.startswith("file://"):  # (a local path: the sink's commit log wants it plain)
        path = urllib.parse.unquote(path[len("file://"):])
    interval = definition.option("source.monitor-interval")
    size = definition.option("sink.rolling-policy.file-size")
    return _Options(
        path=path, delimiter=definition.option("csv.field-delimiter", ",") or ",",
        monitor_interval_s=None if interval is None else duration_ms(
            interval, f"{where}: 'source.monitor-interval'") / 1000,
        file_size=128 << 20 if size is None else memory_bytes(
            size, f"{where}: 'sink.rolling-policy.file-size'"))


def _of_split(shape: TableShape, partitions: tuple[str, ...], split: Any) -> TableShape:
    """``shape`` with the values of ``split``'s partition columns, from its directories."""
    path = split if isinstance(split, str) else split["path"]
    values: dict[str, str | None] = {}
    for segment in posixpath.dirname(path).split("/"):
        column, equals, value = segment.partition("=")
        if equals and column in partitions:
            value = urllib.parse.unquote(value)
            values[column] = None if value == HIVE_NULL else value
    missing = [c for c in partitions if c not in values]
    if missing:
        raise SqlError(f"file {path}: no directory names partition column(s) "
                       f"{', '.join(missing)} (PARTITIONED BY: a directory "
                       f"{missing[0]}=<value> above each file)")
    return dataclasses.replace(shape, constants=values)


@dataclass(frozen=True)
class _FileTableSource(ShapedSource):
    """Files shaped into the table's rows; a file's partition values are its split's."""

    partitions: tuple[str, ...] = ()

    def shape_of(self, split: Any) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
        assert isinstance(self.shape, TableShape)
        return _of_split(self.shape, self.partitions, split) if self.partitions else self.shape

