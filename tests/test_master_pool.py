"""The driver's warm job master (engine/master_pool.py): the next job runs on a master
process started before it was submitted, and a warm master that dies while idle costs the
next job nothing (no failure, no restart, the same output)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pyarrow as pa
import ray

import raystream as rs
from tests.support.jobs import checkpointed_env

N, KEYS = 3_000, 7


def numbers(i: np.ndarray) -> dict:
    return {"k": i % KEYS, "v": i}


def add(acc: dict, row: dict) -> dict:
    return {"k": row["k"], "v": acc["v"] + row["v"]}


def oracle() -> dict[int, int]:
    """The final sum of each key, by numpy."""
    i = np.arange(N)
    return dict(enumerate(np.bincount(i % KEYS, weights=i).astype(np.int64).tolist()))


def run_job(storage: str) -> tuple[rs.JobClient, rs.JobResult, pa.Table]:
    env = checkpointed_env(storage)
    sink = env.from_sequence(N, numbers, batch_size=250, num_splits=3).key_by("k").reduce(
        add).collect()
    client = env.execute_async("warm")
    result = client.wait(timeout_s=120)
    return client, result, result.table(sink)


def final_sums(table: pa.Table) -> dict[int, int]:
    frame = table.to_pandas()
    return frame.groupby("k")["v"].max().to_dict()


def idle_masters() -> list[int]:
    """The processes (pids) of the live job masters of this driver that wait for a job."""
    idle = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] != "raystream" or not actor["name"].startswith("raystream/master/"):
            continue
        try:
            progress = ray.get(ray.get_actor(actor["name"], namespace="raystream")
                               .progress.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ValueError):
            continue  # the master of a job that ended, killed meanwhile
        if progress["status"] == "CREATED":
            idle.append(progress["master_pid"])
    return idle


def test_a_job_runs_on_the_master_started_before_it_and_a_warm_master_killed_while_idle_costs_nothing(
        ray_session, tmp_path):
    _, _, table = run_job(str(tmp_path / "a"))
    assert final_sums(table) == oracle()
    [warm] = idle_masters()  # (the first job's master ended with it)

    second = rs.StreamEnvironment(parallelism=2)
    sink = second.from_sequence(N, numbers, num_splits=2).key_by("k").reduce(add).collect()
    client = second.execute_async("on-warm")
    assert client.progress()["master_pid"] == warm  # started before the job was
    assert final_sums(client.wait(timeout_s=120).table(sink)) == oracle()

    [idle] = idle_masters()
    os.kill(idle, signal.SIGKILL)  # while it waits for a job: Ray restarts it
    _, result, table = run_job(str(tmp_path / "c"))
    assert final_sums(table) == oracle()
    assert result.restarts == 0 and result.failures == [] and result.restores == []
