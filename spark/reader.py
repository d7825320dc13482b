"""Spark DataFrames of a Parquet sink's committed output: batch reads and a follow-along stream.

:func:`read` lists the files of the commit log (the source of truth) and
hands exactly those to Spark, with the sink's schema (timestamps as Spark
timestamps, partition columns restored from the ``col=value`` directories).
When Spark's log (``_spark_metadata``) lists the same files, as it does but
for the moment between a commit and its Spark batch or after a crash there,
Spark reads them from that log (no lookup per file); otherwise the files are
named one by one.
It can be called while the job is still writing: the DataFrame holds the
files committed when it was made -- a prefix, by commit, of the final output
-- and never a file of an uncommitted or aborted checkpoint.

:func:`read_stream` follows a sink with Spark Structured Streaming. The sink
keeps Spark's own file-sink log ``<path>/_spark_metadata`` in step with the
commit log (:mod:`raystream.spark.spark_log`), so Spark's file source picks up
each committed checkpoint's files once, and only those.

    >>> import raystream as rs
    >>> spark = rs.spark.session()                                    # doctest: +SKIP
    >>> rs.spark.read(spark, "/tmp/clicks-out").groupBy("user").count().show()  # doctest: +SKIP
    >>> query = (rs.spark.read_stream(spark, "/tmp/clicks-out")       # doctest: +SKIP
    ...          .writeStream.format("console").start())
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raystream.spark import commit_log
from raystream.spark.commit_log import Location
from raystream.spark.schema import spark_schema
from raystream.spark.spark_log import SPARK_LOG_DIR, SparkSinkLog, spark_base_path

_GLOB = set("{}[]*?\\")


def _no_glob(hadoop_path: str) -> str:
    """Escape Hadoop glob characters: Spark globs the paths given to ``parquet()``."""
    return "".join("\\" + c if c in _GLOB else c for c in hadoop_path)


def committed_schema(path: str, *, merge: bool = False) -> pa.Schema | None:
    """The Arrow schema of the committed output (data columns, then partition columns),
    from the first committed file -- or every one with ``merge`` -- or None if none."""
    return _schema_of(Location.of(path), commit_log.committed_file_entries(path), merge)


def _schema_of(loc: Location, files: list[dict], merge: bool) -> pa.Schema | None:
    if not files:
        return None
    schemas = []
    for f in (files if merge else files[:1]):
        with loc.filesystem.open_input_file(loc.join(f["path"])) as source:
            data = pq.read_schema(source)
        partition = (commit_log.decode_schema(f["partition_schema"])
                     if f.get("partition_schema") else pa.schema([]))
        schemas.append(pa.schema([*data, *partition]))
    return pa.unify_schemas(schemas) if len(schemas) > 1 else schemas[0]


def _struct(spark_or_arrow: Any) -> Any:
    return spark_schema(spark_or_arrow) if isinstance(spark_or_arrow, pa.Schema) else spark_or_arrow


def read(spark: Any, path: str, *, schema: Any = None, merge_schema: bool = False) -> Any:
    """A DataFrame of exactly the files committed to the Parquet sink at ``path`` now.

    ``schema`` (Arrow or Spark) overrides the schema of the committed files;
    ``merge_schema`` unifies the schemas of all committed files instead of
    taking the first one (as Spark's ``mergeSchema``). With nothing committed
    yet the DataFrame is empty, with ``schema`` or without columns.
    """
    from pyspark.sql.types import StructType

    files = commit_log.committed_file_entries(path)
    if schema is None:
        schema = _schema_of(Location.of(path), files, merge_schema)
    struct = _struct(schema) if schema is not None else StructType([])
    if not files:
        return spark.createDataFrame([], struct)
    base = spark_base_path(path)
    reader = spark.read.schema(struct)
    spark_log = SparkSinkLog.of(path)
    if not _GLOB & set(base) and (
            {r["path"] for r in spark_log.files()} == {spark_log.uri(f["path"]) for f in files}):
        # Spark's log lists exactly these files (the usual case): let Spark take them from
        # there, with sizes and times, instead of looking every file up.
        return reader.parquet(base)
    return reader.option("basePath", base).parquet(*(_no_glob(f"{base}/{f['path']}")
                                                     for f in files))


def read_stream(spark: Any, path: str, *, schema: Any = None, **options: Any) -> Any:
    """A streaming DataFrame that follows the Parquet sink at ``path``: each committed
    checkpoint's files once, never a file outside the commit log.

    The schema is that of the committed files unless ``schema`` (Arrow or
    Spark) is given -- required while nothing is committed yet. ``options``
    go to Spark's file source (``maxFilesPerTrigger``, ...).
    """
    base = spark_base_path(path)
    if _GLOB & set(base):
        raise ValueError(f"{path!r} contains glob characters ({''.join(sorted(_GLOB))}): "
                         f"Spark's file stream source would glob the paths of its files and "
                         f"miss them; write the sink to a path without them")
    loc = Location.of(path)
    if loc.filesystem.get_file_info(loc.join(SPARK_LOG_DIR)).type != pafs.FileType.Directory:
        raise FileNotFoundError(
            f"{path} has no {SPARK_LOG_DIR}/: not the output of a raystream Parquet sink (or "
            f"written before it kept Spark's log); Spark would read every file in it")
    if schema is None:
        schema = committed_schema(path)
        if schema is None:
            raise ValueError(f"nothing is committed to {path} yet, so its schema is unknown: "
                             f"pass schema=")
    # Spark looks for _spark_metadata under this literal path (it is not globbed first).
    return spark.readStream.schema(_struct(schema)).options(**options).parquet(base)
