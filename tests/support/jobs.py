"""Driving test jobs: environments with checkpoints, waiting on conditions (never on
sleeps), savepoint chains across parallelisms, the processes of subtasks to kill, and
what a job did: the late records it dropped, the rows its Parquet sink committed, the
bytes in Ray's object store."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import ray

import raystream as rs
from raystream.spark.commit_log import read_committed

POLL_S = 0.02


def checkpointed_env(storage: str, *, interval_s: float = 0.25, attempts: int = 3,
                     failpoints=(), parallelism: int = 2,
                     state_backend: str | rs.HeapStateOptions | rs.DiskStateOptions = "heap"
                     ) -> rs.StreamEnvironment:
    """An environment with checkpoints into ``storage`` (two retained) on
    ``state_backend`` ("heap" or "disk") and a fixed-delay restart strategy of
    ``attempts`` attempts."""
    return rs.StreamEnvironment(
        parallelism=parallelism, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=interval_s, storage=storage, retained=2,
                                        state_backend=state_backend),
        restart=rs.RestartStrategy.fixed_delay(attempts, 0.1))


def env_at(parallelism: int, storage: str, max_parallelism: int = 128, *,
           state_backend: str = "heap") -> rs.StreamEnvironment:
    """An environment of ``parallelism`` with checkpoints into ``storage`` every 0.3 s, on
    ``state_backend`` ("heap" or "disk")."""
    return rs.StreamEnvironment(
        parallelism=parallelism, max_parallelism=max_parallelism,
        checkpoints=rs.CheckpointConfig(interval_s=0.3, storage=storage,
                                        state_backend=state_backend),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))


def disk_env(storage: str, parallelism: int = 2, *, incremental: bool = False
             ) -> rs.StreamEnvironment:
    """An environment on the disk state backend with checkpoints into ``storage`` (full,
    or ``incremental``; two retained)."""
    return rs.StreamEnvironment(
        parallelism=parallelism,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=storage, retained=2,
                                        state_backend=rs.DiskStateOptions(incremental=incremental)),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))


def progress(client: rs.JobClient) -> dict:
    """``client.progress()``, or what an ended job would show once its master is gone."""
    try:
        return client.progress()
    except Exception:  # the job master is gone: the job ended
        return {"attempt": 1 << 30, "completed_checkpoints": [], "status": "ENDED"}


def ended(client: rs.JobClient) -> bool:
    try:
        return client.status() in ("FINISHED", "FAILED", "CANCELED")
    except Exception:
        return True


def wait_until(client: rs.JobClient, condition: Callable[[], bool],
               timeout_s: float = 120) -> bool:
    """True once ``condition()`` holds; False if the job ended (or time ran out) first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if ended(client):
            return condition()
        time.sleep(POLL_S)
    return False


def wait_for_checkpoints(client: rs.JobClient, count: int) -> bool:
    """Wait for ``count`` more completed checkpoints than there are now (False: the job
    ended first)."""
    done = len(progress(client)["completed_checkpoints"])
    return wait_until(client,
                      lambda: len(progress(client)["completed_checkpoints"]) >= done + count)


def wait_for_checkpoint(client: rs.JobClient, after: int = 0, timeout_s: float = 60) -> int:
    """The id of the newest completed checkpoint once it is above ``after``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        completed = client.progress()["completed_checkpoints"]
        if completed and completed[-1] > after:
            return completed[-1]
        time.sleep(POLL_S)
    raise AssertionError(f"no checkpoint above {after} completed in {timeout_s:.0f} s")


def subtask_pid(client: rs.JobClient, operator: str, subtask: int, *,
                while_deploying: bool = False, timeout_s: float = 60) -> int | None:
    """The process id of subtask ``subtask`` of the chain holding ``operator`` (to SIGKILL
    it); None if the job ended first (or, ``while_deploying``, was deployed first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not ended(client):
        if while_deploying and client.status() not in ("CREATED", "DEPLOYING"):
            return None
        try:
            actor = client.subtask_actor(operator, subtask)
            metrics: dict = ray.get(actor.metrics.remote(), timeout=5)
            return metrics["pid"]
        except Exception:
            time.sleep(0.005)
    return None


def savepoint_chain(tmp_path, name: str,
                    job: Callable[[int], tuple[rs.StreamEnvironment, Any]]) -> list[tuple[Any, Any]]:
    """Run ``job(1)``, stop it with a savepoint once a checkpoint completed, restore it as
    ``job(2)`` and stop it again, restore it as ``job(3)`` and run it to the end: the three
    (job result, what ``job`` returned beside its environment, e.g. its sinks)."""
    runs, restore_from = [], None
    for parallelism in (1, 2, 3):
        env, sinks = job(parallelism)
        if parallelism < 3:
            client = env.execute_async(f"{name}-p{parallelism}", restore_from=restore_from)
            wait_for_checkpoint(client, after=0)
            restore_from = str(tmp_path / f"savepoint{parallelism}")
            runs.append((client.stop_with_savepoint(restore_from), sinks))
        else:
            runs.append((env.execute(f"{name}-p3", restore_from=restore_from), sinks))
    return runs


def rescaled_run(job: Callable[[int], tuple[rs.StreamEnvironment, Any]], tmp_path: Path,
                 name: str) -> pa.Table:
    """Run ``job(2)`` (an env and its sink) until a checkpoint completed, stop it with a
    savepoint and restore it as ``job(3)``: the output of both runs, the first stopped
    midway."""
    env, sink = job(2)
    client = env.execute_async(f"{name}-before-rescale")
    wait_for_checkpoint(client, after=1)
    first = client.stop_with_savepoint(str(tmp_path / "savepoint"))
    env, sink_after = job(3)
    second = env.execute(f"{name}-after-rescale", restore_from=str(tmp_path / "savepoint"))
    before, after = first.table(sink), second.table(sink_after)
    assert before.num_rows and after.num_rows, (before.num_rows, after.num_rows)  # midway
    return pa.concat_tables([before, after])


def run_through_a_kill(env: rs.StreamEnvironment, name: str, operator: str) -> Any:
    """Run job ``name``, kill subtask 1 of ``operator`` once a checkpoint has completed
    and wait for the end: the job's result, checked to have restarted once, from that
    checkpoint or a later one."""
    client = env.execute_async(name)
    completed = wait_for_checkpoint(client, after=1)
    ray.kill(client.subtask_actor(operator, 1))
    job = client.wait(timeout_s=240)
    assert job.restarts == 1, job.failures
    assert job.restores[0]["checkpoint_id"] >= completed
    return job


def cancel_after_a_checkpoint(client: rs.JobClient) -> dict:
    """Wait for one more completed checkpoint (it must commit nothing new), cancel the job
    and return its progress from before the cancel."""
    wait_for_checkpoint(client, after=max(client.progress()["completed_checkpoints"], default=0))
    before = client.progress()
    client.cancel()
    client.wait(timeout_s=60)
    return before


def committed_rows(out: Path) -> int:
    """The rows an exactly-once Parquet sink into ``out`` has committed so far."""
    return read_committed(str(out)).num_rows if (out / "_raystream_log").exists() else 0


def late_dropped(metrics: dict) -> int:
    """The late records a job's operators dropped, from its metrics."""
    return int(sum(v for m in metrics.values() for name, v in m.items()
                   if name.endswith("late_records_dropped")))


def object_store_bytes() -> int:
    """The bytes in use in this Ray cluster's object store."""
    # Ray's private API, imported here: should it move, only the tests that measure fail
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    state = get_state_from_address(ray.get_runtime_context().gcs_address)
    return get_memory_info_reply(state).store_stats.object_store_bytes_used
