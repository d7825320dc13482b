"""Job and subtask metrics, read from the job's result and client, against what the job
actually did: rows read and written (numpy), bytes sent and received counted at both ends of
every channel, checkpoint sizes against the files on disk.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import raystream as rs

BASE_TS = 1_700_000_000_000


def by_chain(metrics: dict[str, dict[str, float]], chain_prefix: str) -> list[dict[str, float]]:
    found = [m for name, m in metrics.items() if name.startswith(chain_prefix)]
    assert found, f"no subtask of {chain_prefix!r} in {sorted(metrics)}"
    return found


def total(subtasks: list[dict[str, float]], key: str) -> float:
    return sum(m[key] for m in subtasks)


def test_counters_match_what_the_job_processed(ray_session, tmp_path):
    n = 20_000
    env = rs.StreamEnvironment(parallelism=2, checkpoints=rs.CheckpointConfig(
        interval_s=0.5, storage=str(tmp_path)))
    rows = env.from_sequence(n, lambda i: {"id": i, "key": i % 97, "ts": BASE_TS + i},
                             batch_size=1000, name="numbers",
                             watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0))
    kept = rows.filter_batches(lambda b: pc.equal(pc.bit_wise_and(b["id"], 1), 0), name="even")
    sink = kept.key_by("key").map_batches(lambda b: b, name="keyed").collect(name="out")
    result = env.execute("metrics")

    table = result.table(sink)
    expected_rows = int(np.count_nonzero(np.arange(n) % 2 == 0))  # the oracle
    assert table.num_rows == expected_rows
    sources = by_chain(result.metrics, "numbers")
    keyed = by_chain(result.metrics, "keyed")
    assert total(sources, "numbers.records_read") == n
    assert total(sources, "records_out") == expected_rows
    assert total(keyed, "records_in") == expected_rows
    # bytes and batches counted by the senders and, independently, by the receivers
    assert total(sources, "bytes_out") == total(keyed, "bytes_in") > 0
    assert total(sources, "batches_out") == total(keyed, "batches_in") > 0
    assert total(keyed, "bytes_in") >= table.nbytes * 0.5  # the same rows, a few columns

    completed = [c for c in result.checkpoints if c.status == "COMPLETED"]
    assert completed
    final = completed[-1]
    files = [f for f in (tmp_path / _job_dir(tmp_path)).glob(f"chk-{final.checkpoint_id}/**/*")
             if f.is_file() and f.name != "_metadata"]
    on_disk = sum(f.stat().st_size for f in files)
    assert final.size == on_disk > 0
    assert final.duration_s > 0 and final.alignment_s is not None
    # every subtask acknowledged the final checkpoint and reports its own part of it; the
    # rest is the source's split enumerator (an operator coordinator in the job master)
    assert all(m["checkpoint_id"] == final.checkpoint_id for m in result.metrics.values())
    coordinators = sum(f.stat().st_size for f in files if f.name.startswith("coordinator-"))
    assert 0 < coordinators < on_disk
    assert sum(m["checkpoint_size"] for m in result.metrics.values()) == final.size - coordinators


def _job_dir(root: Path) -> str:
    (job,) = [p.name for p in root.iterdir() if p.is_dir()]
    return job


@pytest.mark.slow
def test_backpressure_is_the_time_a_fast_source_waits_for_a_slow_sink(ray_session):
    env = rs.StreamEnvironment(parallelism=1, credits=1)
    batch_rows = 40_000  # 320 KB a batch: more than an output buffer, so each goes at once
    slow = env.from_sequence(20 * batch_rows, batch_size=batch_rows, num_splits=1, name="fast") \
        .rebalance().map_batches(lambda b: (time.sleep(0.2), b)[1], name="slow")
    slow.discard(name="sink")
    result = env.execute("backpressure")
    fast, = by_chain(result.metrics, "fast")
    slowest, = by_chain(result.metrics, "slow")
    assert 0.5 < fast["backpressure"] <= 1.0, fast  # it waited for most of the run
    assert slowest["backpressure"] < 0.2, slowest  # nothing downstream of the sink waits


def test_live_metrics_of_a_running_job(ray_session):
    n = 40_000
    env = rs.StreamEnvironment(parallelism=1)
    env.from_sequence(n, lambda i: {"id": i, "ts": BASE_TS + i}, batch_size=200, num_splits=1,
                      name="events", watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0)) \
        .rebalance().map_batches(lambda b: (time.sleep(0.02), b)[1], name="paced") \
        .discard(name="sink")
    client = env.execute_async("live")
    deadline = time.monotonic() + 60
    while True:
        live = client.metrics()
        paced = [m for name, m in live.items() if name.startswith("paced")]
        if paced and paced[0]["records_in"] > 0 and "watermark_lag_ms" in paced[0]:
            break
        assert time.monotonic() < deadline, live
        time.sleep(0.1)
    read_at_most = n  # the watermark trails the newest timestamp read
    assert paced[0]["watermark_lag_ms"] >= time.time() * 1000 - (BASE_TS + read_at_most)
    assert 0 < paced[0]["records_in"] < n
    client.cancel()
    assert client.wait().status == "CANCELED"


def test_a_subtask_answers_for_its_metrics_before_it_is_wired():
    """A failover hosts a subtask before it connects it; a client asking for its metrics
    meanwhile (the recovery bench does) gets its figures, not an AttributeError."""
    from raystream.actors.subtask import Subtask
    from raystream.actors.subtask_spec import SubtaskSpec

    env = rs.StreamEnvironment(parallelism=1)
    env.from_sequence(10, lambda i: {"x": i}, name="numbers").discard(name="out")
    plan = env.plan()
    (vertex,) = plan.vertices
    metrics = Subtask(SubtaskSpec("job-id", "job", 1, vertex, 0, plan.max_parallelism,
                                  credits=1)).metrics()
    assert metrics["records_in"] == 0 and metrics["attempt"] == 1
