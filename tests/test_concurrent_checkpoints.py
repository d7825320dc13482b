"""Aligned checkpoints with ``max_concurrent=2`` under skew.

Barrier n+1 is announced on the control lane, ahead of the data before it;
its announcement must not abort checkpoint n where n is still aligning (it
sits behind n on every channel). Only a channel that announces n+1 without
ever having announced n shows that n can no longer align there.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import raystream as rs
from tests.support.functions import add
from tests.support.inputs import numbers
from tests.support.oracles import assert_exactly_once

N = 24_000


def skewed(batch: pa.RecordBatch) -> pa.RecordBatch:
    # the reader of the first half is slow: its downstream channels are backlogged
    time.sleep(0.06 if batch.column("i")[0].as_py() < N // 2 else 0.005)
    return batch


def running_sums(storage: str, transform, *, batch_size: int, credits: int = 8,
                 **checkpoints) -> tuple[rs.StreamEnvironment, rs.SinkHandle]:
    """Running sums per key of N numbers read in two splits, ``transform`` applied first."""
    env = rs.StreamEnvironment(
        parallelism=2, credits=credits,
        checkpoints=rs.CheckpointConfig(storage=storage, **checkpoints))
    source = env.from_sequence(N, numbers, batch_size=batch_size, num_splits=2, name="numbers")
    sink = source.map_batches(transform, name=transform.__name__).key_by("k") \
        .reduce(add, name="sum").collect(name="out")
    return env, sink


@pytest.mark.slow
def test_concurrent_aligned_checkpoints_complete_under_skew(ray_session, tmp_path):
    env, sink = running_sums(str(tmp_path), skewed, batch_size=200, credits=2,
                             interval_s=0.1, max_concurrent=2)
    result = env.execute("concurrent")
    assert_exactly_once(result.table(sink))
    completed = [c for c in result.checkpoints if c.status == "COMPLETED"]
    overtaken = [c.reason for c in result.checkpoints if "align" in c.reason]
    assert not overtaken, overtaken[:3]
    assert len(completed) >= 5, (len(completed), [c.reason for c in result.checkpoints][:5])


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.25)  # longer than the interval: triggers queue up behind each batch
    return batch


@pytest.mark.slow
def test_every_queued_trigger_is_its_own_checkpoint_in_a_source(ray_session, tmp_path):
    # With two checkpoints pending, a source busy with one batch finds the triggers of
    # both in its mailbox; taking only the newer sends barrier n+1 without barrier n,
    # and every downstream subtask must decline n.
    env, sink = running_sums(str(tmp_path), slow, batch_size=2_000,
                             interval_s=0.05, max_concurrent=2)
    result = env.execute("queued-triggers")
    assert_exactly_once(result.table(sink))
    # taken in order everywhere, none is declined, and none is overtaken (subsumed)
    not_completed = [(c.checkpoint_id, c.reason) for c in result.checkpoints
                     if c.status != "COMPLETED"]
    assert not not_completed, not_completed[:3]
    assert len(result.checkpoints) >= 5


@pytest.mark.slow
def test_savepoints_wait_for_a_free_slot_and_never_abort_a_checkpoint(ray_session, tmp_path):
    # max_concurrent=1: a savepoint requested while a periodic checkpoint is pending
    # waits for it (queued ahead of the next periodic one), as Flink's request decider
    # queues requests; the periodic one completes instead of being overtaken.
    env, sink = running_sums(str(tmp_path / "chk"), slow, batch_size=1_000,
                             interval_s=0.05, max_concurrent=1)
    client = env.execute_async("queued-savepoints")
    while not client.progress()["completed_checkpoints"]:
        time.sleep(0.02)
    paths = [client.savepoint(str(tmp_path / f"sp-{i}")) for i in range(3)]
    result = client.wait()
    assert_exactly_once(result.table(sink))
    rows = sorted(result.checkpoints, key=lambda c: c.checkpoint_id)
    assert [(c.checkpoint_id, c.reason) for c in rows if c.status != "COMPLETED"] == []
    assert sorted(c.savepoint for c in rows if c.savepoint) == sorted(paths)
    for before, after in zip(rows, rows[1:]):  # one at a time: triggered after the last ended
        ended_ms = before.trigger_ts_ms + before.duration_s * 1000
        assert after.trigger_ts_ms >= ended_ms - 5, (before, after)
