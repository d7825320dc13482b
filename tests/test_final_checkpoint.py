"""The final checkpoint (FLIP-147) fails, and the job still ends.

Once every subtask has finished, the job ends with its final checkpoint, which
commits the tail of the output. When that checkpoint failed, its retry waited
``interval_s`` after the last trigger, and the periodic checkpoints, triggered
first at every interval, reset that clock: the job stayed RUNNING with
checkpoints completing, forever (chaos seed 64, whose final checkpoint a
SIGKILL cut short). Failpoints with ``final=True`` fail exactly that
checkpoint. After it, only the final checkpoint may be triggered again (a
periodic one would hold it back), and the output is checked against numpy;
each test's deadline is its liveness check.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import raystream as rs
from tests.support.jobs import checkpointed_env

N, KEYS = 3_000, 7


def numbers(i: np.ndarray) -> dict:
    return {"k": i % KEYS, "v": i + 1}  # positive: every running sum of a key differs


def add(acc: dict, row: dict) -> dict:
    return {"k": row["k"], "v": acc["v"] + row["v"]}


def run(storage: str, failpoint: rs.Failpoint,
        interval_s: float = 0.25) -> tuple[rs.JobResult, pa.Table]:
    env = checkpointed_env(storage, failpoints=[failpoint], interval_s=interval_s)
    sink = env.from_sequence(N, numbers, batch_size=250, num_splits=4).key_by("k").reduce(
        add, name="sum").collect()
    result = env.execute("final-checkpoint")
    return result, result.table(sink)


def assert_each_update_once(table: pa.Table) -> None:
    """Each input row's update of its key's sum is in the output once: per key, as many
    distinct running sums as rows, ending at numpy's sum."""
    frame = table.to_pandas()
    i = np.arange(N)
    counts = np.bincount(i % KEYS)
    sums = np.bincount(i % KEYS, weights=i + 1).astype(np.int64)
    assert len(frame) == N
    by_key = frame.groupby("k")["v"]
    assert by_key.nunique().to_dict() == dict(enumerate(counts.tolist()))
    assert by_key.max().to_dict() == dict(enumerate(sums.tolist()))


def statuses(result: rs.JobResult) -> list[str]:
    return [str(c.status) for c in sorted(result.checkpoints, key=lambda c: c.checkpoint_id)]


@pytest.mark.deadline(60)
def test_a_final_checkpoint_declined_once_is_taken_again_and_the_job_finishes(
        ray_session, tmp_path):
    result, table = run(str(tmp_path / "ckpt"), rs.Failpoint(
        "in_async_write", operator="sum", subtask=0, action="raise", final=True))
    assert result.status == "FINISHED" and result.restarts == 0
    # the declined final checkpoint, then (at the interval) only the final one again
    assert statuses(result)[-2:] == ["ABORTED", "COMPLETED"]
    assert statuses(result).count("ABORTED") == 1
    assert_each_update_once(table)


@pytest.mark.deadline(60)
def test_a_subtask_killed_in_the_final_checkpoint_restarts_and_the_job_finishes(
        ray_session, tmp_path):
    # an interval the job ends well within: its only checkpoints are final ones
    result, table = run(str(tmp_path / "ckpt"), rs.Failpoint(
        "in_snapshot", operator="sum", subtask=1, action="exit", final=True), interval_s=30)
    assert result.status == "FINISHED" and result.restarts == 1
    # the restarted attempt's final checkpoint goes at once, not an interval after the
    # one the kill cut short (which the periodic trigger would keep putting off)
    assert statuses(result) == ["ABORTED", "COMPLETED"]
    assert_each_update_once(table)
