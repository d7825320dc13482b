"""Exactly-once ``collect()`` on the Sink V2 API (:mod:`~raystream.engine.operators.two_phase`).

With checkpoints on, ``stream.collect(name="out")`` is
``sink_exactly_once(CollectWriter, CollectCommitter)``: writer ``out`` at the
stream's parallelism, committer ``out-committer`` at parallelism 1. Their
files live with the run's checkpoints, outside every ``chk-<id>`` (retention
leaves them alone)::

    <storage>/<job id>/output/<writer>/<checkpoint>-<subtask>-<attempt>.arrow     rows (Arrow IPC)
    <storage>/<job id>/output/<committer>/_collect                                 marks the sink
    <storage>/<job id>/output/<committer>/_raystream_log/<incarnation>-<n>.json    one entry per commit

* :class:`CollectWriter` keeps the batches it receives. Before barrier ``n``
  it encodes those received since the last barrier as one Arrow IPC stream and
  hands over its handle (path, size, SHA-256, rows) as the committable. The
  file itself is written on the subtask's snapshot thread before the
  checkpoint is acknowledged (write-once, fsync-ed:
  ``CheckpointStorage.write_output``), so storage that fails declines the
  checkpoint as a state file would, and a later checkpoint writes it again: no
  checkpoint completes before the files handed over ahead of its barrier exist.
* :class:`CollectCommitter` commits by writing one entry of the commit log
  (:mod:`raystream.spark.commit_log`'s format: atomic, checksummed, one per
  (incarnation, checkpoint id)) listing the handles.
* The job's result: once every subtask has stopped (every final commit done),
  the job master reads each collect sink's log (:func:`read_collected`), and
  ``result.table(sink)`` is one table, checkpoint by checkpoint.

A run's result is its own (``Committer.shared_output`` is False): a run
restored from another run's savepoint or checkpoint leaves what that run had
pending to it, and holds only what it committed itself; after a failover, the
restored committer lists what earlier attempts of the run committed and
commits the rest, once. Without checkpoints, ``collect()`` is the in-memory
:class:`~raystream.engine.operators.sinks.CollectSink`: no files.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import threading
import time
from typing import Callable

import pyarrow as pa
import pyarrow.fs as pafs

from raystream.checkpoint.storage import OUTPUT_DIR, CheckpointStorage, StateHandle, safe_name
from raystream.engine.batches import concat_batches
from raystream.engine.operators.two_phase import (Committer, SinkContext, SinkWriter,
                                                  incarnation_of)
from raystream.spark import commit_log
from raystream.spark.commit_log import Location

log = logging.getLogger(__name__)

MARKER = "_collect"  # in the committer's directory: this sink's result is its commit log
# A commit follows a checkpoint's completion at once: storage hiccuping then would fail the
# job over, where the same hiccup a moment earlier only declined a checkpoint.
COMMIT_RETRY_S = 10.0


def ipc_stream(batches: list[pa.RecordBatch]) -> pa.Buffer:
    """Batches as one Arrow IPC stream (schemas unified), copied once into a buffer of
    its exact size (measured first: growing a buffer would copy again and again)."""
    table = concat_batches(batches)
    size = pa.MockOutputStream()
    with pa.ipc.new_stream(size, table.schema) as writer:
        writer.write_table(table)
    buffer = pa.allocate_buffer(size.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buffer), table.schema) as writer:
        writer.write_table(table)
    return buffer


class CollectWriter(SinkWriter):
    """One Arrow IPC file per checkpoint and subtask, written off the processing thread.
    Batches without rows only give the result its columns: one file of them at most."""

    writes_empty_batches = True

    def __init__(self, storage_uri: str) -> None:
        self.storage_uri = storage_uri

    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        runtime = ctx.runtime
        if not runtime.job_id:
            raise ValueError(f"{runtime.operator_name}: a collect writer needs the job's id")
        self.storage = CheckpointStorage(self.storage_uri)
        self.batches: list[pa.RecordBatch] = []
        self.unwritten: dict[str, pa.Buffer] = {}  # name under output/ -> bytes handed over
        self.lock = threading.Lock()  # unwritten: the processing and the snapshot thread
        self.gave_columns = False  # a file of this subtask holds the result's columns

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows or not (self.gave_columns or self.batches):
            self.batches.append(batch)

    def prepare_commit(self, checkpoint_id: int | None) -> list[dict]:
        if not self.batches:
            return []
        self.gave_columns = True
        body = ipc_stream(self.batches)
        rows = sum(b.num_rows for b in self.batches)
        self.batches = []
        runtime = self.ctx.runtime
        label = checkpoint_id if checkpoint_id is not None else self.ctx.next_checkpoint_id
        name = (f"{safe_name(runtime.operator_name)}/"
                f"{label}-{runtime.subtask_index}-{runtime.attempt}.arrow")
        with self.lock:
            self.unwritten[name] = body
        path = posixpath.join(self.storage.job_dir(runtime.job_id), OUTPUT_DIR, name)
        return [{"path": path, "size": body.size, "sha256": hashlib.sha256(body).hexdigest(),
                 "rows": rows}]

    def make_durable(self) -> Callable[[], None] | None:
        with self.lock:
            todo = list(self.unwritten.items())
        if not todo:
            return None
        job_key = self.ctx.runtime.job_id

        def write() -> None:  # on the snapshot thread; what fails stays for the next one
            for name, body in todo:
                with self.lock:
                    if name not in self.unwritten:
                        continue  # written by an earlier checkpoint's snapshot
                self.storage.write_output(job_key, name, body)
                with self.lock:
                    self.unwritten.pop(name, None)
        return write

    def abort(self) -> None:
        self.batches = []


class CollectCommitter(Committer):
    """Lists the writers' files in the sink's commit log, one entry per checkpoint."""

    shared_output = False  # the job's result: each run's own

    def __init__(self, storage_uri: str) -> None:
        self.storage_uri = storage_uri

    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        runtime = ctx.runtime
        storage = CheckpointStorage(self.storage_uri)
        self.loc = sink_location(storage, runtime.job_id, runtime.operator_name)
        # an empty sink is an empty table, not a missing result
        storage.write_output(runtime.job_id, f"{safe_name(runtime.operator_name)}/{MARKER}", b"")

    def commit(self, incarnation: str, checkpoint_id: int, committables: list[dict]) -> None:
        deadline, delay = time.monotonic() + COMMIT_RETRY_S, 0.05
        while True:
            try:
                commit_log.write_entry(self.loc, incarnation, checkpoint_id, committables,
                                       before_publish=lambda: self.ctx.failpoint("mid_commit"))
                return
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("%s: commit of checkpoint %d failed (%s); retrying",
                            self.ctx.runtime.operator_name, checkpoint_id, exc)
                time.sleep(delay)
                delay = min(2 * delay, 1.0)

    def committed_ids(self, incarnation: str) -> set[str]:
        return {f["path"] for e in commit_log.list_entries(self.loc, incarnation)
                for f in e.files}

    def truncate(self, incarnation: str, above: int) -> list[int]:
        return commit_log.truncate_entries(self.loc, incarnation, above=above)

    def committable_id(self, committable: dict) -> str:
        return committable["path"]


def sink_location(storage: CheckpointStorage, job_key: str, committer: str) -> Location:
    """The directory of a collect committer's marker and commit log."""
    return Location(storage.filesystem,
                    posixpath.join(storage.job_dir(job_key), OUTPUT_DIR, safe_name(committer)),
                    storage.is_local)


def read_collected(storage_uri: str, job_key: str, committer: str) -> pa.Table | None:
    """What collect committer ``committer`` committed in run ``job_key``, checkpoint by
    checkpoint, as one table (every file verified against its handle); None if it is not
    a collect committer of that run."""
    storage = CheckpointStorage(storage_uri)
    loc = sink_location(storage, job_key, committer)
    if storage.filesystem.get_file_info(loc.join(MARKER)).type == pafs.FileType.NotFound:
        return None
    tables, seen = [], set()
    for entry in commit_log.list_entries(loc, incarnation_of(job_key)):
        for handle in entry.files:
            if handle["path"] in seen:
                continue
            seen.add(handle["path"])
            with pa.ipc.open_stream(storage.read_state(StateHandle.from_json(handle))) as reader:
                tables.append(reader.read_all())
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
