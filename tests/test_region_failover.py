"""Region failover on real Ray with real process kills (engine/regions.py, the job master's
``_restart_region``): a failure restarts the failed subtask's pipelined region alone
where the job has independent regions, and the whole job otherwise.

The embarrassingly parallel job reads two contiguous splits (rows below ``HALF`` go to
reader 0, the rest to reader 1: the static enumerator deals split k to reader k mod 2),
maps them and writes an exactly-once Parquet sink at parallelism 2: two regions, each
``numbers -> brake -> double -> pq[i]``, and the committer, which survives. A brake per
half keeps each region running until the test has placed its failure. The oracle is
pandas over the same row numbers; the commit log says which writer subtask and attempt
wrote each committed file.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import ray

import raystream as rs
from raystream.engine.failover import FailoverStrategy
from raystream.spark import commit_log
from raystream.spark.commit_log import read_committed
from tests.support.jobs import (checkpointed_env, progress, wait_for_checkpoint,
                                wait_until)
from tests.support.pacing import Brake

N = 6_000
HALF = N // 2
REGION_0 = "numbers -> brake -> double -> pq[0]"


def rows(i: np.ndarray) -> dict:
    return {"i": i, "v": i * 3 % 101}


def double(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch.column("i"), batch.column("v"), pc.multiply(batch.column("v"), 2)],
        names=["i", "v", "w"])


class HalfBrakes:
    """One brake for reader 0's rows (below ``HALF``), one for reader 1's."""

    def __init__(self, low: Brake, high: Brake) -> None:
        self.low, self.high = low, high

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        low = batch.num_rows and batch.column("i")[0].as_py() < HALF
        return (self.low if low else self.high)(batch)


def oracle() -> pd.DataFrame:
    i = np.arange(N)
    return pd.DataFrame({"i": i, "v": i * 3 % 101, "w": i * 3 % 101 * 2})


def assert_exact(path: str) -> None:
    out = read_committed(path).to_pandas().sort_values("i").reset_index(drop=True)
    assert not out["i"].duplicated().any(), "a row was committed twice"
    pd.testing.assert_frame_equal(out[["i", "v", "w"]], oracle(), check_dtype=False)


def region_job(tmp_path, *, failpoints=()) -> tuple[rs.StreamEnvironment, str, Brake, Brake]:
    env = checkpointed_env(str(tmp_path / "chk"), interval_s=0.2, failpoints=failpoints)
    assert env.failover is FailoverStrategy.REGION  # the default
    path = str(tmp_path / "out")
    low, high = Brake(str(tmp_path), 0.05), Brake(str(tmp_path), 0.05)
    env.from_sequence(N, rows, batch_size=50, num_splits=2, name="numbers").map_batches(
        HalfBrakes(low, high), name="brake").map_batches(double, name="double").sink_to_parquet(
        path, name="pq")
    return env, path, low, high


def state(client: rs.JobClient, operator: str, index: int) -> tuple[str, int]:
    """(actor id, attempt) of a subtask of the current attempt."""
    actor = client.subtask_actor(operator, index)
    return actor._actor_id.hex(), ray.get(actor.metrics.remote(), timeout=30)["attempt"]


def kill(client: rs.JobClient, operator: str, index: int) -> None:
    pid = ray.get(client.subtask_actor(operator, index).metrics.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)


def newest(client: rs.JobClient) -> int:
    """The newest completed checkpoint's id (0: none yet)."""
    completed = progress(client)["completed_checkpoints"]
    return completed[-1] if completed else 0


def committed_files(path: str) -> list[dict]:
    return [f for entry in commit_log.list_entries(path) for f in entry.files]


def test_a_kill_restarts_only_its_region_while_the_other_runs_and_commits(ray_session,
                                                                          tmp_path):
    env, path, low, high = region_job(tmp_path)
    client = env.execute_async("region-failover")
    wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    before = {name: state(client, *name) for name in [("pq", 1), ("pq-committer", 0)]}
    assert all(attempt == 0 for _, attempt in before.values())
    kill(client, "pq", 0)
    assert wait_until(client, lambda: bool(progress(client)["restores"]))
    restored = progress(client)["restores"][0]["checkpoint_id"]
    # a checkpoint completes with the restarted region, and is committed
    wait_for_checkpoint(client, after=newest(client))
    after = {name: state(client, *name) for name in before}
    assert after == before  # the same actors, running the same subtasks (attempt 0)
    assert state(client, "pq", 0)[1] == 1
    low.release(), high.release()
    result = client.wait(timeout_s=240)
    assert result.status == "FINISHED", result.error
    assert result.restarts == 1, result.failures
    assert result.restores[0]["region"] == [REGION_0], result.restores
    # timed by stage to the restarted writer's first record (its committer lived on)
    assert list(result.restores[0]["stages"]) == ["detected", "cancelled", "deployed",
                                                  "restored", "first_record"]
    files = committed_files(path)
    # the survivor's output after the restored checkpoint was committed by the committer
    # that ran through the restart; the failed attempt's after it never was
    assert any(f["subtask"] == 1 and f["attempt"] == 0 and f["checkpoint"] > restored
               for f in files)
    assert not any(f["subtask"] == 0 and f["attempt"] == 0 and f["checkpoint"] > restored
                   for f in files)
    assert any(f["subtask"] == 0 and f["attempt"] == 1 for f in files)
    assert_exact(path)


def test_a_restarted_reader_finishes_a_job_whose_other_region_has_finished(ray_session,
                                                                           tmp_path):
    """End of input in a region restart: the survivor ended its input (and its channel to
    the committer) before the kill; the restarted reader gets its split back from its
    restored state and the job still reaches FINISHED, exactly once."""
    env, path, low, high = region_job(tmp_path)
    high.release()
    client = env.execute_async("region-failover-finished")

    def survivor_finished() -> bool:  # (while the other region runs: it is deployed)
        unfinished = {u.subtask for u in client.diagnosis().unfinished}
        return REGION_0 in unfinished and REGION_0.replace("[0]", "[1]") not in unfinished

    assert wait_until(client, survivor_finished)
    wait_for_checkpoint(client, after=newest(client))
    kill(client, "pq", 0)
    assert wait_until(client, lambda: bool(progress(client)["restores"]))
    assert state(client, "pq", 1)[1] == 0  # the finished survivor was not restarted
    low.release()
    result = client.wait(timeout_s=240)
    assert result.status == "FINISHED", result.error
    assert result.restores[0]["region"] == [REGION_0], result.restores
    assert_exact(path)


def test_a_failure_during_the_region_restart_restarts_the_whole_job(ray_session, tmp_path):
    # the restarted region's subtask dies right after its restore (attempt 1)
    failpoint = rs.Failpoint("right_after_restore", operator="pq", subtask=0, attempt=1)
    env, path, low, high = region_job(tmp_path, failpoints=[failpoint])
    client = env.execute_async("region-failover-again")
    wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    kill(client, "pq", 0)
    assert wait_until(client, lambda: len(progress(client)["restores"]) == 2)
    low.release(), high.release()
    result = client.wait(timeout_s=240)
    assert result.status == "FINISHED", result.error
    assert result.restarts == 2, result.failures
    assert [r["region"] for r in result.restores] == [[REGION_0], []], result.restores
    assert_exact(path)


def test_a_kill_in_a_keyed_job_restarts_every_subtask(ray_session, tmp_path):
    from tests.support.functions import RunningSum
    from tests.support.inputs import N as SUM_N
    from tests.support.inputs import SPLITS, numbers
    from tests.support.oracles import assert_exactly_once
    from tests.support.pacing import Throttle

    env = checkpointed_env(str(tmp_path / "chk"))
    sink = env.from_sequence(SUM_N, numbers, batch_size=100, num_splits=SPLITS).map_batches(
        Throttle(0.03), name="throttle").key_by("k").process(
        RunningSum("heap"), name="sum").collect(name="out")
    client = env.execute_async("keyed-failover")
    wait_for_checkpoint(client, after=wait_for_checkpoint(client))
    kill(client, "sum", 1)
    result = client.wait(timeout_s=240)
    assert result.restarts == 1, result.failures
    assert result.restores[0]["region"] == [], result.restores  # every subtask
    assert len(result.restores[0]["restored_from"]) == env.plan().num_subtasks()
    assert_exactly_once(result.table(sink))
