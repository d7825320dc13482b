"""A job on a three-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): a head
without CPUs and two workers. Subtasks spread over the workers within what their operators
ask for, the job master stays on the head, and a worker node lost after a completed
checkpoint costs a restore, never a row: the output is checked against numpy.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest
import ray
from ray.cluster_utils import Cluster

import raystream as rs
from tests.multinode.ray_clusters import machine_wide_ray_address_untouched

# Ray declares a lost node dead after about 8 s (its default is 15 s): in seconds, and
# still after the job has noticed its subtasks died and restarted them elsewhere.
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                 "health_check_timeout_ms": 500, "health_check_failure_threshold": 8,
                 "free_objects_period_milliseconds": 50}
NODE = {"object_store_memory": 150 * 1024 * 1024}
KEYS = 64


@pytest.fixture(scope="module")
def cluster():
    with machine_wide_ray_address_untouched():
        cluster = Cluster(initialize_head=True, head_node_args={
            **NODE, "num_cpus": 0, "_system_config": SYSTEM_CONFIG})
        cluster.add_node(**NODE, num_cpus=2)
        cluster.add_node(**NODE, num_cpus=2, resources={"writer_host": 4})
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
        ray.shutdown()
        cluster.shutdown()


def node_ids(cluster) -> dict[str, str]:
    """"head", "plain" and "writer_host" (the worker with that resource) -> node id."""
    ids = {"head": cluster.head_node.node_id}
    for node in ray.nodes():
        if node["Alive"] and node["NodeID"] != ids["head"]:
            ids["writer_host" if "writer_host" in node["Resources"] else "plain"] = node["NodeID"]
    return ids


def readings(index: np.ndarray) -> dict[str, np.ndarray]:
    return {"reading": index, "key": (index * 7) % KEYS, "value": 1 + index % 13}


def paced(rows_per_second: float):
    def pace(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(batch.num_rows / rows_per_second)
        return batch
    return pace


def add(total: dict, row: dict) -> dict:
    return {**row, "total": total["total"] + row["total"]}


def build(env: rs.StreamEnvironment, n: int, rows_per_second: float | None = None,
          writer_resources: dict | None = None) -> rs.SinkHandle:
    stream = env.from_sequence(n, readings, batch_size=500, num_splits=8, name="readings")
    if rows_per_second:
        stream = stream.map_batches(paced(rows_per_second / env.parallelism), name="pace")
    stream = stream.map_batches(lambda b: b.append_column("total", b["value"]), name="start")
    totals = stream.key_by("key").reduce(add, name="per-key")
    if writer_resources:
        totals = totals.map_batches(lambda b: b, name="writer").set_resources(
            resources=writer_resources)
    return totals.collect(name="out")


def assert_exactly_once(table: pa.Table, n: int) -> None:
    ids = np.sort(table["reading"].to_numpy())
    assert len(ids) == n and (ids == np.arange(n)).all(), "lost or duplicated rows"
    columns = readings(np.arange(n))
    expected = np.bincount(columns["key"], weights=columns["value"], minlength=KEYS)
    totals = table.group_by("key").aggregate([("total", "max")]).sort_by("key")
    assert (totals["total_max"].to_numpy() == expected).all()


def test_subtasks_spread_over_the_workers_within_their_resources(cluster):
    nodes = node_ids(cluster)
    env = rs.StreamEnvironment(parallelism=4)
    sink = build(env, 20_000, writer_resources={"writer_host": 1})
    client = env.execute_async("spread")
    placement = rs_wait_for_placement(client)
    result = client.wait()
    assert_exactly_once(result.table(sink), 20_000)

    assert placement.pop("job master") == nodes["head"]
    used = set(placement.values())
    assert nodes["head"] not in used  # the head has no CPU for subtasks
    assert {nodes["plain"], nodes["writer_host"]} <= used  # spread over both workers
    writers = {name: node for name, node in placement.items() if "writer" in name}
    assert len(writers) == 4 and set(writers.values()) == {nodes["writer_host"]}


def rs_wait_for_placement(client: rs.JobClient) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        placement = client.placement()
        if len(placement) > 1:
            return placement
        time.sleep(0.1)
    raise AssertionError("the job did not deploy")
