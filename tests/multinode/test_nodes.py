"""A job on a three-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): a head
without CPUs and two workers. Subtasks spread over the workers within what their operators
ask for, the job master stays on the head, and a worker node lost after a completed
checkpoint costs a restore, never a row: the output is checked against numpy.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import ray
from ray.cluster_utils import Cluster

import raystream as rs
from raystream.actors.operator import Operator
from tests.multinode.ray_clusters import machine_wide_ray_address_untouched

# Ray declares a lost node dead after about 8 s (its default is 15 s): in seconds, and
# still after the job has noticed its subtasks died and restarted them elsewhere.
SYSTEM_CONFIG = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
                 "health_check_timeout_ms": 500, "health_check_failure_threshold": 8,
                 "free_objects_period_milliseconds": 50,
                 "metrics_report_interval_ms": 500}  # metrics reach Prometheus in 0.5 s
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


@pytest.mark.slow
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


def test_a_lost_worker_node_restores_its_subtasks_elsewhere_exactly_once(cluster, tmp_path):
    n = 100_000  # at 10,000 rows/s: still running when the node is lost
    env = rs.StreamEnvironment(
        parallelism=4,
        checkpoints=rs.CheckpointConfig(interval_s=0.3, storage=str(tmp_path / "checkpoints")),
        restart=rs.RestartStrategy.fixed_delay(attempts=3, delay_s=0.2))
    sink = build(env, n, rows_per_second=10_000)
    client = env.execute_async("node-loss")
    placement = rs_wait_for_placement(client)
    victim = next(node for node in cluster.worker_nodes
                  if node.node_id in set(placement.values()) - {placement["job master"]})
    lost = sorted(name for name, node in placement.items() if node == victim.node_id)
    deadline = time.monotonic() + 60
    while not client.progress()["completed_checkpoints"]:
        assert time.monotonic() < deadline, "no checkpoint completed"
        time.sleep(0.1)
    completed_before = max(client.progress()["completed_checkpoints"])

    cluster.remove_node(victim, allow_graceful=False)  # the whole node dies at once

    deadline = time.monotonic() + 120
    while (progress := client.progress())["attempt"] < 1 or progress["status"] != "RUNNING":
        assert progress["status"] not in ("FAILED", "FINISHED"), progress
        assert time.monotonic() < deadline, "no restart"
        time.sleep(0.1)
    restarted_on = set(client.placement().values())
    result = client.wait(timeout_s=180)
    assert_exactly_once(result.table(sink), n)
    assert lost, "the lost node held subtasks"
    assert victim.node_id not in restarted_on  # every subtask restarted elsewhere
    assert result.restarts == 1, result.failures  # the restart did not try the lost node
    assert "died" in result.failures[0], result.failures
    restore = result.restores[0]
    assert restore["checkpoint_id"] is not None and restore["checkpoint_id"] >= completed_before
    assert restore["lost_nodes"] == [victim.node_id]


class HoldAtEnd(Operator):
    """Passes batches on; at the end of its input waits until ``release`` exists, keeping the
    job (and every subtask) alive meanwhile."""

    def __init__(self, name: str, release: str) -> None:
        super().__init__(name)
        self.release = Path(release)

    def process_batch(self, batch, input_index=0):
        self.output.emit(batch)

    def finish(self):
        deadline = time.monotonic() + 120
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


PROMETHEUS_LINE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')


def prometheus(job_id: str) -> list[tuple[str, dict[str, str], float]]:
    """Every raystream series of ``job_id`` on the metrics endpoint of every live node."""
    series = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://127.0.0.1:{node['MetricsExportPort']}/metrics"
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            match = PROMETHEUS_LINE.match(line)
            if match and match.group(1).startswith("ray_raystream_"):
                labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2)))
                if labels.get("job_id") == job_id:
                    series.append((match.group(1), labels, float(match.group(3))))
    return series


def exported(series, metric: str, operator: str | None = None) -> float:
    return sum(value for name, labels, value in series
               if name == metric and (operator is None or labels["operator"] == operator))


@pytest.mark.slow
def test_metrics_reach_rays_prometheus_endpoints(cluster, tmp_path):
    n = 20_000
    release = tmp_path / "release"
    env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        interval_s=0.5, storage=str(tmp_path / "checkpoints")))
    keyed = env.from_sequence(n, readings, batch_size=500, num_splits=4, name="readings") \
        .key_by("key").map_batches(lambda b: b, name="count")
    keyed.rebalance().transform("hold", lambda name: HoldAtEnd(name, str(release)),
                                parallelism=1).discard(name="sink")
    client = env.execute_async("prometheus")
    deadline = time.monotonic() + 120
    while True:  # every record has passed "count"; "hold" keeps the job alive
        live = client.metrics()
        counted = sum(m["records_in"] for name, m in live.items() if name.startswith("count"))
        if counted == n:
            break
        assert time.monotonic() < deadline, live
        time.sleep(0.2)
    completed = len(client.progress()["completed_checkpoints"])

    def expectations(series) -> dict[str, bool]:
        return {
            "records into count": exported(series, "ray_raystream_records_in_total", "count") == n,
            "records out of readings":
                exported(series, "ray_raystream_records_out_total", "readings") == n,
            "bytes out == bytes in":
                exported(series, "ray_raystream_bytes_out_total", "readings") ==
                exported(series, "ray_raystream_bytes_in_total", "count") > 0,
            "checkpoints": exported(series, "ray_raystream_checkpoints_completed_total") >= completed,
        }

    while True:  # each subtask exports every 2 s; Ray reports every 0.5 s
        series = prometheus(client.job_id)
        met = expectations(series)
        if all(met.values()):
            break
        assert time.monotonic() < deadline, met
        time.sleep(0.5)
    subtasks = {labels["subtask"] for name, labels, _ in series
                if name == "ray_raystream_records_in_total" and labels["operator"] == "count"}
    assert subtasks == {"0", "1"}
    assert all(labels["job"] == "prometheus" for _, labels, _ in series)
    assert any(name == "ray_raystream_backpressure_ratio" for name, _, _ in series)
    release.touch()
    assert client.wait(timeout_s=120).status == "FINISHED"

