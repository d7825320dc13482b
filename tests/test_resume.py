"""A job whose job master dies is taken over by a restarted master, exactly once; a job
that may not restart fails with a clear error instead, and resumes by name exactly once.

Real processes: the job master's process is killed with SIGKILL while the job
runs. The oracle is numpy over the same input (``assert_exactly_once`` of
tests/support/oracles.py) applied to everything the exactly-once Parquet sink
committed: nothing lost, nothing doubled.
"""

from __future__ import annotations

import os
import signal
import time

import pyarrow as pa
import pytest

import raystream as rs
from raystream.engine import registry
from raystream.engine.environment import run_defaults
from raystream.spark.commit_log import read_committed
from tests.support.functions import add
from tests.support.inputs import N, SPLITS, numbers
from tests.support.jobs import checkpointed_env, wait_for_checkpoint
from tests.support.oracles import assert_exactly_once


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.06)  # about 7 s of running: room for checkpoints and a kill
    return batch


def build_job(env: rs.StreamEnvironment, out: str) -> None:
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    (source.map_batches(slow, name="slow").key_by("k").reduce(add, name="sum")
     .sink_to_parquet(out, name="out"))


def kill_master(client: rs.JobClient) -> int:
    """SIGKILL the process of the job's master; its pid."""
    pid = client.progress()["master_pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.slow
def test_a_killed_job_master_is_restarted_and_the_job_ends_exactly_once(ray_session, tmp_path):
    storage, out = str(tmp_path / "checkpoints"), str(tmp_path / "out")
    env = checkpointed_env(storage)  # three restart attempts
    build_job(env, out)
    client = env.execute_async("taken-over")
    first = wait_for_checkpoint(client, timeout_s=120)
    kill_master(client)
    # the successor restores the newest completed checkpoint, and its own checkpoints follow
    second = wait_for_checkpoint(client, after=first, timeout_s=120)
    assert client.status() == "RUNNING", "the job ended before the second kill: slow it down"
    kill_master(client)
    result = client.wait(timeout_s=180)

    assert result.status == "FINISHED"
    taken_over = [r for r in result.restores if r["failure"] == "the job master's process died"]
    assert len(taken_over) == 2 and result.restarts >= 2
    assert taken_over[0]["checkpoint_id"] >= first and taken_over[1]["checkpoint_id"] >= second
    # attempts and checkpoint ids only grow across masters (a sink names its files by both)
    attempts = [r["attempt"] for r in result.restores]
    assert attempts == sorted(set(attempts))
    assert registry.find_job(client.job_id)["status"] == "FINISHED"
    assert_exactly_once(read_committed(out))


@pytest.mark.slow
def test_a_killed_job_master_of_a_job_without_restarts_fails_the_job_clearly_and_the_job_resumes_exactly_once(
        ray_session, tmp_path):
    storage, out = str(tmp_path / "checkpoints"), str(tmp_path / "out")
    env = checkpointed_env(storage, attempts=0)
    build_job(env, out)
    client = env.execute_async("resumable", resume=True)  # nothing to resume: from the start
    wait_for_checkpoint(client, after=1, timeout_s=120)
    assert client.status() == "RUNNING", "the job ended before the kill: slow it down"

    again = checkpointed_env(storage)
    build_job(again, out)
    with pytest.raises(rs.JobStillRunningError, match="still running"):
        again.execute_async("resumable", resume=True)

    progress = client.progress()
    kill_master(client)
    with pytest.raises(rs.JobFailedError, match=r"job master died.*resume=True"):
        client.wait(timeout_s=60)
    assert registry.find_job(client.job_id)["status"] == "FAILED"

    resumed = checkpointed_env(storage)
    build_job(resumed, out)
    with run_defaults(resume=True):  # what `raystream run --resume` sets
        result = resumed.execute("resumable")
    # checkpoint ids continue above the one restored (a fresh start would begin at 1, and
    # the first run's committed output would then be doubled: the oracle would fail)
    assert min(c.checkpoint_id for c in result.checkpoints) > progress["completed_checkpoints"][-1]
    assert_exactly_once(read_committed(out))


@pytest.mark.slow
def test_a_canceled_run_returns_what_it_committed_and_the_resumed_run_the_rest(
        ray_session, tmp_path):
    storage = str(tmp_path / "checkpoints")
    env = checkpointed_env(storage)
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    sink = source.map_batches(slow, name="slow").key_by("k").reduce(add, name="sum").collect(
        name="out")
    client = env.execute_async("canceled")
    wait_for_checkpoint(client, after=1, timeout_s=120)
    client.cancel()
    canceled = client.wait(timeout_s=60)
    assert canceled.status == "CANCELED"
    first = canceled.table(sink)
    assert 0 < first.num_rows < N

    again = checkpointed_env(storage)
    source = again.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    sink = source.map_batches(slow, name="slow").key_by("k").reduce(add, name="sum").collect(
        name="out")
    rest = again.execute("canceled", resume=True).table(sink)
    assert_exactly_once(pa.concat_tables([first, rest]))  # each update once, in one run


def test_a_canceled_run_without_checkpoints_says_its_collect_sink_holds_nothing(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    sink = source.map_batches(slow, name="slow").collect(name="out")
    client = env.execute_async("canceled-unchecked")
    while client.status() != "RUNNING":
        time.sleep(0.05)
    client.cancel()
    canceled = client.wait(timeout_s=60)
    with pytest.raises(ValueError, match="was canceled and .* committed nothing"):
        canceled.table(sink)


def test_resume_and_restore_from_together_are_refused(ray_session, tmp_path):
    env = checkpointed_env(str(tmp_path / "checkpoints"))
    build_job(env, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="pass one"):
        env.execute_async("both", resume=True, restore_from=str(tmp_path / "elsewhere"))
