"""Checkpoint duration under heavy backpressure: aligned, unaligned, aligned with a timeout.

The job, at parallelism 2, the same for every mode::

    sequence -> map -> key_by("key") -> slow sink

* ``sequence``: ``from_sequence`` in 1,024-row batches (practically unbounded),
  2 splits; ``map`` (chained to it) adds a column with ``map_batches``.
* ``key_by``: the shuffle; 8 credits per channel (``StreamEnvironment(credits=8)``).
* ``slow sink``: sleeps 20 ms per 1,024-row batch it receives. The record
  writer merges a shuffle's parts into messages of up to 256 KiB, so a
  received batch holds several source batches; the sink sleeps 20 ms for
  every 1,024 rows of it (``20 ms * rows / 1024``), so its cost per row is
  what "20 ms per batch" means whatever the merging. The sink is the
  bottleneck by far: every queue before it stays full.
* checkpoints every 2 s (``CheckpointConfig(interval_s=2.0)``) to a local
  temp directory.

Each mode runs ``--duration`` seconds (default 60) in the same Ray session,
one after the other: ``aligned``, ``unaligned``
(``CheckpointConfig(unaligned=True)``) and ``aligned_timeout``
(``CheckpointConfig(aligned_timeout=0.2)``). Checkpoints triggered during the
first ``--warmup`` seconds (queues still filling) are left out. Per mode it
prints: checkpoints completed, median and p95 checkpoint duration (trigger to
completion, as the coordinator's history records it), median alignment time
(the longest wait of any subtask for its barriers), median channel-state
bytes per checkpoint, and throughput (rows the sinks received per second,
from their metrics). The last line::

    RESULT aligned_over_unaligned=<median aligned duration / median unaligned> unaligned_median_s=<s>

Run from the repo root::

    ./dev bench bench/unaligned.py                 # 3 x 60 s
    ./dev bench bench/unaligned.py --duration 15   # shorter
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
import ray

import raystream as rs
from raystream.core.ray_start import ensure_ray
from raystream.actors.operator import SinkOperator

PARALLELISM = 2
BATCH_ROWS = 1024
CREDITS = 8
SINK_SLEEP_S = 0.020  # per BATCH_ROWS rows received
INTERVAL_S = 2.0
ALIGNED_TIMEOUT_S = 0.2
ENDLESS = 10**12  # rows: the job is cancelled long before
MODES = {
    "aligned": {},
    "unaligned": {"unaligned": True},
    "aligned_timeout": {"aligned_timeout": ALIGNED_TIMEOUT_S},
}


def columns(index: np.ndarray) -> dict[str, np.ndarray]:
    return {"key": index % 4096, "value": index * 3, "i": index}


def add_column(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("twice", pa.compute.multiply(batch.column("value"), 2))


class SlowSink(SinkOperator):
    """Sleeps ``SINK_SLEEP_S`` per ``BATCH_ROWS`` rows; counts what it received."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.rows = 0
        self.batches = 0

    def process_batch(self, batch, input_index=0):
        time.sleep(SINK_SLEEP_S * batch.num_rows / BATCH_ROWS)
        self.rows += batch.num_rows
        self.batches += 1

    def metrics(self):
        return {"rows": self.rows, "batches": self.batches}


def sink_totals(client: rs.JobClient) -> tuple[int, int]:
    refs = [client.subtask_actor("sink", i).metrics.remote() for i in range(PARALLELISM)]
    metrics = ray.get(refs, timeout=60)
    return (sum(int(m.get("sink.rows", 0)) for m in metrics),
            sum(int(m.get("sink.batches", 0)) for m in metrics))


def run_mode(mode: str, duration_s: float, warmup_s: float, storage: str) -> dict:
    env = rs.StreamEnvironment(
        parallelism=PARALLELISM, credits=CREDITS,
        checkpoints=rs.CheckpointConfig(interval_s=INTERVAL_S, storage=storage, **MODES[mode]))
    (env.from_sequence(ENDLESS, columns, batch_size=BATCH_ROWS, num_splits=PARALLELISM)
        .map_batches(add_column, name="map")
        .key_by("key")
        .sink_to(SlowSink, name="sink"))
    client = env.execute_async(f"unaligned-bench-{mode}")
    while client.status() in ("CREATED", "DEPLOYING"):
        time.sleep(0.1)
    while sink_totals(client)[0] == 0:  # subtasks up, data flowing
        time.sleep(0.1)
    time.sleep(warmup_s)
    measured_from_ms = time.time() * 1000
    rows0, batches0 = sink_totals(client)
    started = time.perf_counter()
    time.sleep(duration_s)
    rows1, batches1 = sink_totals(client)
    elapsed = time.perf_counter() - started
    progress = client.progress()
    client.cancel()
    client.wait(timeout_s=120)
    if progress["attempt"] != 0:
        raise RuntimeError(f"{mode}: the job failed over: {progress['failures']}")
    completed = [c for c in progress["checkpoints"]
                 if c.status == "COMPLETED" and c.trigger_ts_ms >= measured_from_ms]
    if not completed:
        raise RuntimeError(f"{mode}: no checkpoint completed in {duration_s:g} s")
    durations = sorted(c.duration_s for c in completed)
    return {
        "mode": mode, "completed": len(completed),
        "aborted": sum(c.status == "ABORTED" for c in progress["checkpoints"]),
        "median_s": statistics.median(durations),
        "p95_s": float(np.percentile(durations, 95)),
        "alignment_s": statistics.median(c.alignment_s for c in completed),
        "channel_bytes": statistics.median(c.channel_state_bytes for c in completed),
        "unaligned": sum(c.unaligned for c in completed),
        "rows_per_s": (rows1 - rows0) / elapsed,
        "rows_per_call": (rows1 - rows0) / max(1, batches1 - batches0),
    }


HEADER = (f"{'mode':<16}{'completed':>10}{'aborted':>8}{'unaligned':>10}{'median s':>10}"
          f"{'p95 s':>9}{'align s':>9}{'chan MiB':>9}{'rows/s':>10}{'rows/call':>10}")


def row(r: dict) -> str:
    return (f"{r['mode']:<16}{r['completed']:>10}{r['aborted']:>8}{r['unaligned']:>10}"
            f"{r['median_s']:>10.3f}{r['p95_s']:>9.3f}{r['alignment_s']:>9.3f}"
            f"{r['channel_bytes'] / 2**20:>9.2f}{r['rows_per_s']:>10.0f}"
            f"{r['rows_per_call']:>10.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per mode")
    parser.add_argument("--warmup", type=float, default=4.0,
                        help="seconds before measuring (queues fill)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    args = parser.parse_args()
    ensure_ray(num_cpus=2, include_dashboard=False)
    results = []
    for mode in args.modes.split(","):
        storage = tempfile.mkdtemp(prefix=f"raystream-bench-{mode}-")
        try:
            results.append(run_mode(mode, args.duration, args.warmup, storage))
        finally:
            shutil.rmtree(storage, ignore_errors=True)
        print(row(results[-1]), flush=True)
    print(f"\nparallelism {PARALLELISM}, {BATCH_ROWS}-row batches, {CREDITS} credits/channel, "
          f"sink {SINK_SLEEP_S * 1000:g} ms per {BATCH_ROWS} rows, checkpoint every "
          f"{INTERVAL_S:g} s, {args.duration:g} s per mode")
    print(HEADER)
    for r in results:
        print(row(r))
    by_mode = {r["mode"]: r for r in results}
    if "aligned" in by_mode and "unaligned" in by_mode:
        ratio = by_mode["aligned"]["median_s"] / by_mode["unaligned"]["median_s"]
        print(f"RESULT aligned_over_unaligned={ratio:.1f} "
              f"unaligned_median_s={by_mode['unaligned']['median_s']:.3f}")


if __name__ == "__main__":
    main()
