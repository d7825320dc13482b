"""The job master under failures of its own protocol steps: deployment, savepoints,
stopping, unwritable or corrupt checkpoint storage.

Real Ray, real processes: a subtask is lost by SIGKILL of its process. The oracle
is numpy over the same input (tests/test_exactly_once.assert_exactly_once), or
numpy's own count of what a filter keeps.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import raystream as rs
from raystream.engine.operators.base import Operator
from tests.test_exactly_once import (N, add, assert_exactly_once, build_job, checkpointed_env,
                                     numbers, throttle, wait_for_checkpoint)

DEPLOY_PAUSE_S = 4.0  # how long the armed operator keeps its subtask from starting


def test_an_empty_collect_sink_of_a_checkpointed_job_is_an_empty_table(ray_session, tmp_path):
    env = checkpointed_env(str(tmp_path / "chk"))
    source = env.from_sequence(N, numbers, batch_size=1000, num_splits=4, name="numbers")
    kept = source.filter_batches(lambda b: pc.greater(b["v"], N + 1), name="none")
    sink = kept.collect(name="empty")
    everything = source.collect(name="all")
    result = env.execute("empty-sink")
    expected = int((numbers(np.arange(N))["v"] > N + 1).sum())  # numpy: no row passes
    table = result.table(sink)
    assert expected == 0 and table.num_rows == expected
    assert table.schema == pa.schema([])  # nothing arrived, so no schema is known
    assert sorted(result.table(everything).column("i").to_pylist()) == list(range(N))


def test_a_savepoint_whose_trigger_fails_is_answered_with_the_error(ray_session, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("a regular file where the savepoint directory would go")
    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=0.25, storage=str(tmp_path / "chk"),
                                        tolerable_failures=0),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env)
    client = env.execute_async("savepoint-trigger-fails")
    wait_for_checkpoint(client)
    asked = time.monotonic()
    with pytest.raises(Exception, match="savepoint .* failed.*a-file"):
        client.savepoint(str(blocked / "sp"), timeout_s=30)
    assert time.monotonic() - asked < 20  # answered, not timed out
    result = client.wait(timeout_s=240)
    assert result.restarts == 0, result.failures  # a failed savepoint is no job failure
    assert_exactly_once(result.table(sink))


class SlowStart(Operator):
    """Passes batches on. Constructed while the file ``armed`` exists in ``directory``
    (once: the first construction takes the file), it writes its process id to ``pid``
    and keeps its subtask from starting for a while, so that the job is still deploying
    when the test kills that process."""

    def __init__(self, name: str, directory: str) -> None:
        super().__init__(name)
        try:
            os.rename(os.path.join(directory, "armed"), os.path.join(directory, "fired"))
        except FileNotFoundError:
            return
        with open(os.path.join(directory, "pid.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(directory, "pid.tmp"), os.path.join(directory, "pid"))
        time.sleep(DEPLOY_PAUSE_S)

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.output.emit(batch)


def build_slow_starting_job(env: rs.StreamEnvironment, directory: str) -> rs.SinkHandle:
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=4, name="numbers")
    started = source.transform("slow-start", functools.partial(SlowStart, directory=directory))
    running = started.map_batches(throttle, name="throttle").key_by("k").reduce(add, name="sum")
    return running.collect(name="out")


def kill_while_deploying(client: rs.JobClient, directory: str) -> None:
    """SIGKILL the armed operator's process while the job is still deploying."""
    pid_file = os.path.join(directory, "pid")
    deadline = time.monotonic() + 60
    while not os.path.exists(pid_file):
        assert time.monotonic() < deadline, "the armed subtask never started"
        time.sleep(0.01)
    assert client.status() in ("CREATED", "DEPLOYING")
    with open(pid_file) as f:
        os.kill(int(f.read()), signal.SIGKILL)


def test_a_subtask_killed_while_deploying_is_a_failure_the_restart_strategy_handles(
        ray_session, tmp_path):
    (tmp_path / "armed").touch()
    env = checkpointed_env(str(tmp_path / "chk"))
    sink = build_slow_starting_job(env, str(tmp_path))
    client = env.execute_async("killed-while-deploying")
    kill_while_deploying(client, str(tmp_path))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1, result.failures
    assert "died" in result.failures[0]
    assert_exactly_once(result.table(sink))


def test_a_subtask_killed_while_deploying_a_restore_at_parallelism_3_restarts_from_the_savepoint(
        ray_session, tmp_path):
    env = checkpointed_env(str(tmp_path / "chk"))
    sink = build_slow_starting_job(env, str(tmp_path))
    client = env.execute_async("before-the-stop")
    wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    before = client.stop_with_savepoint(str(tmp_path / "sp")).table(sink)
    assert 0 < before.num_rows

    (tmp_path / "armed").touch()
    env = checkpointed_env(str(tmp_path / "chk-after"), parallelism=3)
    sink = build_slow_starting_job(env, str(tmp_path))
    client = env.execute_async("restored-killed-while-deploying",
                               restore_from=str(tmp_path / "sp"))
    kill_while_deploying(client, str(tmp_path))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1, result.failures
    assert result.restores[0]["checkpoint_id"] is not None  # the savepoint, not a fresh start
    assert_exactly_once(pa.concat_tables([before, result.table(sink)]))


def held_while(flag: str, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Processing stops while the file ``flag`` exists (a stuck downstream: backpressure)."""
    while os.path.exists(flag):
        time.sleep(0.01)
    return batch


def test_a_stop_with_savepoint_that_times_out_resumes_the_sources(ray_session, tmp_path):
    flag = str(tmp_path / "hold")
    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=0.25, timeout_s=2.0,
                                        storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=4, name="numbers")
    running = source.map_batches(throttle, name="throttle").key_by("k").reduce(add, name="sum")
    sink = running.map_batches(functools.partial(held_while, flag), name="held").collect(
        name="out")
    client = env.execute_async("stop-times-out")
    wait_for_checkpoint(client)
    open(flag, "w").close()  # the savepoint's barrier cannot pass 'sum -> held' now
    with pytest.raises(Exception, match="savepoint .* failed: timed out"):
        client.stop_with_savepoint(str(tmp_path / "sp"), timeout_s=60)
    os.unlink(flag)
    result = client.wait(timeout_s=120)  # the sources went on: the job ends by itself
    assert result.restarts == 0, result.failures
    assert_exactly_once(result.table(sink))


def wait_for_records(client: rs.JobClient, chain: str, records: int) -> None:
    """Until the subtasks of ``chain`` (a chain's first operator) have taken ``records``."""
    deadline = time.monotonic() + 60
    while sum(m["records_in"] for name, m in client.metrics().items()
              if name.startswith(chain)) < records:
        assert time.monotonic() < deadline, client.metrics()
        time.sleep(0.02)


def test_a_failure_after_the_stop_savepoint_completed_restores_from_it(ray_session, tmp_path):
    # The stop savepoint is durable, then the job fails before anyone is told of it.
    env = rs.StreamEnvironment(
        parallelism=2,
        failpoints=[rs.Failpoint("after_metadata_before_notify", attempt=0, hit=1)],
        checkpoints=rs.CheckpointConfig(interval_s=60, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env)
    client = env.execute_async("fails-after-the-stop")
    wait_for_records(client, "sum", N // 10)  # none committed yet: no checkpoint so far
    with pytest.raises(Exception, match="is complete, but the job did not stop"):
        client.stop_with_savepoint(str(tmp_path / "sp"), timeout_s=60)
    result = client.wait(timeout_s=240)  # it went on from the savepoint, to the end
    savepoint = next(c for c in result.checkpoints if c.savepoint == str(tmp_path / "sp"))
    assert savepoint.status == "COMPLETED"
    assert result.restarts == 1 and "after_metadata_before_notify" in result.failures[0]
    assert result.restores[0]["checkpoint_id"] == savepoint.checkpoint_id
    assert os.listdir(tmp_path / "sp" / "savepoint")  # never deleted
    assert_exactly_once(result.table(sink))


def test_a_committer_dying_after_the_stop_savepoint_never_rolls_its_commit_back(
        ray_session, tmp_path):
    # The stop savepoint completes and its Parquet files are being committed when the
    # committer's process dies: the job must go on from the savepoint, not from before it.
    out = str(tmp_path / "parquet")
    env = rs.StreamEnvironment(
        parallelism=2,
        failpoints=[rs.Failpoint("mid_commit", operator="out-committer", attempt=0, hit=1)],
        checkpoints=rs.CheckpointConfig(interval_s=60, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env, out)
    client = env.execute_async("committer-dies-after-the-stop")
    wait_for_records(client, "sum", N // 10)
    with pytest.raises(Exception, match="is complete, but the job did not stop"):
        client.stop_with_savepoint(str(tmp_path / "sp"), timeout_s=60)
    result = client.wait(timeout_s=240)
    savepoint = next(c for c in result.checkpoints if c.savepoint == str(tmp_path / "sp"))
    assert result.restarts == 1 and "died" in result.failures[0], result.failures
    assert result.restores[0]["checkpoint_id"] == savepoint.checkpoint_id
    assert_exactly_once(result.table(sink))  # exactly the files in the commit log
