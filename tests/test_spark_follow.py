"""Spark follows jobs that write Parquet: after placed failures, during the run, as a stream.

Real jobs on Ray write through the exactly-once Parquet sink; a real local
Spark (RayDP) reads with ``rs.spark.read``, with a plain
``spark.read.parquet`` (through ``_spark_metadata``) and with Structured
Streaming. Oracles: numpy over the same input (tests/support/oracles.py) and the
final commit log, whose entries say which files each checkpoint committed.
"""

from __future__ import annotations

import time
import urllib.parse

import numpy as np
import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.spark import commit_log
from tests.support.jobs import checkpointed_env, wait_for_checkpoint
from tests.support.oracles import assert_exactly_once
from tests.support.pipelines import build_job


def arrow(df) -> pa.Table:
    rows = [r.asDict() for r in df.collect()]
    return pa.Table.from_pylist(rows)


@pytest.mark.slow
def test_spark_reads_exactly_once_output_after_placed_failures(spark, tmp_path):
    out = str(tmp_path / "out")
    failpoints = [
        rs.Failpoint("in_processing", operator="sum", subtask=1, hit=5, attempt=0, action="raise"),
        rs.Failpoint("mid_commit", operator="out-committer", attempt=1, hit=2),
        rs.Failpoint("after_metadata_before_notify", attempt=2, hit=2),
    ]
    env = checkpointed_env(str(tmp_path / "chk"), failpoints=failpoints, attempts=10)
    build_job(env, out)
    client = env.execute_async("spark-after-failures")
    deadline = time.monotonic() + 180
    while client.progress()["attempt"] < 3:
        assert time.monotonic() < deadline, client.progress()
        time.sleep(0.05)
    wait_for_checkpoint(client, after=max(client.progress()["completed_checkpoints"] or [0]))
    ray.kill(client.subtask_actor("sum", 0))  # after a checkpoint of the fourth attempt
    result = client.wait(timeout_s=240)
    failures = result.failures
    assert result.restarts == 4, failures
    assert "failpoint in_processing" in failures[0]
    assert "out-committer" in failures[1] and "died" in failures[1], failures
    assert "after_metadata_before_notify" in failures[2], failures
    assert "died" in failures[3], failures

    assert_exactly_once(arrow(rs.spark.read(spark, out)))
    assert_exactly_once(arrow(spark.read.parquet(out)))  # Spark alone, through _spark_metadata


# -- reading while the job writes ---------------------------------------------------------------

N = 16_000


def numbered(i: np.ndarray) -> dict:
    return {"id": i, "k": i % 5, "v": i * 7 + 1}


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.1)  # about 8 s of input per subtask: time for many Spark reads
    return batch


def running_job(tmp_path, out: str, **sink_options) -> rs.JobClient:
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.3, storage=str(
            tmp_path / "chk"), retained=2), restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    source = env.from_sequence(N, numbered, batch_size=100, num_splits=4, name="numbers")
    source.map_batches(slow, name="slow").sink_to_parquet(out, name="out", **sink_options)
    return env.execute_async(f"follow-{time.monotonic_ns()}")


def files_and_rows(df) -> dict[str, int]:
    """Rows per data file, as Spark read them (paths as in the commit log)."""
    counts = df.groupBy("f").count().collect() if "f" in df.columns else \
        df.selectExpr("input_file_name() AS f").groupBy("f").count().collect()
    return {urllib.parse.unquote(r["f"]).removeprefix("file://"): r["count"] for r in counts}


def committed_by_checkpoint(out: str) -> list[tuple[int, dict[str, int]]]:
    """(checkpoint id, {file: rows}) of every entry of the one incarnation, in id order."""
    entries = commit_log.list_entries(out)
    assert len({e.incarnation for e in entries}) == 1
    return [(e.checkpoint_id, {f"{out}/{f['path']}": f["rows"] for f in e.files})
            for e in sorted(entries, key=lambda e: e.checkpoint_id)]


@pytest.mark.slow
def test_reads_during_the_run_are_prefixes_of_the_committed_output(spark, tmp_path):
    out = str(tmp_path / "out")
    client = running_job(tmp_path, out)
    deadline = time.monotonic() + 120
    while not commit_log.committed_files(out):  # Spark alone cannot infer a schema before
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ray.kill(client.subtask_actor("out", 1))  # after a commit; its open files stay on disk
    reads: list[tuple[str, dict[str, int]]] = []
    while client.status() not in ("FINISHED", "FAILED", "CANCELED"):
        reads.append(("rs.spark.read", files_and_rows(rs.spark.read(spark, out))))
        reads.append(("spark.read.parquet", files_and_rows(spark.read.parquet(out))))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1 and "died" in result.failures[0], result.failures

    final = committed_by_checkpoint(out)
    prefixes = [{}]
    for _, files in final:
        prefixes.append({**prefixes[-1], **files})
    seen_ids = []
    for how, files in reads:
        matches = [c for c, prefix in enumerate(prefixes) if prefix == files]
        assert matches, f"{how} read {len(files)} files, not a prefix of the commit log"
        seen_ids.append(matches[0])
    assert any(0 < c < len(final) for c in seen_ids), (seen_ids, len(final))  # mid-run reads
    last = arrow(rs.spark.read(spark, out))
    ids = np.sort(last.column("id").to_numpy())
    assert np.array_equal(ids, np.arange(N)), "the final output is every input once"


@pytest.mark.slow
def test_structured_streaming_follows_each_committed_checkpoint_once(spark, tmp_path):
    out = str(tmp_path / "out")
    client = running_job(tmp_path, out, partition_by="k")
    deadline = time.monotonic() + 120
    while not commit_log.committed_files(out):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stream = rs.spark.read_stream(spark, out).selectExpr("*", "input_file_name() AS f")
    query = (stream.writeStream.format("memory").queryName("follow")
             .trigger(processingTime="200 milliseconds").start())
    try:
        sizes = []
        while client.status() not in ("FINISHED", "FAILED", "CANCELED"):
            time.sleep(0.3)
            sizes.append(spark.table("follow").count())
        result = client.wait(timeout_s=240)
        query.processAllAvailable()
        followed = spark.table("follow")
        seen = files_and_rows(followed)
        table = arrow(followed.drop("f"))
    finally:
        query.stop()
    assert result.restarts == 0
    assert len(set(sizes)) >= 2, sizes  # the stream grew while the job ran
    committed = {f: rows for _, files in committed_by_checkpoint(out) for f, rows in files.items()}
    assert seen == committed  # every committed file once, whole, and nothing else
    order = np.argsort(table.column("id").to_numpy())
    i = np.arange(N)
    assert np.array_equal(table.column("id").to_numpy()[order], i)  # no duplicates, no loss
    assert np.array_equal(table.column("v").to_numpy()[order], numbered(i)["v"])
    assert np.array_equal(table.column("k").to_numpy()[order], numbered(i)["k"])  # partitions
