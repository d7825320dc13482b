"""The test support of tests/support, each piece once: pacing, and the deadline's diagnosis
of a job that does not end."""

from __future__ import annotations

import time

import pyarrow as pa

import raystream as rs
from raystream.actors.liveness import SubtaskLiveness
from tests.support import pacing
from tests.support.deadline import diagnose_and_cancel
from tests.support.jobs import wait_until


def test_a_brake_sleeps_per_batch_until_released(tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr(pacing.time, "sleep", slept.append)
    brake = pacing.Brake(str(tmp_path), seconds_per_batch=0.5)
    batch = pa.record_batch({"x": [1, 2]})
    assert brake(batch) is batch and slept == [0.5]
    brake.release()
    brake.release()  # idempotent
    assert brake(batch) is batch and slept == [0.5] and not brake.engaged


def test_a_job_that_does_not_end_is_diagnosed_and_cancelled(ray_session, tmp_path):
    """A job whose source never runs out: the diagnosis names every subtask (none has
    finished), says the source reads its split and the sum's channels are open; then the
    job is cancelled."""
    env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        interval_s=0.2, storage=str(tmp_path / "checkpoints")))
    slow = pacing.Throttle(0.05)
    (env.from_sequence(10**12, lambda i: {"k": i % 5, "v": i}, batch_size=10, num_splits=2,
                       name="numbers")
     .map_batches(slow, name="slow").key_by("k").reduce(lambda a, r: r, name="sum")
     .collect(name="out"))
    started = time.time()
    client = env.execute_async("never-ends")
    assert wait_until(client, lambda: bool(client.progress()["completed_checkpoints"]))
    diagnosis = client.diagnosis()
    answers = [s for s in diagnosis.unfinished if isinstance(s, SubtaskLiveness)]
    # every subtask answered and none has finished (chains are named by their operators)
    assert sorted((s.operator, s.index) for s in answers) == sorted(
        [(chain, i) for chain in ("numbers -> slow", "sum -> out") for i in range(2)]
        + [("out-committer", 0)]), diagnosis
    sources = [s for s in answers if s.operator == "numbers -> slow"]
    assert all(s.waiting_for == ("source 'numbers' reading 1 split(s)",) for s in sources)
    sums = [s for s in answers if s.operator == "sum -> out"]
    assert all(len(s.channels) == 2 and not s.inputs_ended for s in sums), diagnosis
    text = diagnose_and_cancel(started)
    assert "job never-ends: RUNNING" in text and text.count("not finished:") == 5, text
    assert client.wait(timeout_s=60).status == "CANCELED"



def test_waiting_on_a_job_gives_up_when_it_ends(ray_session):
    env = rs.StreamEnvironment(parallelism=1)
    env.from_sequence(100, lambda i: {"v": i}).collect()
    client = env.execute_async("short")
    assert not wait_until(client, lambda: False, timeout_s=60)  # it ended: no waiting on
    assert client.wait().status == "FINISHED"
