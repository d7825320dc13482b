"""``JobClient.progress()``'s figures of a real job: rows read and written, their rates,
the share of a bounded input read, the watermark and its lag, the phase in words —
through a SIGKILL of a subtask, after which no count goes back. The oracle is the
input itself (numpy over the same row numbers) and the job's exact output."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pyarrow as pa

import raystream as rs
from tests.support.inputs import BASE
from tests.support.jobs import subtask_pid, wait_for_checkpoint

N = 12_000
BOUND_MS = 50


def events(i: np.ndarray) -> dict:
    return {"i": i, "ts": BASE + i * 10}  # in order: the watermark trails the newest row


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.04)  # about 5 s of running: room for samples, a checkpoint and a kill
    return batch


def sampled(client: rs.JobClient, stop: threading.Event, into: list[dict]) -> None:
    while not stop.is_set():
        into.append(client.progress())
        time.sleep(0.1)


def test_progress_counts_rates_watermark_and_phase_never_go_back_through_a_kill(
        ray_session, tmp_path):
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.3, storage=str(tmp_path)),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    source = env.from_sequence(N, events, batch_size=100, num_splits=4, name="events",
                               watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=BOUND_MS))
    sink = source.map_batches(slow, name="slow").collect(name="out")
    client = env.execute_async("progress-figures")
    samples: list[dict] = []
    stop = threading.Event()
    poller = threading.Thread(target=sampled, args=(client, stop, samples))
    poller.start()
    try:
        wait_for_checkpoint(client)
        pid = subtask_pid(client, "slow", 1)
        assert pid is not None, "the job ended before the kill: slow it down"
        os.kill(pid, signal.SIGKILL)
        while client.status() not in ("FINISHED", "FAILED"):
            time.sleep(0.1)
    finally:
        stop.set()
        poller.join()
    final = client.progress()
    result = client.wait(timeout_s=60)
    ids = np.sort(result.table(sink)["i"].to_numpy())
    assert np.array_equal(ids, np.arange(N))  # exactly once
    assert result.restarts == 1, result.failures

    samples.append(final)
    for key in ("rows_read", "rows_written"):
        counts = [s[key] for s in samples]
        assert counts == sorted(counts), f"{key} went back: {counts}"
    assert final["rows_read"] == N and final["rows_total"] == N
    assert final["fraction_read"] == 1.0 and final["phase"] == "finished"
    assert final["rows_written"] == N  # the restored attempt counted on from its checkpoint
    running = [s for s in samples if s["status"] == "RUNNING" and 0 < s["rows_read"] < N]
    assert running, "no sample while the job read its input"
    assert any(s["read_per_s"] for s in running) and any(s["written_per_s"] for s in running)
    now_ms = time.time() * 1000
    for s in running:
        assert s["fraction_read"] == s["rows_read"] / N
        if s["watermark_ms"] is not None:  # within the input's event time, less the bound
            assert BASE - BOUND_MS <= s["watermark_ms"] <= BASE + (N - 1) * 10 - BOUND_MS
            # the lag is wall-clock time less the watermark (this test took seconds)
            assert abs(s["watermark_lag_s"] - (now_ms - s["watermark_ms"]) / 1000) < 120
    assert any(s["watermark_ms"] is not None for s in running)
    assert {s["phase"] for s in samples if s["status"] == "RESTARTING"} <= {
        "restarting after failure 1"}
    assert {s["phase"] for s in running} & {"running", "running; 1 of 4 subtasks have ended "
                                                       "their input"}
