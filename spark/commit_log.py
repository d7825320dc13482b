"""The commit log of an exactly-once file sink, and readers that see committed files only.

A Parquet sink (``DataStream.sink_to_parquet``) writes data files under
``<path>/`` with final, unique names as data arrives; a file becomes part of
the output only when a commit-log entry lists it. Files of a failed attempt or
of a checkpoint that never completed stay on disk but are never listed, so
readers that go through the log (:func:`committed_files`,
:func:`read_committed`) never see them.

Layout
------
::

    <path>/<partition dirs>/<checkpoint>-<subtask>-<attempt>-<uuid>.parquet   data files
    <path>/_raystream_log/<incarnation>-<checkpoint id>.json                    one entry per commit
    <path>/_raystream_log/.<entry name>.tmp-<uuid>                              a write in progress

``_raystream_log`` starts with ``_`` so that directory readers (Spark,
``pyarrow.dataset``) skip it. An *incarnation* names one run of a job
(``<job name>-<12 hex digits>``, kept in the committer's checkpointed state, so
it survives failovers and restores of that run); together with the checkpoint
id it identifies a commit, and at most one entry exists per (incarnation,
checkpoint id): committing the same checkpoint again is a no-op.

Entry format (JSON, never pickle; checksummed like checkpoint metadata)::

    {"format": 1,
     "sha256": "<hex SHA-256 of the canonical JSON of payload>",
     "payload": {
        "incarnation": "clicks-3f2a9c0d1e4b",
        "checkpoint_id": 7,
        "committed_at_ms": 1732233600000,
        "files": [
          {"path": "day=2024-11-22/7-0-0-<uuid>.parquet",   # relative to <path>, "/"-separated
           "rows": 8192, "bytes": 70211,
           "checkpoint": 7, "subtask": 0, "attempt": 0,     # the writer's name parts
           "partition": [["day", "2024-11-22"]],            # hive values as text (null: null)
           "partition_schema": "<base64 Arrow IPC schema>"} # types of the partition columns
        ]}}

The canonical JSON is ``json.dumps(payload, sort_keys=True, separators=(",", ":"),
allow_nan=False)``. Partition columns are not stored inside the data files
(the hive convention, which Spark requires); readers restore them from
``partition`` with the types in ``partition_schema``.

Writing an entry is atomic: locally a temporary file in the log directory,
``fsync``, ``rename`` to the final name, then ``fsync`` of the directory; on
object stores a single PUT of the final key. Data files are made durable by
the writer before their entry is written.

Commit order: within an incarnation, entries in checkpoint id order;
incarnations in the order of their first commit (``committed_at_ms``). A file
listed by several entries (a restored committable committed again under a
newer id) is read once.

Spark's ``_spark_metadata``
---------------------------
This log stays the source of truth; the Parquet sink also keeps Spark's own
file-sink log ``<path>/_spark_metadata`` as a mirror of it
(:mod:`raystream.spark.spark_log`), so that a plain ``spark.read.parquet(path)``
and ``spark.readStream.parquet(path)`` see committed files only. Spark's
format alone would not do: its batch ids are dense (0, 1, 2, ...) while
commits are identified by (incarnation, checkpoint id), its paths are
absolute URIs (a moved dataset breaks it; this log's are relative), and it
has no retraction for the truncation a restore needs -- the mirror is
rebuilt from this log instead. Read with :func:`read_committed` (Arrow) or
``rs.spark.read(spark, path)`` (Spark).

Example:

    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> out = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"x": [1, 2]}), f"{out}/1-0-0-a.parquet")
    >>> pq.write_table(pa.table({"x": [3]}), f"{out}/2-0-0-b.parquet")   # never committed
    >>> files = [{"path": "1-0-0-a.parquet", "rows": 2, "bytes": 0}]
    >>> write_entry(out, "demo-000000000000", 1, files)
    True
    >>> write_entry(out, "demo-000000000000", 1, files)     # the same commit again: a no-op
    False
    >>> [p.rsplit("/", 1)[1] for p in committed_files(out)]
    ['1-0-0-a.parquet']
    >>> read_committed(out).to_pydict()
    {'x': [1, 2]}
"""

from __future__ import annotations

import base64
import os
import posixpath
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raystream.checkpoint.storage import (CheckpointStorage, fsync_dir, checksummed_json,
                                          publish_new_file, verify_checksummed_json)
from raystream.core.errors import RaystreamError

__all__ = ["LOG_DIR", "LogEntry", "CorruptCommitLogError", "write_entry", "list_entries",
           "truncate_entries", "committed_files", "read_committed"]

LOG_DIR = "_raystream_log"
LOG_FORMAT = 1
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_ENTRY_RE = re.compile(
    r"(?P<incarnation>[A-Za-z0-9][A-Za-z0-9_.-]*)-(?P<checkpoint>0|[1-9][0-9]*)\.json")
_INCARNATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class CorruptCommitLogError(RaystreamError):
    """A commit-log entry is unparsable or fails its checksum."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt commit-log entry {path!r}: {reason}")
        self.path, self.reason = path, reason

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


@dataclass
class LogEntry:
    incarnation: str
    checkpoint_id: int
    committed_at_ms: int
    files: list[dict] = field(default_factory=list)


# -- locations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """A sink's root directory: a local path or any ``pyarrow.fs`` URI."""

    filesystem: pafs.FileSystem
    root: str
    is_local: bool

    @classmethod
    def of(cls, path: str) -> "Location":
        storage = CheckpointStorage(path)  # the same URI resolution as checkpoint storage
        return cls(storage.filesystem, storage.root, storage.is_local)

    def join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if self.root else posixpath.join(*parts)

    @property
    def log_dir(self) -> str:
        return self.join(LOG_DIR)


def entry_name(incarnation: str, checkpoint_id: int) -> str:
    if not isinstance(incarnation, str) or not _INCARNATION_RE.fullmatch(incarnation):
        raise ValueError(f"invalid incarnation {incarnation!r}")
    if not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool) or checkpoint_id < 0:
        raise ValueError(f"checkpoint id must be a non-negative int, got {checkpoint_id!r}")
    return f"{incarnation}-{checkpoint_id}.json"


# -- writing ---------------------------------------------------------------------------


def write_entry(path: str | Location, incarnation: str, checkpoint_id: int, files: list[dict],
                *, before_publish: Callable[[], None] | None = None) -> bool:
    """Commit ``files`` as the entry of (``incarnation``, ``checkpoint_id``).

    Returns False, writing nothing, if that entry exists already (a commit is
    idempotent per incarnation and checkpoint id). ``before_publish`` runs
    after the entry's bytes are durable and before they become visible (the
    ``mid_commit`` failpoint).
    """
    loc = path if isinstance(path, Location) else Location.of(path)
    name = entry_name(incarnation, checkpoint_id)
    payload = {"incarnation": incarnation, "checkpoint_id": checkpoint_id,
               "committed_at_ms": int(time.time() * 1000), "files": [dict(f) for f in files]}
    log_dir = loc.log_dir
    created = loc.is_local and not os.path.isdir(log_dir)  # its entry in root must be durable
    return publish_new_file(loc.filesystem, loc.is_local, log_dir, name,
                            checksummed_json(payload, LOG_FORMAT),
                            temp_name=f".{name}.tmp-{uuid.uuid4().hex}",
                            fsync_dirs=(loc.root,) if created else (),
                            before_publish=before_publish)


def truncate_entries(path: str | Location, incarnation: str, above: int) -> list[int]:
    """Delete the entries of ``incarnation`` with checkpoint id > ``above``, newest first
    (restoring an older snapshot: their output will be produced again). Returns their ids."""
    loc = path if isinstance(path, Location) else Location.of(path)
    ids = sorted((cid for inc, cid, _ in _entry_paths(loc) if inc == incarnation and cid > above),
                 reverse=True)
    for cid in ids:  # newest first: the log stays a prefix if this is interrupted
        target = posixpath.join(loc.log_dir, entry_name(incarnation, cid))
        try:
            loc.filesystem.delete_file(target)
        except FileNotFoundError:
            pass
    if ids and loc.is_local:
        fsync_dir(loc.log_dir)
    return ids


# -- reading ---------------------------------------------------------------------------


def _entry_paths(loc: Location) -> list[tuple[str, int, str]]:
    infos = loc.filesystem.get_file_info(pafs.FileSelector(loc.log_dir, allow_not_found=True))
    found = []
    for info in infos:
        m = _ENTRY_RE.fullmatch(info.base_name)
        if m and info.type == pafs.FileType.File:
            found.append((m.group("incarnation"), int(m.group("checkpoint")), info.path))
    return found


def _read_entry(loc: Location, entry_path: str) -> LogEntry:
    with loc.filesystem.open_input_stream(entry_path, compression=None) as f:
        raw = f.read()
    try:
        payload = verify_checksummed_json(raw, LOG_FORMAT)
    except ValueError as exc:
        raise CorruptCommitLogError(entry_path, str(exc)) from None
    return LogEntry(payload["incarnation"], payload["checkpoint_id"],
                    payload["committed_at_ms"], payload["files"])


def list_entries(path: str | Location, incarnation: str | None = None) -> list[LogEntry]:
    """Every entry of the log (of one incarnation if given), in commit order."""
    loc = path if isinstance(path, Location) else Location.of(path)
    entries = [_read_entry(loc, p) for inc, _, p in _entry_paths(loc)
               if incarnation is None or inc == incarnation]
    first: dict[str, int] = {}
    for e in entries:
        first[e.incarnation] = min(first.get(e.incarnation, e.committed_at_ms), e.committed_at_ms)
    return sorted(entries, key=lambda e: (first[e.incarnation], e.incarnation, e.checkpoint_id))


def committed_file_entries(path: str | Location) -> list[dict]:
    """The file records of every committed file, once each, in commit order."""
    seen: set[str] = set()
    out = []
    for entry in list_entries(path):
        for f in entry.files:
            if f["path"] not in seen:
                seen.add(f["path"])
                out.append(f)
    return out


def committed_files(path: str) -> list[str]:
    """Every data file listed by any log entry, once, in commit order.

    Paths are ``path`` joined with each file's relative path (so a URI stays a URI).
    """
    base = path.rstrip("/") if path not in ("/", "") else path
    return [posixpath.join(base, f["path"]) for f in committed_file_entries(path)]


def read_committed(path: str, *, columns: list[str] | None = None) -> pa.Table:
    """The rows of exactly the committed files, schemas unified (partition columns restored).

    An empty log gives an empty table without columns.
    """
    loc = Location.of(path)
    tables = []
    for f in committed_file_entries(loc):
        with loc.filesystem.open_input_file(loc.join(f["path"])) as source:
            if f["path"].endswith(".avro"):  # DataStream.sink_to_avro's files
                table = _read_avro(source)
            elif "schema" in f:  # CSV or JSON lines (SQL's filesystem connector)
                table = _read_text(source, decode_schema(f["schema"]), f.get("delimiter"))
            else:
                table = pq.ParquetFile(source).read()
        table = _with_partition_columns(table, f)
        if columns is not None:
            table = table.select([c for c in columns if c in table.column_names])
        tables.append(table)
    tables = [t for t in tables if t.num_columns]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


def _read_avro(source: Any) -> pa.Table:
    from raystream.core.avro import avro_file_batches, avro_file_schema

    schema = avro_file_schema(source)
    source.seek(0)
    return pa.Table.from_batches(list(avro_file_batches(source, 1 << 16)), schema=schema)


def _read_text(source: Any, schema: pa.Schema, delimiter: str | None) -> pa.Table:
    """A committed CSV file (``delimiter`` given; no header: the columns are the
    committed schema's) or JSON-lines file, typed as it was written."""
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    if delimiter is not None:
        return pacsv.read_csv(source, read_options=pacsv.ReadOptions(column_names=schema.names),
                              parse_options=pacsv.ParseOptions(delimiter=delimiter),
                              convert_options=pacsv.ConvertOptions(column_types=schema))
    return pajson.read_json(source, parse_options=pajson.ParseOptions(explicit_schema=schema))


def _with_partition_columns(table: pa.Table, f: dict) -> pa.Table:
    partition = f.get("partition") or []
    if not partition:
        return table
    schema = decode_schema(f["partition_schema"]) if f.get("partition_schema") else None
    for column, value in partition:
        typ = schema.field(column).type if schema is not None else pa.string()
        if value is None:
            array = pa.nulls(table.num_rows, typ)
        else:
            array = pa.repeat(pa.scalar(value, pa.string()).cast(typ), table.num_rows)
        table = table.append_column(pa.field(column, typ), array)
    return table


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# -- hive partition directory names -------------------------------------------------------

# Hive's / Spark's ExternalCatalogUtils.escapePathName set (Unix).
_ESCAPE = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(1, 32)}


def escape_path_name(text: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in text)


def partition_dir(columns: tuple[str, ...], values: tuple[str | None, ...]) -> str:
    """``col=value/...`` as Hive and Spark write it (null and "" -> the default partition)."""
    return "/".join(f"{escape_path_name(c)}={escape_path_name(v) if v else HIVE_NULL}"
                    for c, v in zip(columns, values))
