"""The processing pause a checkpoint costs a keyed operator holding many timers (FLINK-9182).

A running job, parallelism 1, ``sequence -> key_by("key") -> timers -> discard``
(practically unbounded; cancelled once ``--checkpoints`` checkpoints completed with all
timers loaded),
holding N event-time timers (100,000 / 1,000,000 / 10,000,000) over 1,000,000
keys, with a checkpoint every ``--interval`` seconds:

* ``timers`` is a keyed operator whose per-batch work is vectorized: the first
  N rows each register one timer (key ``i mod keys``, a timestamp far in the
  future so none fires) with ``TimerService.register_event_time_timers``;
  later rows only count. The watermark never reaches the timers.
* The *pause*: from ``prepare_snapshot_pre_barrier`` (the first thing a
  subtask does with an aligned barrier) to the first record batch processed
  after the snapshot — it covers everything the snapshot needs for
  consistency: the pre-barrier hook, forwarding the barrier, the keyed-state
  snapshot and the timer snapshot (a flat copy of the heap arrays plus the
  key table's length). Only checkpoints taken once all N timers are loaded
  count; the median is reported.
* Beside it, in the same run: a bare ``numpy.copy`` of the same bytes (the
  three int64 heap arrays of N timers: the physical limit of a flat copy) and
  the naive way, pickling a list of N ``(timestamp, key, namespace)`` tuples.
* Also reported: how many records the operator processed while the
  asynchronous part (counting sort by key group, serialization, the write)
  ran on its background thread.

Prints a table and a last line::

    RESULT pause_over_memcpy=<ratio at 10M> naive_over_pause=<ratio at 10M>

Run from the repo root::

    ./dev bench bench/timer_snapshot.py                  # 100k, 1M, 10M timers
    ./dev bench bench/timer_snapshot.py --timers 100000 1000000 --checkpoints 3   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import ray

import raystream as rs
from raystream.engine.keys import KeySelector
from raystream.engine.operators.keyed import KeyedOperator

KEYS = 1_000_000
FAR_FUTURE = 4_000_000_000_000  # ms: year 2096, never reached by the watermark
BATCH = 65536


def rows(index: np.ndarray) -> dict:
    return {"key": index % KEYS, "i": index}


class TimerLoad(KeyedOperator):
    """Registers one timer for each of the first ``load`` rows, vectorized; logs pauses."""

    def __init__(self, name: str, load: int, log_dir: str) -> None:
        super().__init__(name, KeySelector.of("key"))
        self.load = load
        self.log_dir = log_dir
        self.records = 0
        self.pause_started: float | None = None
        self.log: list[dict] = []

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        now = time.perf_counter()
        if self.pause_started is not None:  # the first batch after a snapshot
            self.log[-1]["pause_s"] = now - self.pause_started
            self.pause_started = None
        index = batch.column(1).to_numpy()
        todo = index < self.load
        if todo.any():
            distinct = self.keys.distinct_keys(batch.filter(pa.array(todo)), self.ctx.max_parallelism)
            ids = self.timers.key_ids(distinct.keys, distinct.groups)[distinct.inverse]
            self.timers.register_event_time_timers(
                ids, np.zeros(len(ids), np.int64), FAR_FUTURE + index[todo])
        self.records += batch.num_rows

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        self.pause_started = time.perf_counter()
        self.log.append({"checkpoint": checkpoint_id,
                         "timers": self.timers.num_event_time_timers})

    def snapshot_state(self, checkpoint_id: int):
        snapshot = super().snapshot_state(checkpoint_id)
        write, entry = snapshot.keyed_state, self.log[-1]
        entry["sync_s"] = time.perf_counter() - self.pause_started

        def timed_write():
            entry["records_before_async"] = self.records
            started = time.perf_counter()
            out = write()
            entry["async_s"] = time.perf_counter() - started
            entry["records_during_async"] = self.records - entry["records_before_async"]
            return out
        snapshot.keyed_state = timed_write
        return snapshot

    def metrics(self) -> dict[str, float]:
        timers = getattr(self, "timers", None)  # None until the state is initialized
        return {"timers": timers.num_event_time_timers if timers is not None else 0}

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        # the whole log, atomically: the job is cancelled (and killed) at some point
        path = os.path.join(self.log_dir, "pauses.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.log, f)
        os.replace(path + ".tmp", path)


def measure(n_timers: int, checkpoints: int, interval_s: float) -> dict:
    with tempfile.TemporaryDirectory() as work:
        env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
            interval_s=interval_s, storage=os.path.join(work, "chk")))
        # practically unbounded rows: the job is cancelled once enough checkpoints
        # of the loaded operator completed
        src = env.from_sequence(10**12, rows, batch_size=BATCH, num_splits=1)
        load = n_timers
        src.key_by("key").transform("timers", lambda name: TimerLoad(name, load, work)).discard()
        client = env.execute_async(f"timer-snapshot-{n_timers}")
        actor = None
        loaded_at = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            time.sleep(0.2)
            completed = max(client.progress()["completed_checkpoints"] or [0])  # latest id
            if loaded_at is None:
                try:
                    actor = actor or client.subtask_actor("timers", 0)
                except ValueError:
                    continue  # still deploying
                if ray.get(actor.metrics.remote()).get("timers.timers", 0) >= n_timers:
                    loaded_at = completed
            elif completed >= loaded_at + checkpoints + 1:
                break
        client.cancel()
        try:
            client.wait(timeout_s=120)
        except rs.JobFailedError:
            pass  # cancelled
        with open(os.path.join(work, "pauses.json")) as f:
            log = json.load(f)
    full = [e for e in log if e["timers"] == n_timers and "pause_s" in e and "async_s" in e]
    if len(full) < 3:
        sys.exit(f"{n_timers} timers: only {len(full)} checkpoints with all timers loaded")
    pauses = [e["pause_s"] for e in full]
    arrays = [np.arange(n_timers, dtype=np.int64) for _ in range(3)]
    copies = []
    for _ in range(5):
        started = time.perf_counter()
        for a in arrays:
            np.copy(a)
        copies.append(time.perf_counter() - started)
    timers = list(zip(arrays[0].tolist(), arrays[1].tolist(), arrays[2].tolist()))
    started = time.perf_counter()
    pickle.dumps(timers, protocol=5)
    naive = time.perf_counter() - started
    del timers
    return {"timers": n_timers, "checkpoints": len(full), "pause_s": statistics.median(pauses),
            "pause_max_s": max(pauses), "sync_s": statistics.median(e["sync_s"] for e in full),
            "memcpy_s": statistics.median(copies), "naive_s": naive,
            "async_s": statistics.median(e["async_s"] for e in full),
            "records_during_async": statistics.median(e["records_during_async"] for e in full)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timers", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--checkpoints", type=int, default=5,
                        help="checkpoints measured per size, once all timers are loaded")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    rs.StreamEnvironment(parallelism=1)  # start Ray outside the timed parts
    results = [measure(n, args.checkpoints, args.interval) for n in args.timers]
    print(f"{'timers':>11} {'ckpts':>5} {'pause ms':>9} {'max ms':>8} {'memcpy ms':>10} "
          f"{'pause/memcpy':>12} {'naive ms':>9} {'naive/pause':>11} {'async ms':>9} "
          f"{'rows during async':>17}")
    for r in results:
        print(f"{r['timers']:>11,} {r['checkpoints']:>5} {r['pause_s'] * 1e3:>9.1f} "
              f"{r['pause_max_s'] * 1e3:>8.1f} {r['memcpy_s'] * 1e3:>10.1f} "
              f"{r['pause_s'] / r['memcpy_s']:>12.2f} {r['naive_s'] * 1e3:>9.1f} "
              f"{r['naive_s'] / r['pause_s']:>11.1f} {r['async_s'] * 1e3:>9.1f} "
              f"{r['records_during_async']:>17,.0f}")
    last = results[-1]
    print(f"RESULT pause_over_memcpy={last['pause_s'] / last['memcpy_s']:.2f} "
          f"naive_over_pause={last['naive_s'] / last['pause_s']:.1f}")


if __name__ == "__main__":
    main()
