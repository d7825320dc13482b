"""Spark reads a Parquet sink's committed output: ``rs.spark.read`` and a plain ``spark.read.parquet``.

A writer and the committer run by hand (as in test_parquet_sink) so that
commits, restores and crashes happen exactly where a test puts them; every
read goes through a real local Spark session (RayDP). The oracle is the set
of ids each committed checkpoint was given, next to files that were written
and never committed.
"""

from __future__ import annotations

import json
import os
import urllib.parse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.operators.file_sink import (ParquetCommitter, ParquetSinkConfig,
                                                  ParquetWriter)
from raystream.engine.operators.two_phase import CommitterOperator, SinkWriterOperator
from raystream.spark import commit_log
from raystream.spark.spark_log import SPARK_LOG_DIR, SparkSinkLog

BASE_US = 1_700_000_000_123_456


def columns(ids: np.ndarray) -> dict:
    return {"id": ids, "v": ids * 3 - 7, "ts": (BASE_US + ids).astype("datetime64[us]"),
            "cat": np.array(["a", "b/c", "d e"])[ids % 3]}


def write_checkpoint(out: str, checkpoint: int, ids: np.ndarray, attempt: int = 0) -> pa.RecordBatch:
    """Writer subtask 0 writes ``ids`` for ``checkpoint``: returns its committables."""
    config = ParquetSinkConfig.of(out, "cat", 40, None)
    writer = SinkWriterOperator("parquet", ParquetWriter(config))
    output = CollectingOutput()
    writer.setup(RuntimeContext("hand", "parquet", 0, 1, 128, attempt, checkpointing=True), output)
    writer.initialize_state(RestoredState(checkpoint - 1) if checkpoint > 1 else None)
    writer.open()
    writer.process_batch(pa.record_batch(columns(ids)))
    writer.prepare_snapshot_pre_barrier(checkpoint)
    (batch,) = output.batches
    return batch


def committer(out: str, restored: RestoredState | None = None,
              attempt: int = 0) -> CommitterOperator:
    op = CommitterOperator("parquet-committer", ParquetCommitter(ParquetSinkConfig.of(
        out, None, None, None).path))
    op.setup(RuntimeContext("hand", "parquet-committer", 0, 1, 128, attempt,
                            checkpointing=True, job_id="hand-0001"), CollectingOutput())
    op.initialize_state(restored)
    return op


def commit(op: CommitterOperator, out: str, checkpoint: int, ids: np.ndarray,
           attempt: int = 0) -> bytes:
    op.process_batch(write_checkpoint(out, checkpoint, ids, attempt))
    state = op.snapshot_state(checkpoint).operator_state()
    op.notify_checkpoint_complete(checkpoint)
    return state


def ids_of(df) -> list[int]:
    return sorted(r["id"] for r in df.select("id").collect())


def plain_ids(spark, out: str) -> list[int]:
    """What Spark alone reads (its file-sink log), without raystream."""
    return ids_of(spark.read.parquet(out))


def test_spark_reads_committed_files_only_with_the_sinks_schema(spark, tmp_path):
    out = str(tmp_path / "out")
    op = committer(out)
    first, second = np.arange(0, 100), np.arange(100, 130)
    commit(op, out, 1, first)
    commit(op, out, 2, second)
    write_checkpoint(out, 3, np.arange(1000, 1050))  # written, never committed
    pq.write_table(pa.table(columns(np.array([5000]))), os.path.join(out, "3-1-0-stray.parquet"))
    committed = sorted(np.concatenate([first, second]).tolist())

    df = rs.spark.read(spark, out)
    assert ids_of(df) == committed
    assert plain_ids(spark, out) == committed
    assert df.schema.simpleString() == "struct<id:bigint,v:bigint,ts:timestamp,cat:string>"
    rows = {r["id"]: r for r in df.collect()}
    expected = pa.table(columns(np.array(committed)))
    for i, v, ts, cat in zip(*(expected.column(c).to_pylist() for c in ("id", "v", "ts", "cat"))):
        assert (rows[i]["v"], rows[i]["ts"], rows[i]["cat"]) == (v, ts, cat)
    # Spark lists only committed files: the same set as the commit log.
    files = {r[0] for r in df.selectExpr("input_file_name()").distinct().collect()}
    plain = {r[0] for r in spark.read.parquet(out).selectExpr("input_file_name()")
             .distinct().collect()}
    log_files = {"file://" + p for p in commit_log.committed_files(out)}
    assert {urllib.parse.unquote(f) for f in files} == log_files
    assert files == plain


def test_an_empty_sink_reads_as_an_empty_dataframe(spark, tmp_path):
    out = str(tmp_path / "out")
    committer(out)
    assert rs.spark.read(spark, out).count() == 0
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("ms"))])
    df = rs.spark.read(spark, out, schema=schema)
    assert df.count() == 0 and df.schema.simpleString() == "struct<id:bigint,ts:timestamp>"


@pytest.mark.slow
def test_spark_log_compacts_and_follows_truncation_and_crashes(spark, tmp_path):
    out = str(tmp_path / "out")
    op = committer(out)
    given: dict[int, np.ndarray] = {}
    states: dict[int, bytes] = {}
    for c in range(1, 24):  # 23 commits: Spark batches 0..22, compactions 9 and 19
        given[c] = np.arange(c * 1000, c * 1000 + 1 + (c * 7) % 50)
        states[c] = commit(op, out, c, given[c])
    log = SparkSinkLog.of(out)
    assert sorted(log.batches().values(), key=lambda n: int(n.split(".")[0])) == [
        f"{i}.compact" if i in (9, 19) else str(i) for i in range(23)]

    def upto(c: int) -> list[int]:
        return sorted(np.concatenate([given[i] for i in range(1, c + 1)]).tolist())

    assert plain_ids(spark, out) == upto(23) == ids_of(rs.spark.read(spark, out))

    # Restore checkpoint 12: commits 13..23 are undone in both logs.
    restored = committer(out, RestoredState(12, [states[12]]), attempt=1)
    assert [e.checkpoint_id for e in commit_log.list_entries(out)] == list(range(1, 13))
    assert sorted(log.batches()) == list(range(12))  # 19.compact went with them
    assert plain_ids(spark, out) == upto(12) == ids_of(rs.spark.read(spark, out))

    # The restored run produces 13.. again, in new files, across the next compaction.
    for c in range(13, 25):
        given[c] = np.arange(c * 1000 + 500, c * 1000 + 520)
        commit(restored, out, c, given[c], attempt=1)
    assert plain_ids(spark, out) == upto(24) == ids_of(rs.spark.read(spark, out))
    assert "19.compact" in log.batches().values()

    # A commit-log entry whose Spark batch a crash prevented: the next committer repairs it.
    extra = write_checkpoint(out, 25, np.arange(90_000, 90_010), attempt=2)
    files = [json.loads(c) for c in extra.column("committable").to_pylist()]
    commit_log.write_entry(out, restored.incarnation, 25, files)
    assert plain_ids(spark, out) == upto(24)  # Spark's log is behind
    assert ids_of(rs.spark.read(spark, out)) == sorted(upto(24) + list(range(90_000, 90_010)))
    committer(out, attempt=3)  # any start of the committer reconciles
    assert plain_ids(spark, out) == sorted(upto(24) + list(range(90_000, 90_010)))
    assert os.path.isdir(os.path.join(out, SPARK_LOG_DIR))


def test_a_long_jobs_commits_do_not_read_the_whole_spark_log_again(tmp_path, monkeypatch):
    """Each commit appends one Spark batch; listing what Spark already has comes from the
    committer's own view of the log, not from reading the log (compactions and deltas)
    once more per commit."""
    out = str(tmp_path / "out")
    op = committer(out)
    reads = []
    original = SparkSinkLog._read
    monkeypatch.setattr(SparkSinkLog, "_read", lambda self, name: reads.append(name) or
                        original(self, name))
    for c in range(1, 31):  # Spark batches 0..29 with compactions 9, 19 and 29
        commit(op, out, c, np.arange(c * 100, c * 100 + 3))
    assert reads == []
    monkeypatch.undo()
    log = SparkSinkLog.of(out)  # a new reader sees what the committer wrote
    committed = {log.uri(f["path"]) for f in commit_log.committed_file_entries(out)}
    assert len(committed) == 90  # three partitions per checkpoint
    assert {r["path"] for r in log.files()} == committed
    assert "29.compact" in log.batches().values()


def test_sink_paths_with_spaces_percent_signs_and_glob_characters(spark, tmp_path):
    for name in ("o u%2Ft", "g[1]{a,b}*"):
        out = str(tmp_path / name)
        op = committer(out)
        commit(op, out, 1, np.arange(0, 10))
        commit(op, out, 2, np.arange(10, 25))
        write_checkpoint(out, 3, np.arange(100, 110))  # never committed
        assert ids_of(rs.spark.read(spark, out)) == list(range(25)), name
    # Spark's file stream source globs the paths of the files it found (as it does for its
    # own sink's output): only a path without glob characters can be followed.
    with pytest.raises(ValueError, match="glob"):
        rs.spark.read_stream(spark, out)
    out = str(tmp_path / "o u%2Ft")
    query = (rs.spark.read_stream(spark, out).writeStream.format("memory").queryName("odd_path")
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert ids_of(spark.table("odd_path")) == list(range(25))
