"""Savepoints: taken while running, stop-with-savepoint, restore at another parallelism
(the restore on either state backend, heap and disk).

Oracle: the output committed before the savepoint plus the output of the job
restored from it equals, exactly once, what numpy computes for one run over
the whole input (``assert_exactly_once`` of tests/support/oracles.py).
"""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.checkpoint.watermark_floors import WatermarkFloors
from tests.support.jobs import env_at
from tests.support.oracles import assert_exactly_once
from tests.support.pipelines import build_job


def run_until_checkpoints(env: rs.StreamEnvironment, name: str, count: int = 2):
    sink = build_job(env)
    client = env.execute_async(name)
    deadline = time.monotonic() + 60
    while len(client.progress()["completed_checkpoints"]) < count:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return client, sink


def savepoint_metadata(path: str) -> dict:
    root = os.path.join(path, "savepoint")
    (chk,) = os.listdir(root)
    with open(os.path.join(root, chk, "_metadata")) as f:
        return json.load(f)["payload"]


@pytest.fixture(scope="module")
def stopped_at_parallelism_2(ray_session, tmp_path_factory):
    """``stopped(backend="heap")``: a job at parallelism 2 on the state backend ``backend``,
    stopped with a savepoint midway (one taken while running before), and what it
    committed; each backend's job runs once per module."""
    made = {}

    def stopped(backend: str = "heap"):
        if backend not in made:
            base = tmp_path_factory.mktemp(f"savepoints-{backend}")
            client, sink = run_until_checkpoints(
                env_at(2, str(base / "chk"), state_backend=backend), f"before-rescale-{backend}")
            running = client.savepoint(str(base / "while-running"))
            result = client.stop_with_savepoint(str(base / "stopped"))
            made[backend] = base, running, result, result.table(sink)
        return made[backend]
    return stopped


@pytest.mark.parametrize("backend, parallelism", [
    ("heap", 3), ("heap", 1), pytest.param("disk", 3, marks=pytest.mark.slow)],
    ids=["heap-3", "heap-1", "disk-3"])
def test_restore_at_another_parallelism_continues_exactly_once(stopped_at_parallelism_2,
                                                               backend, parallelism):
    base, _, first, committed_before = stopped_at_parallelism_2(backend)
    assert first.status == "FINISHED"
    assert 0 < committed_before.num_rows  # stopped midway: part of the input ...
    env = env_at(parallelism, str(base / f"chk-p{parallelism}"), state_backend=backend)
    sink = build_job(env)
    second = env.execute(f"after-rescale-{backend}-{parallelism}",
                         restore_from=str(base / "stopped"))
    # ... and the restored job commits exactly the rest.
    assert_exactly_once(pa.concat_tables([committed_before, second.table(sink)]))
    stopped_id = savepoint_metadata(str(base / "stopped"))["checkpoint_id"]
    assert min(c.checkpoint_id for c in second.checkpoints) > stopped_id  # ids keep rising


def test_savepoint_while_running_is_complete_but_commits_nothing(stopped_at_parallelism_2):
    base, running, first, _ = stopped_at_parallelism_2()
    assert running == str(base / "while-running")
    metadata = savepoint_metadata(running)
    assert metadata["hash_version"] == rs.HASH_VERSION
    assert metadata["max_parallelism"] == 128
    assert set(metadata["operators"]) >= {"numbers", "sum"}
    history = {c.checkpoint_id: c for c in first.checkpoints}
    assert history[metadata["checkpoint_id"]].savepoint == running
    # Its files live with the savepoint, outside checkpoint storage (never retained away).
    for files in metadata["operators"].values():
        for handle in files["operator_state"] + files["keyed_state"]:
            assert handle["path"].startswith(running)


def test_a_max_parallelism_change_is_refused(stopped_at_parallelism_2):
    base, _, _, _ = stopped_at_parallelism_2()
    env = env_at(2, str(base / "chk-maxp"), max_parallelism=64)
    build_job(env)
    with pytest.raises(rs.JobFailedError, match="max_parallelism 128.*has 64"):
        env.execute("other-max-parallelism", restore_from=str(base / "stopped"))


def test_a_damaged_savepoint_fails_the_restore_naming_its_file(stopped_at_parallelism_2,
                                                             tmp_path):
    base, _, _, _ = stopped_at_parallelism_2()
    (chk,) = (base / "stopped" / "savepoint").iterdir()
    victim = min(p for p in chk.iterdir() if p.suffix == ".keyed")
    intact = victim.read_bytes()
    damaged = bytearray(intact)
    damaged[len(damaged) // 2] ^= 0xFF
    victim.write_bytes(bytes(damaged))
    try:  # (the savepoint's metadata names its files by absolute path: damaged in place)
        env = env_at(2, str(tmp_path / "chk"))
        build_job(env)
        with pytest.raises(rs.JobFailedError, match=f"corrupt checkpoint file.*{victim.name}"):
            env.execute("from-a-damaged-savepoint", restore_from=str(base / "stopped"))
    finally:  # the module's other tests restore from it
        victim.write_bytes(intact)


@pytest.mark.slow
def test_stop_with_savepoint_and_drain_then_restore(ray_session, tmp_path):
    client, sink = run_until_checkpoints(env_at(2, str(tmp_path / "chk")), "drain")
    first = client.stop_with_savepoint(str(tmp_path / "drained"), drain=True)
    committed_before = first.table(sink)
    env = env_at(1, str(tmp_path / "chk-after"))
    sink_after = build_job(env)
    second = env.execute("after-drain", restore_from=str(tmp_path / "drained"))
    assert_exactly_once(pa.concat_tables([committed_before, second.table(sink_after)]))


@pytest.mark.slow
def test_event_time_does_not_go_back_after_a_restore(ray_session, tmp_path):
    from tests.support.functions import WatermarkProbe

    def ticks(i):
        return {"k": i % 13, "ts": 1_700_000_000_000 + i * 10}  # in order: no record is late

    def build(env: rs.StreamEnvironment, first_batch_s: float = 0.01) -> rs.SinkHandle:
        source = env.from_sequence(20_000, ticks, batch_size=100, num_splits=2,
                                   watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=50))
        waited = []  # (per subtask: its copy of the function)

        def slow(batch):
            time.sleep(0.01 if waited else first_batch_s)
            waited.append(True)
            return batch
        slowed = source.map_batches(slow, name="slow")
        return slowed.key_by("k").transform("probe", WatermarkProbe).collect(name="marks")

    env = env_at(2, str(tmp_path / "chk"))
    sink = build(env)
    client = env.execute_async("event-time")
    deadline = time.monotonic() + 60
    while len(client.progress()["completed_checkpoints"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = client.stop_with_savepoint(str(tmp_path / "sp")).table(sink).to_pylist()
    last = {}
    for row in before:  # the probe's watermark per subtask when the savepoint was taken
        last[row["subtask"]] = max(last.get(row["subtask"], rs.MIN_WATERMARK), row["watermark"])
    # per key group: the watermark of the subtask that owned it
    floors = WatermarkFloors.from_json(savepoint_metadata(str(tmp_path / "sp"))["watermarks"]["probe"],
                                       max_parallelism=128)
    for subtask, watermark in last.items():
        assert set(floors.of_groups(rs.key_group_range(subtask, 2, 128)).tolist()) == {watermark}
    restored = floors.minimum()
    assert restored == min(last.values()) > rs.MIN_WATERMARK

    env = env_at(1, str(tmp_path / "chk-after"))
    sink = build(env, first_batch_s=5.0)  # no record or watermark reaches the probe for 5 s
    client = env.execute_async("event-time-after", restore_from=str(tmp_path / "sp"))
    while client.status() in ("CREATED", "DEPLOYING"):
        time.sleep(0.01)
    # Before any record or watermark arrives, the restored subtask is already at the
    # checkpoint's event time (it would be MIN_WATERMARK until input came otherwise). Its
    # restore runs on its own thread once deployed: watch it until it has input.
    while True:
        metrics = ray.get(client.subtask_actor("probe", 0).metrics.remote())
        if metrics["watermark"] >= restored or metrics["records_in"]:
            break
        time.sleep(0.01)
    assert metrics["watermark"] >= restored and metrics["records_in"] == 0, metrics
    after = client.wait(timeout_s=120).table(sink).to_pylist()
    assert after and after[0]["watermark"] > restored  # watermarks resume above it
    assert after[-1]["late"] == 0
