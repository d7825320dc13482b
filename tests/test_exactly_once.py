"""Exactly-once under real failures: kills of subtask actors and seeded failpoints.

The job (``build_job`` of tests/support/pipelines.py): a replayable sequence source
(4 splits) -> a throttle -> key_by -> a keyed running sum -> an exactly-once collect
sink, with checkpoints (the kill of a subtask on either state backend, heap and disk).
The oracle (``assert_exactly_once`` of tests/support/oracles.py)
is numpy over the same input: for every key, the updates are numbered 1..count exactly
once (nothing lost or doubled), each update's sum is the previous one plus exactly one
input of that key, and within a key the inputs of each source split are applied in
split order (no reordering).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
import ray

import raystream as rs
from tests.support.jobs import checkpointed_env, wait_for_checkpoint
from tests.support.oracles import assert_exactly_once
from tests.support.pipelines import build_job


@pytest.fixture
def storage(tmp_path):
    path = tmp_path / "checkpoints"
    yield str(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("backend", ["heap", pytest.param("disk", marks=pytest.mark.slow)])
def test_kill_of_a_subtask_after_a_checkpoint_is_exactly_once(ray_session, storage, backend):
    env = checkpointed_env(storage, state_backend=backend)
    sink = build_job(env)
    client = env.execute_async(f"kill-once-{backend}")
    completed = wait_for_checkpoint(client)
    if backend == "disk":  # each sum subtask reports its RocksDB's figures (keys it holds)
        sums = [m for name, m in client.metrics().items() if name.startswith("sum")]
        assert len(sums) == 2 and all(m["sum.rocksdb.estimate-num-keys"] > 0 for m in sums)
    ray.kill(client.subtask_actor("sum", 1))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1
    assert "died" in result.failures[0]
    (restore,) = result.restores
    assert restore["attempt"] == 1 and restore["checkpoint_id"] >= completed > 0
    assert restore["restore_s"] > 0
    # timed by stage up to the first record a sink processed, each no earlier than the last
    stages = restore["stages"]
    assert list(stages) == ["detected", "cancelled", "deployed", "restored", "first_record"]
    assert list(stages.values()) == sorted(stages.values())
    assert_exactly_once(result.table(sink))
    ids = [c.checkpoint_id for c in result.checkpoints]
    assert ids == sorted(set(ids)) and max(ids) > completed  # ids keep rising after the restore
    kept = sorted(d for d in os.listdir(os.path.join(storage, os.listdir(storage)[0]))
                  if d.startswith("chk-"))
    assert len(kept) <= 2 + 1  # retained completed checkpoints (+ at most one aborted)


@pytest.mark.slow
@pytest.mark.parametrize("sink_kind", ["collect", "parquet"])
def test_placed_failures_in_every_phase_are_exactly_once(ray_session, storage, tmp_path,
                                                         sink_kind):
    failpoints = [
        rs.Failpoint("in_processing", operator="sum", subtask=1, hit=5, attempt=0, action="raise"),
        rs.Failpoint("in_snapshot", operator="throttle", subtask=0, hit=2, attempt=1),
        rs.Failpoint("in_async_write", operator="sum", subtask=0, hit=2, attempt=2),
        rs.Failpoint("right_after_restore", operator="sum", subtask=1, attempt=3),
        rs.Failpoint("after_metadata_before_notify", attempt=4, hit=2),
    ]
    if sink_kind == "parquet":  # the committer dies between writing and publishing a log entry
        failpoints[4] = rs.Failpoint("mid_commit", operator="out-committer", attempt=4, hit=2)
    env = checkpointed_env(storage, failpoints=failpoints, attempts=10)
    sink = build_job(env, str(tmp_path / "parquet") if sink_kind == "parquet" else None)
    client = env.execute_async(f"placed-failures-{sink_kind}")
    deadline = time.monotonic() + 180
    while client.progress()["attempt"] < 5:
        assert time.monotonic() < deadline, client.progress()
        time.sleep(0.05)
    wait_for_checkpoint(client, after=max(client.progress()["completed_checkpoints"] or [0]))
    ray.kill(client.subtask_actor("throttle", 0))
    result = client.wait(timeout_s=240)
    assert result.restarts == 6, result.failures
    failures = result.failures
    assert "failpoint in_processing" in failures[0]
    assert all("died" in f for f in failures[1:4]), failures
    assert ("after_metadata_before_notify" in failures[4] if sink_kind == "collect"
            else "out-committer" in failures[4] and "died" in failures[4]), failures
    assert "died" in failures[5]
    assert_exactly_once(result.table(sink))  # parquet: exactly the files in the commit log


@pytest.mark.slow
def test_unwritable_storage_fails_the_job_at_start_naming_the_path(ray_session, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the checkpoint directory should be")
    storage = str(blocked / "checkpoints")
    env = checkpointed_env(storage, interval_s=0.1)
    build_job(env)
    started = time.monotonic()
    # on this machine: before Ray starts (engine/preflight.py)
    with pytest.raises(rs.JobSetupError, match=f"checkpoint storage {storage} is not writable"
                                               f".*NotADirectoryError"):
        env.execute("unwritable-at-start")
    assert time.monotonic() - started < 30


class StorageOutage:
    """The checkpoint storage directory is moved away and a regular file put in its
    place: every write below it fails (as root, permissions would not stop one)."""

    def __init__(self, storage: str) -> None:
        self.storage, self.away = storage, storage + "-away"

    def begin(self) -> None:
        os.rename(self.storage, self.away)
        with open(self.storage, "w") as f:
            f.write("not a directory")

    def end(self) -> None:
        os.unlink(self.storage)
        os.rename(self.away, self.storage)


@pytest.mark.slow
def test_a_short_storage_outage_declines_checkpoints_and_the_job_goes_on(ray_session, storage):
    env = rs.StreamEnvironment(
        parallelism=2,
        checkpoints=rs.CheckpointConfig(interval_s=0.1, storage=storage, retained=2,
                                        tolerable_failures=1000),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = build_job(env)
    client = env.execute_async("storage-outage")
    wait_for_checkpoint(client)
    outage = StorageOutage(storage)
    outage.begin()
    deadline = time.monotonic() + 60
    while sum(c.status == "ABORTED" for c in client.progress()["checkpoints"]) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert client.status() == "RUNNING"
    outage.end()  # storage is writable again: checkpoints complete again
    result = client.wait(timeout_s=240)
    aborted = [c for c in result.checkpoints if c.status == "ABORTED"]
    assert len(aborted) >= 3 and all("declined" in c.reason for c in aborted)
    assert result.checkpoints[-1].status == "COMPLETED"
    assert result.restarts == 0
    assert_exactly_once(result.table(sink))


@pytest.mark.slow
def test_storage_that_stays_unwritable_fails_the_job_with_the_cause(ray_session, storage):
    env = checkpointed_env(storage, interval_s=0.1, attempts=1)
    build_job(env)
    client = env.execute_async("storage-gone")
    wait_for_checkpoint(client)
    StorageOutage(storage).begin()
    started = time.monotonic()
    with pytest.raises(rs.JobFailedError) as failed:
        client.wait(timeout_s=120)
    message = str(failed.value)
    assert "4 checkpoints failed in a row (tolerable: 3)" in message  # the default
    assert "NotADirectoryError" in message and storage in message
    assert time.monotonic() - started < 60


def corrupt_a_keyed_state_file(checkpoint_dir: str, *, delete: bool = False) -> str:
    """Flip one byte of a keyed state file the checkpoint wrote (an incremental heap
    checkpoint's in the job's shared/, ``<id>-<name>.heap``, or one in its directory big
    enough to hold state), or delete it; its path."""
    own = [os.path.join(checkpoint_dir, f) for f in sorted(os.listdir(checkpoint_dir))
           if f.endswith(".keyed") and os.path.getsize(os.path.join(checkpoint_dir, f)) > 20]
    shared = os.path.join(os.path.dirname(checkpoint_dir), "shared")
    n = os.path.basename(checkpoint_dir).removeprefix("chk-")
    written = [os.path.join(shared, f) for f in sorted(os.listdir(shared))
               if f.startswith(f"{n}-") and f.endswith(".heap")] if os.path.isdir(shared) else []
    path = (written + own)[0]
    if delete:
        os.remove(path)
        return path
    with open(path, "r+b") as f:
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flipped byte", "deleted"])
def test_a_corrupt_latest_checkpoint_that_committed_output_fails_the_job_naming_the_file(
        ray_session, storage, damage):
    env = checkpointed_env(storage, interval_s=0.5)
    build_job(env)
    client = env.execute_async("corrupt")
    first = wait_for_checkpoint(client)
    latest = wait_for_checkpoint(client, after=first)
    path = corrupt_a_keyed_state_file(os.path.join(storage, client.job_id, f"chk-{latest}"),
                                      delete=damage == "deleted")
    ray.kill(client.subtask_actor("sum", 0))
    # Its output may be read already: restoring an older checkpoint would commit it twice.
    cause = "missing" if damage == "deleted" else "checksum mismatch"
    with pytest.raises(rs.JobFailedError, match=f"cannot restore.*{path}.*{cause}"):
        client.wait(timeout_s=240)


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_that_committed_nothing_falls_back_to_an_older_one(
        ray_session, storage):
    # The third checkpoint is durable, but the job fails before anyone is told of it, so
    # nothing was committed for it; the restart waits long enough to corrupt it meanwhile.
    env = rs.StreamEnvironment(
        parallelism=2,
        failpoints=[rs.Failpoint("after_metadata_before_notify", attempt=0, hit=3)],
        checkpoints=rs.CheckpointConfig(interval_s=0.25, storage=storage, retained=2),
        restart=rs.RestartStrategy.fixed_delay(3, 3.0))
    sink = build_job(env)
    client = env.execute_async("corrupt-uncommitted")
    deadline = time.monotonic() + 60
    while client.status() != "RESTARTING":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    job_dir = os.path.join(storage, client.job_id)
    durable = max(int(d[4:]) for d in os.listdir(job_dir)
                  if os.path.exists(os.path.join(job_dir, d, "_metadata")))
    corrupt_a_keyed_state_file(os.path.join(job_dir, f"chk-{durable}"))
    result = client.wait(timeout_s=240)
    assert result.restarts == 1 and "after_metadata_before_notify" in result.failures[0]
    statuses = {c.checkpoint_id: c.status for c in result.checkpoints}
    assert statuses[durable] == "CORRUPT"
    assert result.restores[0]["checkpoint_id"] < durable
    assert_exactly_once(result.table(sink))


@pytest.mark.slow
def test_the_job_fails_with_every_failure_named_when_restarts_run_out(ray_session, storage):
    failpoints = [rs.Failpoint("in_processing", operator="sum", subtask=0, hit=3, attempt=a,
                               action="raise") for a in range(3)]
    env = checkpointed_env(storage, attempts=2, failpoints=failpoints)
    build_job(env)
    with pytest.raises(rs.JobFailedError) as failed:
        env.execute("out-of-restarts")
    message = str(failed.value).split("Original traceback")[0]
    assert "restart attempts exhausted: 2" in message
    assert message.count("failpoint in_processing") == 3  # the last failure and both earlier ones
    assert "Earlier failures (restarted)" in message and failed.value.operator == "sum -> out"


def _pids(client: rs.JobClient, attempt: int) -> dict[tuple[str, int], int]:
    """Process id of every subtask, once all of them answer for ``attempt``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            pids = {}
            for chain in ("numbers", "sum", "out"):
                for index in range(2):
                    metrics = ray.get(client.subtask_actor(chain, index).metrics.remote())
                    if metrics["attempt"] != attempt:
                        raise ValueError("not yet")
                    pids[(chain, index)] = int(metrics["pid"])
            return pids
        except (ValueError, ray.exceptions.RayError):
            time.sleep(0.05)
    raise AssertionError(f"attempt {attempt} did not come up")


@pytest.mark.slow
def test_failover_reuses_the_live_actors_and_a_warm_spare(ray_session, storage):
    env = checkpointed_env(storage)
    sink = build_job(env)
    client = env.execute_async("reuse")
    wait_for_checkpoint(client)
    before = _pids(client, 0)
    ray.kill(client.subtask_actor("sum", 1))
    after = _pids(client, 1)
    result = client.wait(timeout_s=240)
    assert result.restarts == 1
    survivors = {key for key in before if before[key] != before[("sum", 1)]}
    assert survivors and all(after[key] == before[key] for key in survivors)  # same processes
    assert after[("sum", 1)] not in before.values()  # the spare (or a new actor) took over
    assert_exactly_once(result.table(sink))



def _attempt_running(client: rs.JobClient, attempt: int) -> None:
    """Wait until subtask 0 of ``sum`` answers for ``attempt``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if ray.get(client.subtask_actor("sum", 0).metrics.remote(), timeout=10)[
                    "attempt"] == attempt:
                return
        except (ValueError, ray.exceptions.RayError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"attempt {attempt} did not come up")


def test_a_failover_takes_its_next_warm_spare_from_the_drivers_pool(ray_session, storage):
    """The spare a failover used is replaced at once by an idle actor of the driver's pool
    (no process start while the job recovers), so a second failure right after the first
    finds one too: each failover leases one more idle actor. Exactly once throughout."""
    from raystream.engine import actor_pool

    warm_up = rs.StreamEnvironment(parallelism=3)
    build_job(warm_up)
    warm_up.execute("fill-the-pool")  # its 9 actors go back: the pool keeps 8 idle
    keeper = ray.get_actor(actor_pool.POOL.keeper_name(), namespace="raystream")
    env = checkpointed_env(storage, attempts=3, parallelism=1)
    sink = build_job(env)
    client = env.execute_async("spares")  # leases 3 actors and its first spare
    assert wait_for_checkpoint(client) > 0
    idle_before = ray.get(keeper.sizes.remote())[0]
    ray.kill(client.subtask_actor("sum", 0))
    _attempt_running(client, 1)
    ray.kill(client.subtask_actor("sum", 0))  # at once: attempt 1 has completed nothing
    _attempt_running(client, 2)
    deadline = time.monotonic() + 30  # (the master leases it once the attempt has started)
    while ray.get(keeper.sizes.remote())[0] > idle_before - 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    idle_after = ray.get(keeper.sizes.remote())[0]
    result = client.wait(timeout_s=240)
    assert result.restarts == 2
    assert idle_before >= 2 and idle_after == idle_before - 2  # one leased per failover
    assert_exactly_once(result.table(sink))
