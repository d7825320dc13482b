"""The job master under failures of its own protocol steps: deployment, savepoints,
stopping, unwritable or corrupt checkpoint storage.

Real Ray, real processes: a subtask is lost by SIGKILL of its process. The oracle
is numpy over the same input (``assert_exactly_once`` of tests/support/oracles.py), or
numpy's own count of what a filter keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import ray

import raystream as rs
from raystream.actors.operator import Operator
from raystream.engine.savepoint_failure import SavepointFailureCause
from tests.support.functions import add
from tests.support.inputs import N, numbers
from tests.support.jobs import checkpointed_env, wait_for_checkpoint
from tests.support.oracles import assert_exactly_once
from tests.support.pacing import Throttle
from tests.support.pipelines import build_job

throttle = Throttle(0.02)

DEPLOY_PAUSE_S = 4.0  # how long the armed operator keeps its subtask from starting


def test_an_empty_collect_sink_of_a_checkpointed_job_is_an_empty_table(ray_session, tmp_path):
    env = checkpointed_env(str(tmp_path / "chk"))
    source = env.from_sequence(N, numbers, batch_size=1000, num_splits=4, name="numbers")
    kept = source.filter_batches(lambda b: pc.greater(b["v"], N + 1), name="none")
    sink = kept.collect(name="empty")
    everything = source.collect(name="all")
    result = env.execute("empty-sink")
    expected = int((numbers(np.arange(N))["v"] > N + 1).sum())  # numpy: no row passes
    table, full = result.table(sink), result.table(everything)
    assert expected == 0 and table.num_rows == expected
    assert table.schema == full.schema  # the filter's output schema, though no row passed
    assert sorted(full.column("i").to_pylist()) == list(range(N))


@pytest.mark.slow
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
    with pytest.raises(rs.SavepointFailedError, match="savepoint .* failed.*a-file.*still "
                                                      "running"):
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    with pytest.raises(rs.SavepointFailedError, match=r"savepoint .* failed: checkpoint \d+ "
                                                      r"timed out") as raised:
        client.stop_with_savepoint(str(tmp_path / "sp"), timeout_s=60)
    assert raised.value.job_still_running and raised.value.retryable
    assert raised.value.cause is SavepointFailureCause.TIMED_OUT
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


@dataclasses.dataclass(frozen=True)
class StopStep:
    """A failure placed at one step of a stop with a savepoint (no periodic checkpoint
    runs, so the stop savepoint is the job's first checkpoint and every failpoint's first
    pass is the stop's). ``completes``: the step comes after the savepoint is durable."""

    point: str
    operator: str | None
    completes: bool


STOP_STEPS = {
    # a source takes the stop barrier (its sources are stopped now), then its process dies
    "source-snapshot": StopStep("in_snapshot", "numbers", completes=False),
    # the keyed operator's synchronous snapshot, then its background write
    "keyed-snapshot": StopStep("in_snapshot", "sum", completes=False),
    "keyed-write": StopStep("in_async_write", "sum", completes=False),
    # durable, and nobody told yet (the coordinator fails: raise, not exit)
    "after-metadata": StopStep("after_metadata_before_notify", None, completes=True),
    # its Parquet files half committed when the committer's process dies
    "mid-commit": StopStep("mid_commit", "out-committer", completes=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("step", list(STOP_STEPS))
def test_a_failure_at_each_step_of_a_stop_leaves_one_exact_output(ray_session, tmp_path, step):
    # Before the savepoint completes, the stop fails and the job goes on from where it was
    # (here: from the start, no checkpoint completed); after, the job goes on from the
    # savepoint, whose output is committed and never rolled back. Either way the caller
    # hears that the job did not stop, and the output is exact.
    where = STOP_STEPS[step]
    action = "raise" if where.operator is None else "exit"
    env = rs.StreamEnvironment(
        parallelism=2,
        failpoints=[rs.Failpoint(where.point, operator=where.operator, attempt=0, hit=1,
                                 action=action)],
        checkpoints=rs.CheckpointConfig(interval_s=600, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env, str(tmp_path / "parquet"))
    client = env.execute_async(f"fails-at-{step}")
    wait_for_records(client, "sum", N // 10)  # none committed yet: no checkpoint so far
    told = "is complete, but the job did not stop" if where.completes else "failed"
    with pytest.raises(rs.SavepointFailedError, match=told) as raised:
        client.stop_with_savepoint(str(tmp_path / "sp"), timeout_s=60)
    assert raised.value.job_still_running and "still running" in str(raised.value)
    # the same stop again: sensible unless its path holds the complete savepoint
    assert raised.value.retryable is not where.completes
    result = client.wait(timeout_s=240)  # it went on, to the end of its input
    assert result.restarts == 1, result.failures
    assert (where.point if action == "raise" else "died") in result.failures[0]
    savepoint = next(c for c in result.checkpoints if c.savepoint == str(tmp_path / "sp"))
    if where.completes:
        assert savepoint.status == "COMPLETED"
        assert result.restores[0]["checkpoint_id"] == savepoint.checkpoint_id
        assert os.listdir(tmp_path / "sp" / "savepoint")  # never deleted
    else:
        assert savepoint.status == "ABORTED"
        assert result.restores[0]["checkpoint_id"] is None
    assert_exactly_once(result.table(sink))  # exactly the files in the commit log


def test_a_stop_a_failover_cut_short_is_retried_and_then_refused_once_the_job_ended(
        ray_session, tmp_path):
    # The keyed operator's process dies in the stop savepoint's snapshot: the savepoint is
    # aborted and the job fails over. retry=1 asks again; the restored job stops with it.
    env = rs.StreamEnvironment(
        parallelism=2,
        failpoints=[rs.Failpoint("in_snapshot", operator="sum", attempt=0, hit=1,
                                 action="exit")],
        checkpoints=rs.CheckpointConfig(interval_s=600, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env)
    client = env.execute_async("stop-retried")
    wait_for_records(client, "sum", N // 10)
    savepoint = str(tmp_path / "sp")
    stopped = client.stop_with_savepoint(savepoint, timeout_s=120, retry=1)
    assert stopped.status == "FINISHED"
    assert stopped.restarts == 1 and "died" in stopped.failures[0], stopped.failures
    tries = [c.status for c in stopped.checkpoints if c.savepoint == savepoint]
    assert tries == ["ABORTED", "COMPLETED"], stopped.checkpoints
    with pytest.raises(rs.SavepointFailedError, match="no longer running") as raised:
        client.savepoint(str(tmp_path / "after"), retry=3)
    assert not raised.value.job_still_running and not raised.value.retryable
    rest = rs.StreamEnvironment(
        parallelism=3, checkpoints=rs.CheckpointConfig(interval_s=600,
                                                       storage=str(tmp_path / "chk")))
    rest_sink = build_job(rest)
    restored = rest.execute("stop-retried-rest", restore_from=savepoint)
    # (the retry may come as soon as the restored subtasks run: the stop committed nothing)
    parts = [stopped.table(sink), restored.table(rest_sink)]
    assert_exactly_once(pa.concat_tables([p for p in parts if p.num_columns]))


@pytest.mark.parametrize("point", ["master_stopping", "master_ended"])
def test_a_job_master_dying_at_the_end_of_a_stop_is_succeeded_by_one_that_stops_the_job(
        ray_session, tmp_path, point):
    # The stop savepoint is complete and committed when the master's process dies: right
    # after (master_stopping) or once the subtasks have stopped and the actors are handed
    # back, the outcome not published yet (master_ended). Its successor learns the job,
    # restores that savepoint (never an older checkpoint: its output is committed), and
    # takes the stop Ray retries on it. A job restored from the savepoint commits the rest.
    storage, savepoint = str(tmp_path / "chk"), str(tmp_path / "sp")

    def env_at(parallelism: int, failpoints: list[rs.Failpoint]) -> rs.StreamEnvironment:
        return rs.StreamEnvironment(
            parallelism=parallelism, failpoints=failpoints,
            checkpoints=rs.CheckpointConfig(interval_s=600, storage=storage),
            restart=rs.RestartStrategy.fixed_delay(3, 0.1))

    env = env_at(2, [rs.Failpoint(point, attempt=0)])
    sink = build_job(env)
    client = env.execute_async(f"master-dies-at-{point}")
    wait_for_records(client, "sum", N // 10)
    stopped = client.stop_with_savepoint(savepoint, timeout_s=120)
    assert stopped.status == "FINISHED"
    assert stopped.restarts == 1 and "job master" in stopped.failures[0], stopped.failures
    first, second = sorted(c.checkpoint_id for c in stopped.checkpoints
                           if c.savepoint == savepoint and c.status == "COMPLETED")
    assert stopped.restores[0]["checkpoint_id"] == first  # not from the beginning
    rest = env_at(3, [])
    rest_sink = build_job(rest)
    restored = rest.execute(f"after-{point}", restore_from=savepoint)
    assert min(c.checkpoint_id for c in restored.checkpoints) > second
    assert_exactly_once(pa.concat_tables([stopped.table(sink), restored.table(rest_sink)]))


def test_a_job_master_dying_once_it_published_the_outcome_is_succeeded_by_one_that_answers(
        ray_session, tmp_path):
    """The master's process ends right after it published the job's outcome, before the
    driver asked for it; Ray restarts it, and the driver's call goes to the successor,
    which learns the job from the driver's pool keeper and answers with that outcome (it
    had been told to forget the job, and the call waited on a master with none)."""
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=[rs.Failpoint("master_published")],
        checkpoints=rs.CheckpointConfig(interval_s=600, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env)
    client = env.execute_async("master-dies-published")
    first = master_pid(client)  # (the job runs for seconds: its throttle)
    deadline = time.monotonic() + 120
    while master_pid(client) in (first, None):  # until the successor answers
        assert time.monotonic() < deadline, "the master did not die and come back"
        time.sleep(0.1)
    result = client.wait(timeout_s=60)
    assert result.status == "FINISHED" and result.restarts == 0
    assert_exactly_once(result.table(sink))


def master_pid(client: rs.JobClient) -> int | None:
    """The process id of the job's master (None while it is restarting)."""
    try:
        return ray.get(client._master.__ray_call__.remote(lambda _: os.getpid()), timeout=10)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
