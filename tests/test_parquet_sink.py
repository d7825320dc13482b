"""The exactly-once Parquet sink (and its Avro files): writers, one committer, a commit log,
committed-only readers.

Jobs run on real Ray and write real files under ``tmp_path``. The oracle is
numpy over the same input: the committed rows (``read_committed``) are every
input row exactly once, with the values the generator computes — after a
kill of a writer, after a checkpoint whose notification never arrived, and
next to files of a failed checkpoint that stay on disk unlisted.
"""

from __future__ import annotations

import json
import os

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import raystream as rs
from raystream.core.failpoints import Failpoints, InjectedFailure
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.operators.file_sink import (ParquetCommitter, ParquetSinkConfig,
                                                  ParquetWriter)
from raystream.engine.formats import Avro
from raystream.engine.operators.two_phase import CommitterOperator, SinkWriterOperator
from raystream.spark import commit_log
from raystream.spark.commit_log import committed_files, read_committed
from tests.support.jobs import wait_for_checkpoint
from tests.support.pacing import Throttle

N = 24_000
SPLITS = 4
BASE_NS = 1_700_000_000_123_456_789  # sub-microsecond digits: truncated to us when written


def rows(i: np.ndarray) -> dict:
    return {"id": i, "k": i % 7, "v": i * 3 + 1,
            "ts": (BASE_NS + i * 1_001).astype("datetime64[ns]")}


throttle = Throttle(0.01)  # keeps the job running across several checkpoints


def assert_exactly_once(table: pa.Table, n: int = N) -> None:
    """Every input row once, with the generator's values (numpy oracle)."""
    index = np.arange(n)
    expected = rows(index)
    order = np.argsort(table.column("id").to_numpy())
    ids = table.column("id").to_numpy()[order]
    assert len(ids) == n and np.array_equal(ids, index), (
        f"{len(ids)} rows for {n}; duplicates: {len(ids) - len(np.unique(ids))}")
    for column in ("k", "v"):
        assert np.array_equal(table.column(column).to_numpy()[order], expected[column]), column
    assert table.schema.field("ts").type == pa.timestamp("us")
    ts = table.column("ts").cast(pa.int64()).to_numpy()[order]
    assert np.array_equal(ts, expected["ts"].astype("datetime64[us]").astype(np.int64))


def checkpointed_env(storage: str, *, failpoints=(),
                     interval_s: float = 0.25) -> rs.StreamEnvironment:
    return rs.StreamEnvironment(
        parallelism=2, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=interval_s, storage=storage, retained=2),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))


def build_job(env: rs.StreamEnvironment, out: str, **sink_options):
    source = env.from_sequence(N, rows, batch_size=200, num_splits=SPLITS, name="numbers")
    return source.map_batches(throttle, name="throttle").sink_to_parquet(out, **sink_options)


def run_killing_the_writer(env: rs.StreamEnvironment, name: str, *, writer: str) -> None:
    """Run the job, killing the first subtask of ``writer`` (the sink's writer operator)
    after its first checkpoint: it must restart once, for that death."""
    client = env.execute_async(name)
    wait_for_checkpoint(client)
    ray.kill(client.subtask_actor(writer, 0))
    result = client.wait(timeout_s=120)
    assert result.restarts == 1 and "died" in result.failures[0], result.failures


def parquet_files_on_disk(out: str) -> set[str]:
    return {os.path.join(root, f) for root, _, files in os.walk(out) for f in files
            if f.endswith(".parquet")}


def is_complete_parquet(path: str) -> bool:
    try:
        pq.ParquetFile(path)
        return True
    except pa.ArrowInvalid:  # still open when its subtask died: no footer
        return False


def attempt_of(path: str) -> int:
    return int(os.path.basename(path).split("-")[2])


# -- jobs on Ray ------------------------------------------------------------------------------


@pytest.mark.slow
def test_bounded_job_with_checkpoints_commits_every_row_once(ray_session, tmp_path):
    out = str(tmp_path / "out")
    env = checkpointed_env(str(tmp_path / "chk"))
    sink = build_job(env, out)
    result = env.execute("parquet-plain")
    assert result.restarts == 0
    committed = committed_files(out)
    assert_exactly_once(read_committed(out))
    assert_exactly_once(sink.read())
    assert set(committed) == parquet_files_on_disk(out)  # no failure: every file committed
    entries = commit_log.list_entries(out)
    assert len(entries) >= 2 and len({e.incarnation for e in entries}) == 1
    assert [e.checkpoint_id for e in entries] == sorted(e.checkpoint_id for e in entries)
    for path in committed:  # microseconds in the files themselves (Spark 3.5 rejects ns)
        assert pq.read_schema(path).field("ts").type == pa.timestamp("us")
        name = os.path.basename(path).removesuffix(".parquet").split("-")
        assert len(name) == 4 and name[2] == "0" and len(name[3]) == 32


@pytest.mark.slow
def test_kill_of_a_writer_after_a_checkpoint_is_exactly_once(ray_session, tmp_path):
    out = str(tmp_path / "out")
    env = checkpointed_env(str(tmp_path / "chk"))
    build_job(env, out)
    run_killing_the_writer(env, "parquet-kill", writer="parquet")
    assert_exactly_once(read_committed(out))
    committed, on_disk = set(committed_files(out)), parquet_files_on_disk(out)
    assert committed <= on_disk
    assert all(attempt_of(p) == 0 for p in on_disk - committed)  # left by the killed attempt


@pytest.mark.slow
def test_lost_notification_is_committed_on_restore(ray_session, tmp_path):
    out = str(tmp_path / "out")
    env = checkpointed_env(str(tmp_path / "chk"), failpoints=[
        rs.Failpoint("after_metadata_before_notify", attempt=0, hit=2)])
    build_job(env, out)
    result = env.execute("parquet-lost-notify")
    assert result.restarts == 1, result.failures
    assert "after_metadata_before_notify" in result.failures[0]
    assert_exactly_once(read_committed(out))
    entries = commit_log.list_entries(out)
    assert len({e.incarnation for e in entries}) == 1  # the same incarnation across the restart
    # The second checkpoint completed but nobody was told: only the restored committer
    # can have committed it, with files written by attempt 0.
    notified_never = [c.checkpoint_id for c in result.checkpoints if c.status == "COMPLETED"][1]
    second = [e for e in entries if e.checkpoint_id == notified_never]
    assert len(second) == 1 and second[0].files
    assert all(f["attempt"] == 0 for f in second[0].files)


@pytest.mark.slow
def test_files_of_a_failed_checkpoint_are_never_read(ray_session, tmp_path):
    out = str(tmp_path / "out")
    # Writer 0 closes its files and emits their committables for its second
    # checkpoint, then dies in the snapshot: that checkpoint never completes.
    env = checkpointed_env(str(tmp_path / "chk"), failpoints=[
        rs.Failpoint("in_snapshot", operator="parquet", subtask=0, hit=2, attempt=0)])
    build_job(env, out)
    result = env.execute("parquet-failed-checkpoint")
    assert result.restarts == 1 and "died" in result.failures[0], result.failures
    committed, on_disk = set(committed_files(out)), parquet_files_on_disk(out)
    leftovers = on_disk - committed
    assert leftovers and all(attempt_of(p) == 0 for p in leftovers)
    table = read_committed(out)
    assert_exactly_once(table)
    # The leftovers are complete Parquet files whose rows were produced again:
    # a reader that listed the directory would have read duplicates.
    complete = [pq.read_table(p).column("id") for p in leftovers if is_complete_parquet(p)]
    assert complete, "the failed checkpoint's files should be complete and on disk"
    again = np.concatenate([c.to_numpy() for c in complete])
    assert np.isin(again, table.column("id").to_numpy()).all()


def test_partitions_and_rolling_without_checkpoints(ray_session, tmp_path):
    """Parallelism 1: writer and committer chained in the source's subtask; commit at the end."""
    out = str(tmp_path / "out")
    n, per_file = 6_000, 250
    env = rs.StreamEnvironment(parallelism=1)

    def columns(i):
        return {"id": i, "k": i % 3, "cat": np.array(["a", "b/c"])[i % 2], "v": i * 2}

    sink = env.from_sequence(n, columns, batch_size=400, num_splits=4).sink_to_parquet(
        out, partition_by=["k", "cat"], max_rows_per_file=per_file)
    env.execute("parquet-partitions")
    table = sink.read()
    order = np.argsort(table.column("id").to_numpy())
    i = np.arange(n)
    assert np.array_equal(table.column("id").to_numpy()[order], i)
    assert np.array_equal(table.column("k").to_numpy()[order], i % 3)
    assert table.column("cat").to_numpy(zero_copy_only=False)[order].tolist() == \
        np.array(["a", "b/c"])[i % 2].tolist()
    assert np.array_equal(table.column("v").to_numpy()[order], i * 2)
    assert table.schema.field("k").type == pa.int64()
    expected_dirs = {f"k={k}/cat={c}" for k in range(3) for c in ("a", "b%2Fc")}
    files = committed_files(out)
    assert {os.path.relpath(os.path.dirname(p), out) for p in files} == expected_dirs
    assert all(os.path.isdir(os.path.join(out, d)) for d in expected_dirs)
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in files]
    assert max(sizes) <= per_file and len(files) >= n // per_file  # rolled
    assert "k" not in pq.read_schema(files[0]).names  # hive: the value is in the path only
    assert [e.checkpoint_id for e in commit_log.list_entries(out)] == [0]  # one commit at the end


# -- the committer and the log by hand ----------------------------------------------------------


def _written(tmp_path, n_rows: int = 10, checkpoint: int = 1, attempt: int = 0):
    """Run a writer by hand: returns (sink dir, committable batch)."""
    out = str(tmp_path / "out")
    writer = SinkWriterOperator("parquet", ParquetWriter(ParquetSinkConfig.of(out, None, 4, None)))
    output = CollectingOutput()
    writer.setup(RuntimeContext("hand", "parquet", 0, 1, 128, attempt, checkpointing=True), output)
    writer.initialize_state(None)
    writer.open()
    writer.process_batch(pa.record_batch(rows(np.arange(n_rows))))
    writer.prepare_snapshot_pre_barrier(checkpoint)
    (batch,) = output.batches
    return out, batch


def _committer(out: str, restored: RestoredState | None = None, attempt: int = 0):
    committer = CommitterOperator("parquet-committer", ParquetCommitter(out))
    committer.setup(RuntimeContext("hand", "parquet-committer", 0, 1, 128, attempt,
                                   checkpointing=True, job_id="hand-0001"), CollectingOutput())
    committer.initialize_state(restored)
    return committer


def _log(out: str) -> dict[str, bytes]:
    log_dir = os.path.join(out, commit_log.LOG_DIR)
    if not os.path.isdir(log_dir):
        return {}
    return {f: open(os.path.join(log_dir, f), "rb").read() for f in sorted(os.listdir(log_dir))}


def test_committing_the_same_checkpoint_twice_is_a_no_op(tmp_path):
    out, batch = _written(tmp_path)
    assert batch.num_rows == 3  # 10 rows rolled at 4 rows per file
    committer = _committer(out)
    committer.process_batch(batch)
    state = committer.snapshot_state(1).operator_state()
    assert committed_files(out) == []  # nothing before the checkpoint completes
    committer.notify_checkpoint_complete(1)
    first = _log(out)
    assert len(first) == 1 and committer.commits == 1
    files = committed_files(out)
    written = [json.loads(c)["path"] for c in batch.column("committable").to_pylist()]
    assert sorted(files) == sorted(os.path.join(out, p) for p in written)

    committer.notify_checkpoint_complete(1)  # again: nothing new
    committer.notify_checkpoint_complete(2)  # nothing pending: no entry
    entry = commit_log.list_entries(out)[0]
    assert not commit_log.write_entry(out, entry.incarnation, 1, entry.files[:1])
    restored = _committer(out, RestoredState(1, [state]), attempt=1)  # restore: re-commit no-op
    assert restored.incarnation == entry.incarnation and restored.commits == 0
    assert _log(out) == first
    assert committed_files(out) == files
    table = read_committed(out)
    assert sorted(table.column("id").to_pylist()) == list(range(10))


def test_restored_committables_are_committed_once_when_the_notification_was_lost(tmp_path):
    out, batch = _written(tmp_path)
    committer = _committer(out)
    committer.process_batch(batch)
    state = committer.snapshot_state(1).operator_state()  # checkpoint 1 completes; no notify
    assert _log(out) == {}
    again = _committer(out, RestoredState(1, [state]), attempt=1)
    assert again.commits == 1 and again.pending == {}
    after_first_restore = _log(out)
    assert list(after_first_restore) == [f"{again.incarnation}-1.json"]
    third = _committer(out, RestoredState(1, [state]), attempt=2)  # restored once more
    assert third.commits == 0 and _log(out) == after_first_restore
    assert sorted(read_committed(out).column("id").to_pylist()) == list(range(10))


def test_a_failure_mid_commit_leaves_no_entry_and_the_restore_commits(tmp_path):
    out, batch = _written(tmp_path)
    committer = _committer(out)
    committer.failpoints = Failpoints((rs.Failpoint("mid_commit", action="raise"),),
                                      "parquet-committer", 0, 0)
    committer.process_batch(batch)
    state = committer.snapshot_state(1).operator_state()
    with pytest.raises(InjectedFailure):
        committer.notify_checkpoint_complete(1)
    assert _log(out) == {} and committed_files(out) == []
    # A crash leaves a temporary entry behind; stray data files lie around too.
    log_dir = os.path.join(out, commit_log.LOG_DIR)
    with open(os.path.join(log_dir, f".{committer.incarnation}-1.json.tmp-x"), "w") as f:
        f.write('{"format": 1')
    pq.write_table(pa.table(rows(np.arange(3))), os.path.join(out, "9-0-0-stray.parquet"))
    assert committed_files(out) == [] and read_committed(out).num_rows == 0
    restored = _committer(out, RestoredState(1, [state]), attempt=1)
    assert restored.commits == 1
    assert sorted(read_committed(out).column("id").to_pylist()) == list(range(10))
    assert not any("stray" in p for p in committed_files(out))


def test_restoring_an_older_checkpoint_truncates_newer_entries(tmp_path):
    out, first = _written(tmp_path, checkpoint=1)
    committer = _committer(out)
    committer.process_batch(first)
    state_1 = committer.snapshot_state(1).operator_state()
    committer.notify_checkpoint_complete(1)
    writer_out, second = _written(tmp_path, n_rows=6, checkpoint=2)
    committer.process_batch(second)
    committer.snapshot_state(2)
    committer.notify_checkpoint_complete(2)
    assert [e.checkpoint_id for e in commit_log.list_entries(out)] == [1, 2]
    _committer(out, RestoredState(1, [state_1]), attempt=1)  # back to checkpoint 1
    assert [e.checkpoint_id for e in commit_log.list_entries(out)] == [1]
    assert len(committed_files(out)) == first.num_rows


def test_log_entries_are_checksummed(tmp_path):
    out, batch = _written(tmp_path)
    committer = _committer(out)
    committer.process_batch(batch)
    committer.snapshot_state(1)
    committer.notify_checkpoint_complete(1)
    (name,) = _log(out)
    path = os.path.join(out, commit_log.LOG_DIR, name)
    doc = json.load(open(path))
    doc["payload"]["files"][0]["rows"] += 1
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(commit_log.CorruptCommitLogError, match="checksum"):
        committed_files(out)


def test_object_store_path_writes_each_entry_with_one_put(tmp_path):
    """A filesystem that is not LocalFileSystem takes the object-store branch (no rename)."""
    import pyarrow.fs as pafs

    loc = commit_log.Location(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()),
                              "out", is_local=False)
    files = [{"path": "1-0-0-a.parquet", "rows": 1, "bytes": 10}]
    assert commit_log.write_entry(loc, "obj-000000000001", 1, files)
    assert not commit_log.write_entry(loc, "obj-000000000001", 1, files + files)
    assert os.listdir(tmp_path / "out" / commit_log.LOG_DIR) == ["obj-000000000001-1.json"]
    assert [f["path"] for f in commit_log.committed_file_entries(loc)] == ["1-0-0-a.parquet"]
    assert commit_log.truncate_entries(loc, "obj-000000000001", above=0) == [1]
    assert commit_log.list_entries(loc) == []


# -- Avro files -----------------------------------------------------------------------------
ROWS_AVRO = {"type": "record", "name": "Row", "fields": [
    {"name": "id", "type": "long"}, {"name": "k", "type": "long"}, {"name": "v", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}}]}


def test_avro_files_are_written_committed_and_read_as_fastavro_reads_them(tmp_path):
    """A writer and a committer by hand: Avro container files rolled at 4 rows and
    partitioned by ``k`` (in the directory names), committed once; what fastavro reads
    from the committed files (the oracle) is the rows written, and so is read_committed."""
    out = str(tmp_path / "out")
    config = ParquetSinkConfig.of(out, ["k"], 4, None, avro=Avro(
        {**ROWS_AVRO, "fields": [f for f in ROWS_AVRO["fields"] if f["name"] != "k"]}))
    writer = SinkWriterOperator("avro", ParquetWriter(config))
    output = CollectingOutput()
    writer.setup(RuntimeContext("hand", "avro", 0, 1, 128, 0, checkpointing=True), output)
    writer.initialize_state(None)
    writer.open()
    writer.process_batch(pa.record_batch(rows(np.arange(30))))
    writer.prepare_snapshot_pre_barrier(1)
    (batch,) = output.batches
    committer = _committer(out)
    committer.process_batch(batch)
    committer.snapshot_state(1)
    committer.notify_checkpoint_complete(1)

    files = committed_files(out)
    assert files and all(p.endswith(".avro") for p in files)
    oracle = []
    for path in files:
        with open(path, "rb") as f:
            records = list(fastavro.reader(f))
        assert 0 < len(records) <= 4 and "k" not in records[0]  # rolled; k is in the path
        k = int(os.path.basename(os.path.dirname(path)).removeprefix("k="))
        oracle += [{**r, "k": k} for r in records]
    expected = rows(np.arange(30))
    us = expected["ts"].astype("datetime64[us]").astype(object)  # truncated to the schema's us
    assert sorted(oracle, key=lambda r: r["id"]) == [
        {"id": i, "k": i % 7, "v": i * 3 + 1, "ts": us[i]} for i in range(30)]
    table = read_committed(out).sort_by("id")
    assert table.schema.field("ts").type == pa.timestamp("us")
    assert table.select(["id", "k", "v", "ts"]).to_pylist() == [
        {"id": i, "k": i % 7, "v": i * 3 + 1, "ts": us[i]} for i in range(30)]


@pytest.mark.slow
def test_kill_of_an_avro_writer_after_a_checkpoint_is_exactly_once(ray_session, tmp_path):
    out = str(tmp_path / "out")
    env = checkpointed_env(str(tmp_path / "chk"))
    source = env.from_sequence(N, rows, batch_size=200, num_splits=SPLITS, name="numbers")
    sink = source.map_batches(throttle, name="throttle").sink_to_avro(out, ROWS_AVRO)
    run_killing_the_writer(env, "avro-kill", writer="avro")
    assert_exactly_once(read_committed(out))
    assert_exactly_once(sink.read())
    # the committed files, as fastavro reads them, are every row once too
    ids = []
    for path in committed_files(out):
        with open(path, "rb") as f:
            ids += [r["id"] for r in fastavro.reader(f)]
    assert sorted(ids) == list(range(N))
