"""Driving test jobs: environments with checkpoints, waiting on conditions (never on
sleeps), savepoint chains across parallelisms, and the processes of subtasks to kill."""

from __future__ import annotations

import time
from typing import Any, Callable

import ray

import raystream as rs

POLL_S = 0.02


def checkpointed_env(storage: str, *, interval_s: float = 0.25, attempts: int = 3,
                     failpoints=(), parallelism: int = 2) -> rs.StreamEnvironment:
    """An environment with checkpoints into ``storage`` (two retained) and a fixed-delay
    restart strategy of ``attempts`` attempts."""
    return rs.StreamEnvironment(
        parallelism=parallelism, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=interval_s, storage=storage, retained=2),
        restart=rs.RestartStrategy.fixed_delay(attempts, 0.1))


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
