"""The exactly-once collect sink (engine/operators/collect_sink.py): writer files, commit log,
restores, and the job's result.

By hand, the writer and committer operators run without Ray against real checkpoint
storage; the oracle is the rows written (numpy ranges): read back once each, in
checkpoint order. A real job then loses its committer mid-commit and still returns
every update exactly once (the numpy oracle ``assert_exactly_once`` of tests/support/oracles.py).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.operators.collect_sink import (CollectCommitter, CollectWriter,
                                                     read_collected)
from raystream.engine.operators.two_phase import CommitterOperator, SinkWriterOperator
from tests.support.functions import add
from tests.support.inputs import N, SPLITS, numbers
from tests.support.jobs import checkpointed_env
from tests.support.oracles import assert_exactly_once
from tests.support.pacing import Throttle

throttle = Throttle(0.02)

JOB_ID = "hand-00000001"


def ids(start: int, stop: int) -> pa.RecordBatch:
    return pa.record_batch({"id": np.arange(start, stop)})


class Writer:
    """A collect writer subtask run by hand."""

    def __init__(self, storage: str, subtask: int = 0, attempt: int = 0) -> None:
        self.op = SinkWriterOperator("out", CollectWriter(storage))
        self.output = CollectingOutput()
        self.op.setup(RuntimeContext("hand", "out", subtask, 2, 128, attempt, checkpointing=True,
                                     job_id=JOB_ID), self.output)
        self.op.initialize_state(None)
        self.op.open()

    def checkpoint(self, n: int, *, durable: bool = True):
        """Barrier n: its committables (one batch), and the snapshot's durable part."""
        self.op.prepare_snapshot_pre_barrier(n)
        snapshot = self.op.snapshot_state(n)
        make_durable = snapshot.make_durable if snapshot is not None else None
        if durable and make_durable is not None:
            make_durable()
        batches, self.output.batches = self.output.batches, []
        return batches, make_durable


def committer(storage: str, restored: RestoredState | None = None, attempt: int = 0,
              job_id: str = JOB_ID) -> CommitterOperator:
    op = CommitterOperator("out-committer", CollectCommitter(storage))
    op.setup(RuntimeContext("hand", "out-committer", 0, 1, 128, attempt, checkpointing=True,
                            job_id=job_id), CollectingOutput())
    op.initialize_state(restored)
    return op


def collected(storage: str, job_id: str = JOB_ID) -> list[int]:
    table = read_collected(storage, job_id, "out-committer")
    assert table is not None
    return table.column("id").to_pylist() if table.num_rows else []


def test_each_checkpoints_rows_are_one_file_committed_once_and_read_in_order(tmp_path):
    storage = str(tmp_path / "chk")
    writer, commit = Writer(storage), committer(storage)
    assert collected(storage) == []  # an empty sink is an empty table, not a missing one
    assert read_collected(storage, JOB_ID, "other") is None  # not a collect committer
    writer.op.process_batch(ids(0, 10))
    writer.op.process_batch(ids(10, 15))
    (batch,), _ = writer.checkpoint(1)
    assert batch.num_rows == 1  # one file for both batches
    commit.process_batch(batch)
    commit.snapshot_state(1)
    assert collected(storage) == []  # nothing before the checkpoint completes
    commit.notify_checkpoint_complete(1)
    assert collected(storage) == list(range(15))

    assert writer.checkpoint(2) == ([], None)  # nothing received: no file, no committable
    writer.op.process_batch(ids(15, 20))
    (batch,), _ = writer.checkpoint(3)
    commit.process_batch(batch)
    commit.snapshot_state(3)
    commit.notify_checkpoint_complete(3)
    commit.notify_checkpoint_complete(3)  # again: nothing new
    assert commit.commits == 2 and collected(storage) == list(range(20))
    files = sorted(os.listdir(tmp_path / "chk" / JOB_ID / "output" / "out"))
    assert files == ["1-0-0.arrow", "3-0-0.arrow"]


def test_a_restored_committer_commits_what_a_lost_notification_left_once(tmp_path):
    storage = str(tmp_path / "chk")
    writer, commit = Writer(storage), committer(storage)
    writer.op.process_batch(ids(0, 7))
    (batch,), _ = writer.checkpoint(1)
    commit.process_batch(batch)
    state = commit.snapshot_state(1).operator_state()  # checkpoint 1 completes; no notify
    again = committer(storage, RestoredState(1, [state]), attempt=1)
    assert again.commits == 1 and collected(storage) == list(range(7))
    third = committer(storage, RestoredState(1, [state]), attempt=2)  # restored once more
    assert third.commits == 0 and collected(storage) == list(range(7))


def test_a_run_restored_from_another_runs_snapshot_leaves_its_pending_rows_to_it(tmp_path):
    storage = str(tmp_path / "chk")
    writer, first_run = Writer(storage), committer(storage)
    writer.op.process_batch(ids(0, 5))
    (batch,), _ = writer.checkpoint(1)
    first_run.process_batch(batch)
    savepoint = first_run.snapshot_state(1).operator_state()
    second_run = committer(storage, RestoredState(1, [savepoint]), job_id="again-00000002")
    assert second_run.pending == {} and second_run.commits == 0
    assert collected(storage, "again-00000002") == []
    first_run.notify_checkpoint_complete(1)  # the first run commits its own rows
    assert collected(storage) == list(range(5))


def test_a_file_the_storage_refused_is_written_by_the_next_checkpoint(tmp_path):
    storage = str(tmp_path / "chk")
    writer, commit = Writer(storage), committer(storage)
    writer.op.process_batch(ids(0, 3))
    (first,), make_durable = writer.checkpoint(1, durable=False)
    away = tmp_path / "away"
    os.rename(storage, away)
    (tmp_path / "chk").write_text("not a directory")  # storage unwritable: declined
    assert make_durable is not None
    with pytest.raises(OSError):
        make_durable()
    os.unlink(storage)
    os.rename(away, storage)
    writer.op.process_batch(ids(3, 5))
    (second,), _ = writer.checkpoint(2)  # writes checkpoint 1's file too
    for batch in (first, second):
        commit.process_batch(batch)
    commit.snapshot_state(2)
    commit.notify_checkpoint_complete(2)
    assert collected(storage) == list(range(5))


def test_a_commit_rides_out_storage_that_is_away_for_a_moment(tmp_path):
    """The completion of a checkpoint and its commit are apart: storage going away in
    between must not fail the job over when it comes back soon (the commit retries)."""
    storage = str(tmp_path / "chk")
    writer, commit = Writer(storage), committer(storage)
    writer.op.process_batch(ids(0, 4))
    (batch,), _ = writer.checkpoint(1)
    commit.process_batch(batch)
    commit.snapshot_state(1)
    away = tmp_path / "away"
    os.rename(storage, away)
    (tmp_path / "chk").write_text("not a directory")

    def back() -> None:
        os.unlink(storage)
        os.rename(away, storage)
    returns = threading.Timer(0.3, back)
    returns.start()
    try:
        commit.notify_checkpoint_complete(1)
    finally:
        returns.join()
    assert commit.commits == 1 and collected(storage) == list(range(4))


@pytest.mark.slow
def test_a_committer_killed_mid_commit_still_returns_every_row_once(ray_session, tmp_path):
    failpoints = [rs.Failpoint("mid_commit", operator="out-committer", hit=2)]
    env = checkpointed_env(str(tmp_path / "chk"), failpoints=failpoints)
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    running = source.map_batches(throttle, name="throttle").key_by("k").reduce(add, name="sum")
    sink = running.collect(name="out")
    empty = running.filter_batches(lambda b: pa.array(np.zeros(b.num_rows, bool)),
                                   name="none").collect(name="nothing")
    result = env.execute("collect-mid-commit")
    assert result.restarts == 1 and "out-committer" in result.failures[0], result.failures
    table = result.table(sink)
    assert_exactly_once(table)
    assert result.count(sink) == table.num_rows == N
    assert result.table(empty).num_rows == 0
